package shim

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
)

// LBSpec is the load_balancer block as users write it: in the -config file,
// in the driver's task config, and (field by field) as -lb-* flags.
type LBSpec struct {
	URI       string   `hcl:"uri,optional" codec:"uri"`
	ServiceID string   `hcl:"service_id,optional" codec:"service_id"`
	BasePath  string   `hcl:"base_path,optional" codec:"base_path"`
	Groups    []string `hcl:"groups,optional" codec:"groups"`
	Port      string   `hcl:"port,optional" codec:"port"`
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
func (s LBSpec) IsZero() bool {
	return s.URI == "" && s.ServiceID == "" && s.BasePath == "" && len(s.Groups) == 0 && s.Port == "" &&
		len(s.Owners) == 0 && s.Options == nil && s.FileOptions.IsNull() && s.TemplateName == "" &&
		len(s.Domains) == 0 && len(s.AdditionalPaths) == 0 && s.Group == "" && s.RackID == "" &&
		s.RequestTimeout == "" && s.PollInterval == "" && s.AddDeadline == "" && s.RemoveDeadline == "" &&
		s.AuthKeyFile == "" && s.CAFile == "" && s.RecheckInterval == ""
}

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
	dur := func(block, field, v string) time.Duration {
		var d time.Duration
		if err := ParseDuration(prefix+block+"."+field, v, "2s", &d); err != nil {
			errs = append(errs, err)
		}
		return d
	}
	lb := &LoadBalancer{
		Config: lbhook.Config{
			URI: spec.URI, ServiceID: spec.ServiceID, BasePath: spec.BasePath,
			Groups: spec.Groups, PortLabel: spec.Port, Owners: spec.Owners,
			TemplateName: spec.TemplateName, Domains: spec.Domains, AdditionalPaths: spec.AdditionalPaths,
			Group: spec.Group, RackID: spec.RackID,
			RequestTimeout: dur("load_balancer", "request_timeout", spec.RequestTimeout),
			PollInterval:   dur("load_balancer", "poll_interval", spec.PollInterval),
			AddDeadline:    dur("load_balancer", "add_deadline", spec.AddDeadline),
			RemoveDeadline: dur("load_balancer", "remove_deadline", spec.RemoveDeadline),
			AuthKeyFile:    spec.AuthKeyFile,
			CAFile:         spec.CAFile,
			AuthKey:        spec.AuthKey,
			CAPEM:          spec.CAPEM,
		},
		Recheck: dur("load_balancer", "recheck_interval", spec.RecheckInterval),
	}
	if lb.Recheck == 0 {
		lb.Recheck = DefaultLBRecheck
	}
	opts, err := specOptions(spec)
	if err != nil {
		errs = append(errs, fmt.Errorf("%sload_balancer.options: %w", prefix, err))
	}
	lb.Options = opts
	if spec.Port != "" {
		addr, err := PortAddress(spec.Port, getenv)
		if err != nil {
			errs = append(errs, fmt.Errorf("%sload_balancer.port: %w", prefix, err))
		}
		lb.Upstream = addr
	}
	if !health.IsZero() {
		hc := &HealthCheck{
			Type: health.Type, Path: health.Path,
			Interval: dur("health_check", "interval", health.Interval),
			Timeout:  dur("health_check", "timeout", health.Timeout),
			Grace:    dur("health_check", "grace", health.Grace),
		}
		port := health.Port
		if port == "" {
			port = spec.Port
		}
		if port != "" {
			addr, err := PortAddress(port, getenv)
			if err != nil {
				errs = append(errs, fmt.Errorf("%shealth_check.port: %w", prefix, err))
			}
			hc.Address = addr
		}
		lb.Health = hc
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := lb.Validate(); err != nil {
		return nil, fmt.Errorf("%sload_balancer: %w", prefix, err)
	}
	return lb, nil
}

// lbFlags registers the -lb-* and -health-* flags onto spec and health.
func lbFlags(fs *flag.FlagSet, spec *LBSpec, health *HealthSpec) {
	fs.StringVar(&spec.URI, "lb-uri", "", "")
	fs.StringVar(&spec.ServiceID, "lb-service-id", "", "")
	fs.StringVar(&spec.BasePath, "lb-base-path", "", "")
	fs.Func("lb-groups", "", listFlag(&spec.Groups))
	fs.StringVar(&spec.Port, "lb-port", "", "")
	fs.Func("lb-owners", "", listFlag(&spec.Owners))
	fs.Func("lb-option", "", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return fmt.Errorf("-lb-option %q: use key=value (a string; -lb-options-json for lists and numbers)", v)
		}
		flagOptions(spec)[k] = val
		return nil
	})
	fs.Func("lb-options-json", "", func(v string) error {
		var m map[string]any
		d := json.NewDecoder(strings.NewReader(v))
		d.UseNumber()
		if err := d.Decode(&m); err != nil || m == nil {
			return fmt.Errorf("-lb-options-json: want a JSON object, e.g. '{\"nginxExtraConfigs\":[\"…\"]}': %v", err)
		}
		maps.Copy(flagOptions(spec), m)
		return nil
	})
	fs.StringVar(&spec.TemplateName, "lb-template-name", "", "")
	fs.Func("lb-domains", "", listFlag(&spec.Domains))
	fs.Func("lb-additional-paths", "", listFlag(&spec.AdditionalPaths))
	fs.StringVar(&spec.Group, "lb-group", "", "")
	fs.StringVar(&spec.RackID, "lb-rack-id", "", "")
	fs.StringVar(&spec.RequestTimeout, "lb-request-timeout", "", "")
	fs.StringVar(&spec.PollInterval, "lb-poll-interval", "", "")
	fs.StringVar(&spec.AddDeadline, "lb-add-deadline", "", "")
	fs.StringVar(&spec.RemoveDeadline, "lb-remove-deadline", "", "")
	fs.StringVar(&spec.AuthKeyFile, "lb-authkey-file", "", "")
	fs.StringVar(&spec.CAFile, "lb-ca-file", "", "")
	fs.StringVar(&spec.RecheckInterval, "lb-recheck-interval", "", "")
	fs.StringVar(&health.Type, "health-type", "", "")
	fs.StringVar(&health.Path, "health-path", "", "")
	fs.StringVar(&health.Port, "health-port", "", "")
	fs.StringVar(&health.Interval, "health-interval", "", "")
	fs.StringVar(&health.Timeout, "health-timeout", "", "")
	fs.StringVar(&health.Grace, "health-grace", "", "")
}

