package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/zclconf/go-cty/cty"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// lbFlags registers the -lb-* and -health-* flags onto spec and health:
// -lb-<field> and -health-<field> for each field of the blocks, with dashes.
func lbFlags(fs *flag.FlagSet, spec *shim.LBSpec, health *shim.HealthSpec) {
	fs.StringVar(&spec.URI, "lb-uri", "", "the LB API's request collection `URL`, e.g. http://lb:8080/baragon/v2/request")
	fs.StringVar(&spec.ServiceID, "lb-service-id", "", "the LB service's `ID` (serviceId)")
	fs.StringVar(&spec.BasePath, "lb-base-path", "", "the service's base `path` (serviceBasePath)")
	fs.Func("lb-groups", "the LB `groups` that serve the service, comma-separated", listFlag(&spec.Groups))
	fs.StringVar(&spec.Port, "lb-port", "", "Nomad port `label` whose host:port is registered as our upstream")
	fs.Func("lb-owners", "the service's `owners`, comma-separated", listFlag(&spec.Owners))
	fs.Func("lb-option", "service option `key=value`, a string (repeatable)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return fmt.Errorf("-lb-option %q: use key=value (a string; -lb-options-json for lists and numbers)", v)
		}
		flagOptions(spec)[k] = val
		return nil
	})
	fs.Func("lb-options-json", "service options as a `JSON` object: lists, numbers, maps", func(v string) error {
		var m map[string]any
		d := json.NewDecoder(strings.NewReader(v))
		d.UseNumber()
		if err := d.Decode(&m); err != nil || m == nil {
			return fmt.Errorf("-lb-options-json: want a JSON object, e.g. '{\"nginxExtraConfigs\":[\"…\"]}': %v", err)
		}
		maps.Copy(flagOptions(spec), m)
		return nil
	})
	fs.StringVar(&spec.TemplateName, "lb-template-name", "", "the service's `template` (templateName; default: the LB's)")
	fs.Func("lb-domains", "the `domains` the service answers, comma-separated", listFlag(&spec.Domains))
	fs.Func("lb-additional-paths", "routes besides the base path, comma-separated `paths`", listFlag(&spec.AdditionalPaths))
	fs.StringVar(&spec.Group, "lb-group", "", "our upstream's `group`")
	fs.StringVar(&spec.RackID, "lb-rack-id", "", "our upstream's rack `ID` (rackId)")
	fs.StringVar(&spec.RequestTimeout, "lb-request-timeout", "", "bound of every LB API call, a `duration`")
	fs.StringVar(&spec.PollInterval, "lb-poll-interval", "", "`duration` between polls of a request in progress")
	fs.StringVar(&spec.AddDeadline, "lb-add-deadline", "", "an ADD unfinished after this `duration` is cancelled")
	fs.StringVar(&spec.RemoveDeadline, "lb-remove-deadline", "", "`duration` a REMOVE may take, before the kill signal")
	fs.StringVar(&spec.RecheckInterval, "lb-recheck-interval", "", "`duration` between checks, while holding, "+
		"that our upstream is still registered (it is added again if not)")
	fs.StringVar(&spec.AuthKeyFile, "lb-authkey-file", "", "auth key `file` (else $"+lbhook.DefaultAuthKeyEnv+"); never on the command line")
	fs.StringVar(&spec.CAFile, "lb-ca-file", "", "CA bundle `file` for an https LB")
	fs.StringVar(&health.Type, "health-type", "", "health check `type`: http or tcp")
	fs.StringVar(&health.Path, "health-path", "", "the http check's `path`")
	fs.StringVar(&health.Port, "health-port", "", "Nomad port `label` to check (default: -lb-port's)")
	fs.StringVar(&health.Interval, "health-interval", "", "`duration` between checks")
	fs.StringVar(&health.Timeout, "health-timeout", "", "bound of one check, a `duration`")
	fs.StringVar(&health.Grace, "health-grace", "", "`duration` to wait before the first check")
	for name, def := range map[string]any{
		"lb-group": lbhook.DefaultGroup, "lb-request-timeout": lbhook.DefaultRequestTimeout,
		"lb-poll-interval": lbhook.DefaultPollInterval, "lb-add-deadline": lbhook.DefaultAddDeadline,
		"lb-remove-deadline": lbhook.DefaultRemoveDeadline, "lb-recheck-interval": shim.DefaultLBRecheck,
		"health-interval": shim.DefaultHealthInterval, "health-timeout": shim.DefaultHealthTimeout,
	} {
		// An empty value means this default, which the help shows.
		fs.Lookup(name).DefValue = fmt.Sprint(def)
		if s, ok := def.(string); ok {
			fs.Lookup(name).DefValue = strconv.Quote(s)
		}
	}
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
func mergeLB(file, flags shim.LBSpec) shim.LBSpec {
	out := shim.LBSpec{
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

func mergeHealth(file, flags shim.HealthSpec) shim.HealthSpec {
	return shim.HealthSpec{
		Type: cmp.Or(flags.Type, file.Type), Path: cmp.Or(flags.Path, file.Path), Port: cmp.Or(flags.Port, file.Port),
		Interval: cmp.Or(flags.Interval, file.Interval), Timeout: cmp.Or(flags.Timeout, file.Timeout), Grace: cmp.Or(flags.Grace, file.Grace),
	}
}

// flagOptions is the map the -lb-option flags fill in.
func flagOptions(spec *shim.LBSpec) map[string]any {
	m, ok := spec.Options.(map[string]any)
	if !ok {
		m = map[string]any{}
		spec.Options = m
	}
	return m
}
