package shim

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// DefaultLBRecheck is how often a registered holder checks that the LB still
// has its upstream, and re-adds it if it vanished out of band. MinLBRecheck
// is the least recheck_interval: the check is a GET of the service's state.
const (
	DefaultLBRecheck = 10 * time.Second
	MinLBRecheck     = time.Second
)

// LoadBalancer is the optional LB registration of the one live instance.
type LoadBalancer struct {
	lbhook.Config
	// Upstream is our host:port, resolved from the port label.
	Upstream string
	// Recheck is the interval of the "is our upstream still there" check.
	Recheck time.Duration
	// Health gates the ADD; nil adds as soon as the workload started.
	Health *HealthCheck
}

// Validate checks the LB block and the resolved upstream.
func (lb *LoadBalancer) Validate() error {
	errs := []error{lb.Config.Validate()}
	if _, _, err := net.SplitHostPort(lb.Upstream); err != nil {
		errs = append(errs, fmt.Errorf("load_balancer upstream %q is not host:port (from port label %q): %w", lb.Upstream, lb.PortLabel, err))
	}
	if lb.Recheck < 0 {
		errs = append(errs, fmt.Errorf("load_balancer.recheck_interval %s must not be negative", lb.Recheck))
	}
	errs = append(errs, checkMin("load_balancer.recheck_interval", lb.Recheck, MinLBRecheck))
	if lb.Health != nil {
		errs = append(errs, lb.Health.Validate())
	}
	return errors.Join(errs...)
}

// checkMin refuses a positive d below min (zero takes the default; a
// negative d has its own error).
func checkMin(field string, d, min time.Duration) error {
	if d > 0 && d < min {
		return fmt.Errorf("%s = %s is below its minimum of %s", field, d, min)
	}
	return nil
}

// PortAddress resolves a Nomad port label to host:port from the task
// environment: NOMAD_HOST_ADDR_<label>, else NOMAD_ADDR_<label>.
func PortAddress(label string, getenv func(string) string) (string, error) {
	key := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, label)
	for _, v := range []string{"NOMAD_HOST_ADDR_" + key, "NOMAD_ADDR_" + key} {
		if addr := getenv(v); addr != "" {
			return addr, nil
		}
	}
	return "", fmt.Errorf("port label %q: the task has no NOMAD_HOST_ADDR_%s; add `port %q {}` to the group's network block", label, key, label)
}

// LBSpec is the load_balancer block as users write it: in the -config file,
// in the driver's task config, and (field by field) as -lb-* flags.
type LBSpec struct {
	URI       string   `hcl:"uri,optional" codec:"uri"`
	ServiceID string   `hcl:"service_id,optional" codec:"service_id"`
	BasePath  string   `hcl:"base_path,optional" codec:"base_path"`
	Groups    []string `hcl:"groups,optional" codec:"groups"`
	PortLabel string   `hcl:"port,optional" codec:"port"`
	Owners    []string `hcl:"owners,optional" codec:"owners"`
	// Options map names to any JSON values (Baragon's templates read lists
	// such as nginxExtraConfigs, and numbers). It is `any` because Nomad's
	// jobspec parser hands a map attribute of a task config over as a list
	// of one map; specOptions unwraps it. The -config file's value arrives
	// in FileOptions instead.
	Options any `codec:"options"`
	// FileOptions is `options` as the -config file's HCL decoder gives it.
	FileOptions     cty.Value `hcl:"options,optional" codec:"-" json:"-"`
	TemplateName    string    `hcl:"template_name,optional" codec:"template_name"`
	Domains         []string  `hcl:"domains,optional" codec:"domains"`
	AdditionalPaths []string  `hcl:"additional_paths,optional" codec:"additional_paths"`
	Group           string    `hcl:"group,optional" codec:"group"`
	RackID          string    `hcl:"rack_id,optional" codec:"rack_id"`
	RequestTimeout  string    `hcl:"request_timeout,optional" codec:"request_timeout"`
	PollInterval    string    `hcl:"poll_interval,optional" codec:"poll_interval"`
	AddDeadline     string    `hcl:"add_deadline,optional" codec:"add_deadline"`
	RemoveDeadline  string    `hcl:"remove_deadline,optional" codec:"remove_deadline"`
	AuthKeyFile     string    `hcl:"authkey_file,optional" codec:"authkey_file"`
	CAFile          string    `hcl:"ca_file,optional" codec:"ca_file"`
	RecheckInterval string    `hcl:"recheck_interval,optional" codec:"recheck_interval"`

	// AuthKey and CAPEM replace AuthKeyFile and CAFile with contents the
	// caller read itself (see lbhook.Config). No jobspec or file sets them.
	AuthKey string `codec:"-"`
	CAPEM   []byte `codec:"-"`
}

// MarshalJSON writes the block with its options as plain JSON values,
// whichever decoder filled them in (the driver hands the block to its
// supervisor as JSON).
func (s LBSpec) MarshalJSON() ([]byte, error) {
	type plain LBSpec
	opts, err := specOptions(s)
	if err != nil {
		return nil, fmt.Errorf("load_balancer.options: %w", err)
	}
	s.Options, s.FileOptions = opts, cty.NilVal
	return json.Marshal(plain(s))
}

// HealthSpec is the health_check block.
type HealthSpec struct {
	Type     string `hcl:"type,optional" codec:"type"`
	Path     string `hcl:"path,optional" codec:"path"`
	Port     string `hcl:"port,optional" codec:"port"` // default: the load_balancer port
	Interval string `hcl:"interval,optional" codec:"interval"`
	Timeout  string `hcl:"timeout,optional" codec:"timeout"`
	Grace    string `hcl:"grace,optional" codec:"grace"`
}

