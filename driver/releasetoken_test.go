package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The release token file is the operator's secret: the plugin takes it only
// from a root-owned 0600 regular file, and says how to fix anything else.
func TestReadReleaseToken(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to own the token file")
	}
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "  tok-3f1c\n", 0o600)
	if err := os.Symlink(good, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	other := write("other", "tok-3f1c", 0o600)
	if err := os.Chown(other, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string
	}{
		{"a root-owned 0600 file", good, ""},
		{"readable by others", write("wide", "tok-3f1c", 0o644), "chmod 0600"},
		{"owned by another user", other, "owned by root"},
		{"a symlink", filepath.Join(dir, "link"), "release_token_file"},
		{"blank", write("blank", "\n", 0o600), "want one ACL token"},
		{"empty", write("empty", "", 0o600), "want one ACL token"},
		{"a relative path", "token", "not an absolute path"},
		{"missing", filepath.Join(dir, "nope"), "no such file"},
		{"a directory", dir, "release_token_file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			token, err := readReleaseToken(tc.path)
			if tc.want == "" {
				if err != nil || token != "tok-3f1c" {
					t.Fatalf("readReleaseToken = %q, %v; want the trimmed token", token, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("readReleaseToken = %q, %v; want an error containing %q", token, err, tc.want)
			}
			if strings.Contains(err.Error(), "tok-3f1c") {
				t.Fatalf("the error shows the token: %v", err)
			}
		})
	}
}

// The plugin's parent is the program the token may go to; its own PID's
// executable is told apart from another program's.
func TestExeOf(t *testing.T) {
	self, err := exeOf(os.Getpid())
	if err != nil || self == (exeID{}) {
		t.Fatalf("exeOf(self) = %v, %v", self, err)
	}
	if init, err := exeOf(1); err == nil && init == self {
		t.Fatalf("PID 1 and this test have the same executable %v", self)
	}
}

// The token goes to the plugin's parent alone. Another process running the
// same executable (as Nomad's logmon and executor run the agent's) is
// refused: here this test process stands for such a helper, since it runs
// the executable the check is given but is not the plugin's parent.
func TestReleaseTokenGoesOnlyToThePluginsParent(t *testing.T) {
	parent, err := exeOf(os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	if err := agentPeer(parent)(int32(os.Getppid())); err != nil {
		t.Errorf("the plugin's parent, running the agent's executable, refused: %v", err)
	}
	self, err := exeOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := agentPeer(self)(int32(os.Getpid())); err == nil || !strings.Contains(err.Error(), "is not the Nomad agent that started the plugin") {
		t.Errorf("a process with the agent's executable that is not the plugin's parent: %v, want it refused", err)
	}
	if err := agentPeer(self)(int32(os.Getppid())); err == nil || !strings.Contains(err.Error(), "no longer runs the Nomad agent's executable") {
		t.Errorf("the parent running another executable: %v, want it refused", err)
	}
}
