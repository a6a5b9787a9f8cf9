package shim

import (
	"errors"
	"time"
)

// DriverBlocks are the blocks of the driver's task config whose settings
// are declared here: config.lock (the LockSettings the driver takes,
// InDriver), load_balancer and health_check. The driver embeds it in its
// task config, derives their HCL schema from it (Schema), and turns them
// into its run (Spec).
type DriverBlocks struct {
	Lock         LockValues `codec:"lock"`
	LoadBalancer LBSpec     `codec:"load_balancer"`
	HealthCheck  HealthSpec `codec:"health_check"`
}

// Schema is the blocks' HCL schema: each block's attributes, by name, with
// their HCL types (a lock setting is a string: "10s", "SIGTERM").
func (DriverBlocks) Schema() map[string]map[string]string {
	lock := map[string]string{}
	for _, s := range LockSettings.In(InDriver) {
		lock[s.Name] = "string"
	}
	types := func(settings []LBSetting) map[string]string {
		out := map[string]string{}
		for _, s := range settings {
			out[s.Name] = s.Type
		}
		return out
	}
	return map[string]map[string]string{"lock": lock, "load_balancer": types(LBSettings), "health_check": types(HealthSettings)}
}

// Spec is the run the blocks ask for, before the driver adds what Nomad's
// task config decides (the command, the lock's default path, the gate):
// DefaultConfig with the plugin's default ttl and delay, the lock block
// over them, the load balancer with its port labels resolved by getenv.
// Every error names the jobspec field to fix.
func (b DriverBlocks) Spec(ttl, delay time.Duration, getenv func(string) string) (Spec, error) {
	run := Spec{Version: SpecVersion, Config: DefaultConfig()}
	run.TTL, run.LockDelay = ttl, delay
	lockErr := LockSettings.In(InDriver).Apply(&run.Config, b.Lock,
		func(s LockSetting) string { return "config.lock." + s.Name })
	lb, lbErr := BuildLoadBalancer(b.LoadBalancer, b.HealthCheck, getenv, "config.")
	run.LB = lb
	return run, errors.Join(lockErr, lbErr)
}

// LockDefault is the duration of the plugin config's default for the lock
// block's setting name (default_ttl, default_delay): value, or the
// setting's own default when value is "", parsed and checked against the
// setting's minimum. label names it in errors.
func (DriverBlocks) LockDefault(name, value, label string) (time.Duration, error) {
	for _, s := range LockSettings.In(InDriver) {
		if s.Name != name {
			continue
		}
		var d time.Duration
		if err := ParseDuration(label, s.Default, "10s", &d); err != nil {
			return 0, err
		}
		if err := ParseDuration(label, value, "10s", &d); err != nil {
			return 0, err
		}
		return d, s.checkMin(label, d)
	}
	panic("no lock setting " + name + " in the driver's")
}
