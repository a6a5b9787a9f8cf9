package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

func TestParseFlags(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("filekey\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{authKeysEnv: "envkey1, envkey2"}
	var stderr bytes.Buffer
	cfg, err := parseFlags([]string{
		"-listen", ":0", "-groups", "default,prod=3", "-authkeys-file", keys, "-worker-interval", "20ms",
		"-error-rate", "0.5", "-drop-rate", "0.1", "-garbage-rate", "0.2", "-latency", "5ms",
		"-fault-after-handle", "-fault-methods", "POST,GET", "-seed", "42",
	}, func(k string) string { return env[k] }, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	want := []lbapi.Group{{Name: "default", Agents: 1}, {Name: "prod", Agents: 3}}
	if !slices.EqualFunc(cfg.opts.Groups, want, func(a, b lbapi.Group) bool { return a.Name == b.Name && a.Agents == b.Agents }) {
		t.Errorf("groups = %+v", cfg.opts.Groups)
	}
	if !slices.Equal(cfg.opts.AuthKeys, []string{"envkey1", "envkey2", "filekey"}) {
		t.Errorf("keys = %v", cfg.opts.AuthKeys)
	}
	f := cfg.opts.Faults
	if f.ErrorRate != 0.5 || f.DropRate != 0.1 || f.GarbageRate != 0.2 || f.Latency != 5*time.Millisecond ||
		!f.AfterHandle || !slices.Equal(f.Methods, []string{"POST", "GET"}) || cfg.opts.Seed != 42 || cfg.opts.WorkerInterval != 20*time.Millisecond {
		t.Errorf("faults = %+v seed %d", f, cfg.opts.Seed)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-groups", "a=0"},
		{"-groups", ","},
		{"-authkeys-file", "/does/not/exist"},
		{"sekret"},
		{"-nope"},
	} {
		if _, err := parseFlags(args, func(string) string { return "" }, &bytes.Buffer{}); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

func TestRunServesUntilWaitReturns(t *testing.T) {
	var stderr bytes.Buffer
	code := run([]string{"-listen", "127.0.0.1:0", "-log-level", "error"}, func(string) string { return "" }, &stderr, func() {})
	if code != 0 || !strings.Contains(stderr.String(), "/baragon/v2/request") {
		t.Errorf("exit %d, stderr %s", code, stderr.String())
	}
	if code := run([]string{"-error-rate", "3"}, func(string) string { return "" }, &stderr, func() {}); code != 64 {
		t.Errorf("bad options: exit %d, want 64", code)
	}
}
