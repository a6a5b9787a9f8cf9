package main

import (
	"strings"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// FuzzConfigFile feeds arbitrary bytes to the -config HCL decoder. It must
// never panic; every rejection must name the file (so a user can find the
// mistake); an accepted file must leave a config that Validate can judge
// without panicking, and decoding the same bytes again onto a fresh config
// must give the same verdict. The seed corpus is in
// testdata/fuzz/FuzzConfigFile (run with `make fuzz`).
func FuzzConfigFile(f *testing.F) {
	f.Add([]byte("command = \"/bin/sleep\"\nargs = [\"60\"]\nlock {\n  path = \"nomad/jobs/web/lock\"\n  ttl = \"20s\"\n}\n"))
	f.Add([]byte("lock { ttl = \"ten seconds\" }"))
	f.Add([]byte("kill_signal = \"SIGINT\"\nkill_timeout = \"7s\"\n"))
	f.Add([]byte("load_balancer {\n  uri = \"http://127.0.0.1:1/baragon/v2/request\"\n  service = \"web\"\n}\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		const name = "fuzz.hcl"
		c := shim.DefaultConfig()
		_, err := applyHCL(&c, src, name)
		if err != nil {
			if !strings.Contains(err.Error(), name) {
				t.Fatalf("error does not name the file: %v", err)
			}
		} else {
			_ = c.Validate()
		}
		c2 := shim.DefaultConfig()
		_, err2 := applyHCL(&c2, src, name)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %v then %v", err, err2)
		}
	})
}
