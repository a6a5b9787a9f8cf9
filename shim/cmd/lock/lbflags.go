package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// lbFlags registers the -lb-* and -health-* flags onto spec and health:
// -lb-<field> and -health-<field> for each setting of the blocks
// (shim.LBSettings, shim.HealthSettings), with dashes, and -lb-option and
// -lb-options-json for options.
func lbFlags(fs *flag.FlagSet, spec *shim.LBSpec, health *shim.HealthSpec) {
	for _, set := range []struct {
		spec     any
		settings []shim.LBSetting
	}{{spec, shim.LBSettings}, {health, shim.HealthSettings}} {
		for _, s := range set.settings {
			switch s.Type {
			case "string":
				fs.StringVar(s.Field(set.spec).Addr().Interface().(*string), s.Flag(), "", s.Usage)
			case "list(string)":
				fs.Func(s.Flag(), s.Usage, listFlag(s.Field(set.spec).Addr().Interface().(*[]string)))
			default:
				continue // options: the two flags below
			}
			if s.Default != nil {
				// An empty value means this default, which the help shows.
				fs.Lookup(s.Flag()).DefValue = fmt.Sprint(s.Default)
				if d, ok := s.Default.(string); ok {
					fs.Lookup(s.Flag()).DefValue = strconv.Quote(d)
				}
			}
		}
	}
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

// mergeLB lays flag values over the file's block, setting by setting.
func mergeLB(file, flags shim.LBSpec) shim.LBSpec { return shim.MergeLB(file, flags) }

func mergeHealth(file, flags shim.HealthSpec) shim.HealthSpec { return shim.MergeHealth(file, flags) }

// flagOptions is the map the -lb-option flags fill in.
func flagOptions(spec *shim.LBSpec) map[string]any {
	m, ok := spec.Options.(map[string]any)
	if !ok {
		m = map[string]any{}
		spec.Options = m
	}
	return m
}