func listFlag(dst *[]string) func(string) error {
	return func(v string) error {
		for _, item := range strings.Split(v, ",") {
			if item = strings.TrimSpace(item); item != "" {
				*dst = append(*dst, item)
			}
		}
		return nil
	}
}

// mergeLB lays flag values over the file's block, field by field.
func mergeLB(file, flags LBSpec) LBSpec {
	out := LBSpec{
		URI: cmp.Or(flags.URI, file.URI), ServiceID: cmp.Or(flags.ServiceID, file.ServiceID),
		BasePath: cmp.Or(flags.BasePath, file.BasePath), Port: cmp.Or(flags.Port, file.Port),
		RequestTimeout: cmp.Or(flags.RequestTimeout, file.RequestTimeout), PollInterval: cmp.Or(flags.PollInterval, file.PollInterval),
		AddDeadline: cmp.Or(flags.AddDeadline, file.AddDeadline), RemoveDeadline: cmp.Or(flags.RemoveDeadline, file.RemoveDeadline),
		AuthKeyFile: cmp.Or(flags.AuthKeyFile, file.AuthKeyFile), CAFile: cmp.Or(flags.CAFile, file.CAFile),
		RecheckInterval: cmp.Or(flags.RecheckInterval, file.RecheckInterval),
		TemplateName:    cmp.Or(flags.TemplateName, file.TemplateName),
		Group:           cmp.Or(flags.Group, file.Group), RackID: cmp.Or(flags.RackID, file.RackID),
		Groups: file.Groups, Owners: file.Owners, Options: file.Options, FileOptions: file.FileOptions,
		Domains: file.Domains, AdditionalPaths: file.AdditionalPaths,
	}
	if len(flags.Domains) > 0 {
		out.Domains = flags.Domains
	}
	if len(flags.AdditionalPaths) > 0 {
		out.AdditionalPaths = flags.AdditionalPaths
	}
	if len(flags.Groups) > 0 {
		out.Groups = flags.Groups
	}
	if len(flags.Owners) > 0 {
		out.Owners = flags.Owners
	}
	if flags.Options != nil {
		out.Options, out.FileOptions = flags.Options, cty.NilVal
	}
	return out
}

func mergeHealth(file, flags HealthSpec) HealthSpec {
	return HealthSpec{
		Type: cmp.Or(flags.Type, file.Type), Path: cmp.Or(flags.Path, file.Path), Port: cmp.Or(flags.Port, file.Port),
		Interval: cmp.Or(flags.Interval, file.Interval), Timeout: cmp.Or(flags.Timeout, file.Timeout), Grace: cmp.Or(flags.Grace, file.Grace),
	}
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

// flagOptions is the map the -lb-option flags fill in.
func flagOptions(spec *LBSpec) map[string]any {
	m, ok := spec.Options.(map[string]any)
	if !ok {
		m = map[string]any{}
		spec.Options = m
	}
	return m
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
