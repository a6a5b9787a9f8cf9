package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"strings"

	"github.com/zclconf/go-cty/cty"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// lbFlags registers the -lb-* and -health-* flags onto spec and health.
func lbFlags(fs *flag.FlagSet, spec *shim.LBSpec, health *shim.HealthSpec) {
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
