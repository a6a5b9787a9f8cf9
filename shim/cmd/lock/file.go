package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// fileConfig is the -config HCL file. Its shape matches the driver's task
// config: command and args at the top, lock settings in a lock block.
type fileConfig struct {
	Command     string           `hcl:"command,optional"`
	Args        []string         `hcl:"args,optional"`
	Shell       *bool            `hcl:"shell,optional"`
	KillSignal  string           `hcl:"kill_signal,optional"`
	KillTimeout string           `hcl:"kill_timeout,optional"`
	Verbose     *bool            `hcl:"verbose,optional"`
	Lock        *fileLock        `hcl:"lock,block"`
	LB          *shim.LBSpec     `hcl:"load_balancer,block"`
	Health      *shim.HealthSpec `hcl:"health_check,block"`
}

type fileLock struct {
	Path        string `hcl:"path,optional"`
	Namespace   string `hcl:"namespace,optional"`
	TTL         string `hcl:"ttl,optional"`
	Delay       string `hcl:"delay,optional"`
	Renew       string `hcl:"renew,optional"`
	Wait        string `hcl:"wait,optional"`
	Backoff     string `hcl:"backoff,optional"`
	MaxRetry    *int   `hcl:"max_retry,optional"`
	EarlyReturn *bool  `hcl:"early_return,optional"`
	// UpstreamPort is Config.UpstreamPort.
	UpstreamPort string `hcl:"upstream_port,optional"`
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
	if diags := gohcl.DecodeBody(file.Body, nil, &fc); diags.HasErrors() {
		return blocks, fmt.Errorf("decode %s: %s", filename, diagText(diags))
	}
	var errs []error
	dur := func(field, s string, dst *time.Duration) {
		if err := shim.ParseDuration(filename+": "+field, s, "10s", dst); err != nil {
			errs = append(errs, err)
		}
	}
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
	if fc.KillSignal != "" {
		sig, err := shim.ParseSignal(fc.KillSignal)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: kill_signal: %w", filename, err))
		}
		c.KillSignal, c.KillSignalSet = sig, true
	}
	dur("kill_timeout", fc.KillTimeout, &c.KillTimeout)
	if fc.LB != nil {
		blocks.lb = *fc.LB
	}
	if fc.Health != nil {
		blocks.health = *fc.Health
	}
	if l := fc.Lock; l != nil {
		if l.Path != "" {
			c.Path = l.Path
		}
		if l.Namespace != "" {
			c.Namespace = l.Namespace
		}
		dur("lock.ttl", l.TTL, &c.TTL)
		dur("lock.delay", l.Delay, &c.LockDelay)
		dur("lock.renew", l.Renew, &c.Renew)
		dur("lock.wait", l.Wait, &c.Wait)
		dur("lock.backoff", l.Backoff, &c.Backoff)
		if l.MaxRetry != nil {
			c.MaxRetry = *l.MaxRetry
		}
		if l.UpstreamPort != "" {
			c.UpstreamPort = l.UpstreamPort
		}
		if l.EarlyReturn != nil {
			c.EarlyReturn = *l.EarlyReturn
		}
	}
	return blocks, errors.Join(errs...)
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
