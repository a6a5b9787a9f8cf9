package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestUserPolicy(t *testing.T) {
	policy := func(pc PluginConfig) userPolicy {
		t.Helper()
		p, err := newUserPolicy(hclog.NewNullLogger(), pc)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name     string
		pc       PluginConfig
		taskUser string
		wantUID  uint32
		wantErr  []string
	}{
		{name: "no user runs as the default, nobody", wantUID: 65534},
		{name: "root refused by default", taskUser: "root", wantErr: []string{"would run as root", "allow_root = true", "`user`"}},
		{name: "root default_user refused", pc: PluginConfig{DefaultUser: "root"}, wantErr: []string{"default_user"}},
		{name: "allow_root lets root in", pc: PluginConfig{AllowRoot: true}, taskUser: "root", wantUID: 0},
		{name: "denied uid", pc: PluginConfig{DeniedHostUIDs: "65534"}, wantErr: []string{"denied_host_uids"}},
		// Nomad's own validator refuses every user when gid 0 is denied.
		{name: "gid 0 denied does not refuse nobody", pc: PluginConfig{DeniedHostGIDs: "0"}, wantUID: 65534},
		{name: "denied gid of nobody", pc: PluginConfig{DeniedHostGIDs: "1000-70000"}, wantErr: []string{"denied_host_gids", "group 65534"}},
		{name: "unknown user", taskUser: "no-such-user-here", wantErr: []string{"exists on this client"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, err := policy(c.pc).resolve(c.taskUser)
			if len(c.wantErr) > 0 {
				for _, w := range c.wantErr {
					if err == nil || !strings.Contains(err.Error(), w) {
						t.Fatalf("err = %v, want it to contain %q", err, w)
					}
				}
				return
			}
			if err != nil || id.uid != c.wantUID {
				t.Fatalf("resolve(%q) = uid %d, %v; want uid %d", c.taskUser, id.uid, err, c.wantUID)
			}
		})
	}
	if _, err := newUserPolicy(hclog.NewNullLogger(), PluginConfig{DeniedHostGIDs: "10-5"}); err == nil || !strings.Contains(err.Error(), "denied_host_gids") {
		t.Errorf("a reversed gid range: %v", err)
	}
}

// A task user who cannot search a directory above its task dir is refused
// with the chmod that fixes it, not left to die with exit code 126.
func TestCheckReach(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a directory nobody cannot search")
	}
	base := t.TempDir()
	// t.TempDir's parents are 0700; only the tree below base is under test.
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(base, "data")
	task := filepath.Join(data, "alloc", "t")
	if err := os.MkdirAll(task, 0o755); err != nil {
		t.Fatal(err)
	}
	nobody := taskIdentity{name: "nobody", uid: 65534, gid: 65534}
	if err := os.Chmod(data, 0o700); err != nil {
		t.Fatal(err)
	}
	err := checkReach(task, nobody)
	if err == nil || !strings.Contains(err.Error(), "chmod 0711 "+data) {
		t.Fatalf("checkReach through a 0700 dir: %v", err)
	}
	if err := os.Chmod(data, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := checkReach(task, nobody); err != nil {
		t.Fatalf("checkReach through a 0711 dir: %v", err)
	}
}
