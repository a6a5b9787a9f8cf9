package securefs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func privateDir(t *testing.T) (*Dir, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state")
	d, err := OpenPrivate(path, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, path
}

func TestPrivateDirRoundTrip(t *testing.T) {
	d, path := privateDir(t)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("created %s: %v %v, want mode 0700", path, fi.Mode(), err)
	}
	if err := d.WriteFile("a.json", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteFile("a.json", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if b, err := d.ReadFile("a.json", 10); err != nil || string(b) != "two" {
		t.Fatalf("read back %q %v", b, err)
	}
	if fi, _ := os.Stat(filepath.Join(path, "a.json")); fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, want 0600", fi.Mode().Perm())
	}
	if err := d.AppendFile("e", []byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if err := d.AppendFile("e", []byte("y\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := d.ReadFile("e", 10); string(b) != "x\ny\n" {
		t.Errorf("appended %q", b)
	}
	entries, _ := os.ReadDir(path)
	if len(entries) != 2 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	sub, err := d.Sub("task", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.WriteFile("f", nil); err != nil {
		t.Fatal(err)
	}
	sub.Close()
	if err := d.RemoveSub("task"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(path, "task")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sub dir not removed: %v", err)
	}
	if err := d.RemoveSub("task"); err != nil {
		t.Errorf("removing a missing sub dir: %v", err)
	}
}

// A symlink planted where a state file goes is never followed: writes
// replace the link itself, reads and appends refuse it.
func TestPrivateDirRefusesSymlinks(t *testing.T) {
	d, path := privateDir(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"status.json", "events"} {
		if err := os.Symlink(victim, filepath.Join(path, name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.ReadFile("status.json", 100); err == nil {
		t.Error("read followed a symlink")
	}
	if err := d.AppendFile("events", []byte("x")); err == nil {
		t.Error("append followed a symlink")
	}
	if err := d.WriteFile("status.json", []byte("new")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Fatalf("victim written through a symlink: %q", b)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(path, "sub")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Sub("sub", true); err == nil {
		t.Error("Sub followed a symlink")
	}
	for _, bad := range []string{"../x", "/etc/passwd", "..", ""} {
		if _, err := d.ReadFile(bad, 10); err == nil {
			t.Errorf("ReadFile(%q) succeeded", bad)
		}
	}
}

func TestOpenPrivateRefusesInsecureDirs(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenPrivate(open, false); err == nil || !strings.Contains(err.Error(), "chmod 0700") {
		t.Errorf("0755 state dir: %v, want a refusal that names chmod 0700", err)
	}
	world := filepath.Join(base, "world")
	if err := os.Mkdir(world, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(world, 0o777); err != nil {
		t.Fatal(err)
	}
	var ie *InsecureError
	if _, err := OpenPrivate(filepath.Join(world, "state"), true); !errors.As(err, &ie) || !strings.Contains(err.Error(), "writable by group or others") {
		t.Errorf("state dir below a world-writable dir: %v", err)
	}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(base, "foreign")
		if err := os.Mkdir(foreign, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenPrivate(foreign, false); err == nil {
			t.Error("a state dir owned by nobody was accepted")
		}
		if _, err := OpenPrivate(filepath.Join(foreign, "state"), true); !errors.As(err, &ie) {
			t.Errorf("a state dir below a dir owned by nobody: %v", err)
		}
	}
	if _, err := OpenPrivate("relative/path", true); err == nil {
		t.Error("a relative path was accepted")
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenPrivate(link, false); err == nil {
		t.Error("a symlinked state dir was accepted")
	}
}

func TestReadBeneath(t *testing.T) {
	root := t.TempDir()
	sec := filepath.Join(root, "secrets")
	if err := os.Mkdir(sec, 0o777); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(sec, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("key", "s3cret\n")
	if b, err := ReadBeneath(root, "secrets/key", 64); err != nil || string(b) != "s3cret\n" {
		t.Fatalf("ReadBeneath: %q %v", b, err)
	}
	outside := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(outside, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(sec, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(write("hard", "x"), filepath.Join(sec, "hard2")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(sec, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	write("big", strings.Repeat("x", 100))
	if err := os.Symlink(sec, filepath.Join(root, "seclink")); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"secrets/link", "secrets/hard2", "secrets/fifo", "secrets/big",
		"seclink/key", "../" + filepath.Base(root) + "/secrets/key", outside, "/dev/zero", "secrets/missing"} {
		done := make(chan error, 1)
		go func() { _, err := ReadBeneath(root, rel, 64); done <- err }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("ReadBeneath(%q) succeeded", rel)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("ReadBeneath(%q) hangs", rel)
		}
	}
}

// Names lists a private dir's files and subdirs, and works on a Sub.
func TestNames(t *testing.T) {
	d, _ := privateDir(t)
	if err := d.WriteFile("f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	sub, err := d.Sub("s", true)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.WriteFile("g", nil); err != nil {
		t.Fatal(err)
	}
	names, err := d.Names()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"f", "s"}) {
		t.Errorf("Names() = %v, want [f s]", names)
	}
	if names, err := sub.Names(); err != nil || !slices.Equal(names, []string{"g"}) {
		t.Errorf("sub Names() = %v %v, want [g]", names, err)
	}
}

// ReplaceBeneath writes into a directory others may write without
// following what they planted there: a symlink at the name is replaced,
// its target untouched; a symlinked directory is refused.
func TestReplaceBeneathNeverFollowsASymlink(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "alloc")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(target, []byte("root's own\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(shared, "lock.env")); err != nil {
		t.Fatal(err)
	}
	if err := ReplaceBeneath(root, "alloc", "lock.env", []byte("SLOT=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "root's own\n" {
		t.Errorf("the symlink's target was written: %q", b)
	}
	fi, err := os.Lstat(filepath.Join(shared, "lock.env"))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("lock.env: %v %v, want a regular file of mode 0644", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(shared, "lock.env")); string(b) != "SLOT=1\n" {
		t.Errorf("lock.env = %q", b)
	}
	names, _ := os.ReadDir(shared)
	if len(names) != 1 {
		t.Errorf("left behind: %v", names)
	}
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(root, "linked")); err != nil {
		t.Fatal(err)
	}
	if err := ReplaceBeneath(root, "linked", "lock.env", []byte("x"), 0o644); err == nil {
		t.Error("wrote through a symlinked directory")
	}
	if names, _ := os.ReadDir(elsewhere); len(names) != 0 {
		t.Errorf("wrote into the symlink's target dir: %v", names)
	}
}
