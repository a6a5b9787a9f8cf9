package shim

import (
	"cmp"
	"fmt"
	"reflect"
	"strings"

	"github.com/zclconf/go-cty/cty"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
)

// An LB or health setting is declared once: a field of LBSpec or
// HealthSpec, with its hcl tag (its name in the -config file and the
// jobspec), plus its usage string below. The driver's HCL schema, the
// lock CLI's -lb-* and -health-* flags and their help, the merge of flags
// over the -config file and IsZero all derive from the two.

// LBSetting is one setting of the load_balancer or health_check block.
type LBSetting struct {
	// Block is "load_balancer" or "health_check"; Name the setting's name in
	// it (the field's hcl tag).
	Block, Name string
	// Usage is the lock CLI flag's usage; Default, if not nil, the default
	// its help shows.
	Usage   string
	Default any
	// Type is the setting's HCL type: "string", "list(string)" or "any".
	Type  string
	field int
}

// Flag is the lock CLI flag of the setting: -lb-<name> or -health-<name>,
// with dashes.
func (s LBSetting) Flag() string {
	p := "lb-"
	if s.Block == "health_check" {
		p = "health-"
	}
	return p + strings.ReplaceAll(s.Name, "_", "-")
}

// Field is the setting's field in spec, a pointer to an LBSpec or a
// HealthSpec (whichever holds s).
func (s LBSetting) Field(spec any) reflect.Value { return reflect.ValueOf(spec).Elem().Field(s.field) }

type lbUsage struct {
	usage string
	def   any
}

// lbUsages is each load_balancer setting's usage. options has no flag of
// its own (-lb-option and -lb-options-json, in the CLI, fill it in).
var lbUsages = map[string]lbUsage{
	"uri":              {"the LB API's request collection `URL`, e.g. http://lb:8080/baragon/v2/request", nil},
	"service_id":       {"the LB service's `ID` (serviceId)", nil},
	"base_path":        {"the service's base `path` (serviceBasePath)", nil},
	"groups":           {"the LB `groups` that serve the service, comma-separated", nil},
	"port":             {"Nomad port `label` whose host:port is registered as our upstream", nil},
	"owners":           {"the service's `owners`, comma-separated", nil},
	"options":          {"", nil},
	"template_name":    {"the service's `template` (templateName; default: the LB's)", nil},
	"domains":          {"the `domains` the service answers, comma-separated", nil},
	"additional_paths": {"routes besides the base path, comma-separated `paths`", nil},
	"group":            {"our upstream's `group`", lbhook.DefaultGroup},
	"rack_id":          {"our upstream's rack `ID` (rackId)", nil},
	"request_timeout":  {"bound of every LB API call, a `duration`", lbhook.DefaultRequestTimeout},
	"poll_interval":    {"`duration` between polls of a request in progress", lbhook.DefaultPollInterval},
	"add_deadline":     {"an ADD unfinished after this `duration` is cancelled", lbhook.DefaultAddDeadline},
	"remove_deadline":  {"`duration` a REMOVE may take, before the kill signal", lbhook.DefaultRemoveDeadline},
	"authkey_file":     {"auth key `file` (else $" + lbhook.DefaultAuthKeyEnv + "); never on the command line", nil},
	"ca_file":          {"CA bundle `file` for an https LB", nil},
	"recheck_interval": {"`duration` between checks, while holding, that our upstream is still registered (it is added again if not)", DefaultLBRecheck},
}

// healthUsages is each health_check setting's usage.
var healthUsages = map[string]lbUsage{
	"type":     {"health check `type`: http or tcp", nil},
	"path":     {"the http check's `path`", nil},
	"port":     {"Nomad port `label` to check (default: -lb-port's)", nil},
	"interval": {"`duration` between checks", DefaultHealthInterval},
	"timeout":  {"bound of one check, a `duration`", DefaultHealthTimeout},
	"grace":    {"`duration` to wait before the first check", nil},
}

// LBSettings and HealthSettings are the settings of the blocks, in the
// order of their fields.
var (
	LBSettings     = settingsOf(reflect.TypeFor[LBSpec](), "load_balancer", lbUsages)
	HealthSettings = settingsOf(reflect.TypeFor[HealthSpec](), "health_check", healthUsages)
)

func settingsOf(t reflect.Type, block string, usages map[string]lbUsage) []LBSetting {
	var out []LBSetting
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("hcl"), ",")
		if name == "" {
			continue
		}
		u, ok := usages[name]
		if !ok {
			panic(fmt.Sprintf("shim: %s.%s has no usage string", block, name))
		}
		s := LBSetting{Block: block, Name: name, Usage: u.usage, Default: u.def, field: i}
		switch f.Type {
		case reflect.TypeFor[string]():
			s.Type = "string"
		case reflect.TypeFor[[]string]():
			s.Type = "list(string)"
		case reflect.TypeFor[cty.Value]():
			// options: any JSON values (lists such as nginxExtraConfigs,
			// numbers, maps); "any" keeps each value's own type, which
			// reaches the plugin as a msgpack map ("map(any)" would make
			// every value one type). In the driver's config it arrives in
			// Options, by its codec tag.
			s.Type = "any"
		default:
			panic(fmt.Sprintf("shim: %s.%s: no HCL type for %s", block, name, f.Type))
		}
		out = append(out, s)
	}
	return out
}

// settingsZero reports whether every setting's field of spec (a pointer)
// is zero.
func settingsZero(spec any, settings []LBSetting) bool {
	for _, s := range settings {
		switch v := s.Field(spec); v.Kind() {
		case reflect.String, reflect.Slice:
			if v.Len() > 0 {
				return false
			}
		default:
			if !v.Interface().(cty.Value).IsNull() {
				return false
			}
		}
	}
	return true
}

// mergeSettings lays over's values over base's, setting by setting: a
// string set in over wins, a list set in over replaces base's.
func mergeSettings(base, over any, settings []LBSetting) {
	for _, s := range settings {
		b, o := s.Field(base), s.Field(over)
		switch b.Kind() {
		case reflect.String:
			b.SetString(cmp.Or(o.String(), b.String()))
		case reflect.Slice:
			if o.Len() > 0 {
				b.Set(o)
			}
		}
	}
}

// MergeLB lays over's settings over base's: the lock CLI's flags over its
// -config file. Options set in over replace base's.
func MergeLB(base, over LBSpec) LBSpec {
	mergeSettings(&base, &over, LBSettings)
	if over.Options != nil {
		base.Options, base.FileOptions = over.Options, cty.NilVal
	}
	return base
}

// MergeHealth is MergeLB for the health_check block.
func MergeHealth(base, over HealthSpec) HealthSpec {
	mergeSettings(&base, &over, HealthSettings)
	return base
}
