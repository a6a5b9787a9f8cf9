package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReleaseIsReproducible builds the linux/amd64 release twice: once
// from this tree, once from a copy of it at another path under another
// umask, and wants identical SHA256SUMS. (One platform keeps it fast; the
// second build reuses the Go build cache, which is keyed by content, so
// this proves that paths, build IDs, file times, owners and modes do not
// leak into the artifacts.)
func TestReleaseIsReproducible(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const version = "0.0.0-reprotest"
	env := append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")

	files, err := exec.CommandContext(ctx, "git", "ls-files", "-co", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("list the tree's files with git: %v", err)
	}
	copyDir := filepath.Join(t.TempDir(), "elsewhere", "src")
	if err := os.MkdirAll(copyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var list []string
	for _, f := range strings.Split(strings.TrimSpace(string(files)), "\n") {
		if _, err := os.Stat(f); err == nil && !strings.HasPrefix(f, "bin/") && !strings.HasPrefix(f, "dist/") {
			list = append(list, f)
		}
	}
	pack := exec.CommandContext(ctx, "tar", "-cf", "-", "-T", "-")
	pack.Stdin = strings.NewReader(strings.Join(list, "\n"))
	unpack := exec.CommandContext(ctx, "tar", "-xf", "-", "-C", copyDir)
	unpack.Stdin, _ = pack.StdoutPipe()
	if err := pack.Start(); err != nil {
		t.Fatal(err)
	}
	if out, err := unpack.CombinedOutput(); err != nil {
		t.Fatalf("copy the tree: %v\n%s", err, out)
	}
	if err := pack.Wait(); err != nil {
		t.Fatal(err)
	}

	sums := func(dir, umask string) []byte {
		t.Helper()
		out := filepath.Join(t.TempDir(), "dist")
		cmd := exec.CommandContext(ctx, "bash", "-c", "umask "+umask+" && scripts/release.sh "+version+" "+out+" linux/amd64")
		cmd.Dir, cmd.Env = dir, env
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("release build in %s: %v\n%s", dir, err, b)
		}
		b, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	here := sums(".", "022")
	there := sums(copyDir, "077")
	if !bytes.Equal(here, there) {
		t.Fatalf("two release builds differ:\n%s\nvs (copy at another path, umask 077):\n%s", here, there)
	}
	if n := strings.Count(string(here), "\n"); n != 2 {
		t.Fatalf("SHA256SUMS lists %d artifacts, want the plugin's and lock's tarballs:\n%s", n, here)
	}
	t.Logf("identical:\n%s", here)
}