// IsZero reports whether no field of the block was set.
func (s LBSpec) IsZero() bool { return s.Options == nil && settingsZero(&s, LBSettings) }

// IsZero reports whether no field of the block was set.
func (h HealthSpec) IsZero() bool { return h == HealthSpec{} }

// BuildLoadBalancer turns the blocks into a validated LoadBalancer, resolving
// port labels from the task environment. prefix names the blocks in errors
// ("" for the -config file, "config." in a jobspec). A zero LB block with no
// health check means no load balancer.
func BuildLoadBalancer(spec LBSpec, health HealthSpec, getenv func(string) string, prefix string) (*LoadBalancer, error) {
	if spec.IsZero() {
		if !health.IsZero() {
			return nil, fmt.Errorf("%shealth_check gates the load balancer ADD: it needs a %sload_balancer block", prefix, prefix)
		}
		return nil, nil
	}
	var errs []error
	lb := &LoadBalancer{}
	errs = append(errs, copySettings(&lb.Config, &spec, prefix+"load_balancer."))
	var recheck struct{ RecheckInterval time.Duration }
	errs = append(errs, copySettings(&recheck, &spec, prefix+"load_balancer."))
	if lb.Recheck = recheck.RecheckInterval; lb.Recheck == 0 {
		lb.Recheck = DefaultLBRecheck
	}
	opts, err := specOptions(spec)
	if err != nil {
		errs = append(errs, fmt.Errorf("%sload_balancer.options: %w", prefix, err))
	}
	lb.Options = opts
	if spec.PortLabel != "" {
		addr, err := PortAddress(spec.PortLabel, getenv)
		if err != nil {
			errs = append(errs, fmt.Errorf("%sload_balancer.port: %w", prefix, err))
		}
		lb.Upstream = addr
	}
	if !health.IsZero() {
		hc := &HealthCheck{}
		errs = append(errs, copySettings(hc, &health, prefix+"health_check."))
		port := cmp.Or(health.Port, spec.PortLabel)
		if port != "" {
			addr, err := PortAddress(port, getenv)
			if err != nil {
				errs = append(errs, fmt.Errorf("%shealth_check.port: %w", prefix, err))
			}
			hc.Address = addr
		}
		lb.Health = hc
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := lb.Validate(); err != nil {
		return nil, fmt.Errorf("%sload_balancer: %w", prefix, err)
	}
	return lb, nil
}

// copySettings sets each field of *dst from the field of the same name of
// *src, a block as users write it (LBSpec, HealthSpec): a string, a list
// or bytes as they are, a duration parsed from its string, whose error
// names the setting (label, then its hcl name). Fields of either that the
// other lacks, or holds as another type, are the caller's.
func copySettings(dst, src any, label string) error {
	d, sv := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	var errs []error
	for i := range sv.NumField() {
		f := sv.Type().Field(i)
		to := d.FieldByName(f.Name)
		switch from := sv.Field(i); {
		case !to.IsValid():
		case to.Type() == reflect.TypeFor[time.Duration]() && from.Kind() == reflect.String:
			name, _, _ := strings.Cut(f.Tag.Get("hcl"), ",")
			var v time.Duration
			errs = append(errs, ParseDuration(label+name, from.String(), "2s", &v))
			to.SetInt(int64(v))
		case to.Type() == from.Type():
			to.Set(from)
		}
	}
	return errors.Join(errs...)
}

// specOptions returns the block's options as JSON-ready values: from the
// -config file's HCL value, or from the driver's task config (decoded from
// msgpack, where nested maps may come with interface{} keys) or flags.
func specOptions(spec LBSpec) (map[string]any, error) {
	if !spec.FileOptions.IsNull() {
		v := spec.FileOptions
		if !v.Type().IsObjectType() && !v.Type().IsMapType() {
			return nil, fmt.Errorf("want a map such as { nginxExtraConfigs = [\"…\"] }, got %s", v.Type().FriendlyName())
		}
		b, err := ctyjson.Marshal(v, v.Type())
		if err != nil {
			return nil, err
		}
		var m map[string]any
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		if err := d.Decode(&m); err != nil {
			return nil, err
		}
		return m, nil
	}
	v := spec.Options
	if l, ok := v.([]any); ok && len(l) == 1 {
		v = l[0] // a map attribute as Nomad's jobspec parser gives it
	} else if l, ok := v.([]map[string]any); ok && len(l) == 1 {
		v = l[0]
	}
	jv, err := jsonValue(v)
	if err != nil {
		return nil, err
	}
	switch m := jv.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return m, nil
	}
	return nil, fmt.Errorf("want a map such as { nginxExtraConfigs = [\"…\"] }, got %T", spec.Options)
}

// jsonValue turns a decoded value into one encoding/json can write.
func jsonValue(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			j, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[k] = j
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("map key %v is not a string", k)
			}
			j, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[ks] = j
		}
		return out, nil
	case []any:
		return jsonList(x)
	case []map[string]any:
		return jsonList(x)
	case []byte:
		return string(x), nil
	}
	if _, err := json.Marshal(v); err != nil {
		return nil, err
	}
	return v, nil
}

// jsonList converts each element of a decoded list with jsonValue.
func jsonList[T any](x []T) ([]any, error) {
	out := make([]any, len(x))
	for i, e := range x {
		j, err := jsonValue(e)
		if err != nil {
			return nil, err
		}
		out[i] = j
	}
	return out, nil
}
