package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// fileConfig is the -config HCL file. Its shape matches the driver's task
// config: command and args at the top, lock settings in a lock block. The
// lock settings (shim.LockSettings: InFileLock in the lock block, InFileTop
// at the top) are left in the remain bodies, for decodeSettings.
type fileConfig struct {
	Command  string           `hcl:"command,optional"`
	Args     []string         `hcl:"args,optional"`
	Shell    *bool            `hcl:"shell,optional"`
	Verbose  *bool            `hcl:"verbose,optional"`
	Lock     *fileLock        `hcl:"lock,block"`
	LB       *shim.LBSpec     `hcl:"load_balancer,block"`
	Health   *shim.HealthSpec `hcl:"health_check,block"`
	Settings hcl.Body         `hcl:",remain"`
}

type fileLock struct {
	Settings hcl.Body `hcl:",remain"`
}

// fileBlocks are the -config file's load_balancer and health_check blocks,
// before flags are laid over them and ports resolved.
type fileBlocks struct {
	lb     shim.LBSpec
	health shim.HealthSpec
}

// loadFile applies an HCL config file on top of c, and returns its LB blocks.
func loadFile(c *shim.Config, path string) (fileBlocks, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return fileBlocks{}, fmt.Errorf("read -config file: %w", err)
	}
	return applyHCL(c, src, path)
}

// applyHCL decodes src (named filename in messages) onto c. Unknown keys,
// wrong types and bad durations are errors with file:line.
func applyHCL(c *shim.Config, src []byte, filename string) (fileBlocks, error) {
	var blocks fileBlocks
	file, diags := hclparse.NewParser().ParseHCL(src, filename)
	if diags.HasErrors() {
		return blocks, fmt.Errorf("parse %s: %s", filename, diagText(diags))
	}
	var fc fileConfig
	diags = gohcl.DecodeBody(file.Body, nil, &fc)
	top, topDiags := decodeSettings(fc.Settings, shim.InFileTop)
	diags = append(diags, topDiags...)
	var lock shim.LockValues
	if fc.Lock != nil {
		var lockDiags hcl.Diagnostics
		lock, lockDiags = decodeSettings(fc.Lock.Settings, shim.InFileLock)
		diags = append(diags, lockDiags...)
	}
	if diags.HasErrors() {
		return blocks, fmt.Errorf("decode %s: %s", filename, diagText(diags))
	}

	var errs []error
	if fc.Command != "" {
		c.Command = append([]string{fc.Command}, fc.Args...)
	} else if len(fc.Args) > 0 {
		errs = append(errs, fmt.Errorf("%s: args given without command", filename))
	}
	if fc.Shell != nil {
		c.Shell = *fc.Shell
	}
	if fc.Verbose != nil {
		c.Verbose = *fc.Verbose
	}
	errs = append(errs,
		shim.LockSettings.In(shim.InFileTop).Apply(c, top, func(s shim.LockSetting) string { return filename + ": " + s.Name }),
		shim.LockSettings.In(shim.InFileLock).Apply(c, lock, func(s shim.LockSetting) string { return filename + ": lock." + s.Name }))
	if fc.LB != nil {
		blocks.lb = *fc.LB
	}
	if fc.Health != nil {
		blocks.health = *fc.Health
	}
	return blocks, errors.Join(errs...)
}

// decodeSettings decodes the lock settings allowed at where from body, the
// rest of a block that gohcl decoded: an attribute or block that is neither
// a setting nor a field gohcl took is an error, as gohcl's own would be.
func decodeSettings(body hcl.Body, where shim.Where) (shim.LockValues, hcl.Diagnostics) {
	settings := shim.LockSettings.In(where)
	schema := &hcl.BodySchema{}
	if where == shim.InFileTop {
		// The fields gohcl took too, so that a misspelt one gets its
		// "Did you mean" (they are hidden in body: none is found twice).
		schema, _ = gohcl.ImpliedBodySchema(fileConfig{})
	}
	for _, s := range settings {
		schema.Attributes = append(schema.Attributes, hcl.AttributeSchema{Name: s.Name})
	}
	content, diags := body.Content(schema)
	vals := shim.LockValues{}
	for _, s := range settings {
		attr, ok := content.Attributes[s.Name]
		if !ok {
			continue
		}
		var v string
		var d hcl.Diagnostics
		switch s.Kind() {
		case shim.KindInt:
			var n *int
			if d = gohcl.DecodeExpression(attr.Expr, nil, &n); n != nil {
				v = strconv.Itoa(*n)
			}
		case shim.KindBool:
			var b *bool
			if d = gohcl.DecodeExpression(attr.Expr, nil, &b); b != nil {
				v = strconv.FormatBool(*b)
			}
		default:
			d = gohcl.DecodeExpression(attr.Expr, nil, &v)
		}
		diags = append(diags, d...)
		if v != "" {
			vals[s.Name] = v
		}
	}
	return vals, diags
}

func diagText(diags hcl.Diagnostics) string {
	var parts []string
	for _, d := range diags {
		msg := d.Summary
		if d.Detail != "" {
			msg += ": " + d.Detail
		}
		if d.Subject != nil {
			msg = d.Subject.String() + ": " + msg
		}
		parts = append(parts, msg)
	}
	return strings.Join(parts, "; ")
}
