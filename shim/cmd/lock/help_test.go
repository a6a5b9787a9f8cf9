package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var updateREADME = flag.Bool("update-readme", false, "rewrite the help blocks of docs/cli.md from the real help")

// cliDocPath is the CLI reference, which shows the help verbatim.
const cliDocPath = "../../../docs/cli.md"

// helpOf is what `lock <args>` prints as its help.
func helpOf(args ...string) string {
	var stderr bytes.Buffer
	run(args, io.Discard, &stderr)
	return stderr.String()
}

// TestREADMEHelp: the CLI reference, docs/cli.md, shows what lock, lock
// status and lock list print for -h, and names no flag that lock or lock lb
// lacks. A flag added, renamed or reworded fails it until the page is
// regenerated with -update-readme.
func TestREADMEHelp(t *testing.T) {
	readme, err := os.ReadFile(cliDocPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	for _, args := range [][]string{{"-h"}, {"status", "-h"}, {"list", "-h"}, {"step-down", "-h"}} {
		name := "lock " + strings.Join(args, " ")
		begin := "<!-- BEGIN " + name + " -->\n```text\n"
		end := "```\n<!-- END " + name + " -->"
		i := strings.Index(text, begin)
		j := strings.Index(text, end)
		if i < 0 || j < i {
			t.Errorf("%s has no %q block", cliDocPath, begin+end)
			continue
		}
		want := helpOf(args...)
		if got := text[i+len(begin) : j]; got != want {
			if !*updateREADME {
				t.Errorf("the %q block of %s is not what %s prints; run go test -run TestREADMEHelp -update-readme\n"+
					"docs/cli.md:\n%s\nhelp:\n%s", name, cliDocPath, name, got, want)
			}
			text = text[:i+len(begin)] + want + text[j:]
		}
	}
	if *updateREADME && text != string(readme) {
		if err := os.WriteFile(cliDocPath, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	known := map[string]bool{}
	for _, fs := range []*flag.FlagSet{newRunFlags(io.Discard).fs, newLBFlags("lock lb", &lbCmd{}, io.Discard).fs,
		newReadFlags(false, io.Discard).fs, newReadFlags(true, io.Discard).fs, newStepDownFlags(io.Discard).fs} {
		fs.VisitAll(func(f *flag.Flag) { known[f.Name] = true })
	}
	// Every flag the page names is lock's, but in the table of what lock
	// does not take (TestVarLockDifferences checks that one).
	before, after, _ := strings.Cut(text, "## Where `lock` differs from `nomad var lock`")
	_, after, _ = strings.Cut(after, "\n## ")
	for _, m := range regexp.MustCompile("`-([a-z][a-z-]*)").FindAllStringSubmatch(before+after, -1) {
		if !known[m[1]] {
			t.Errorf("%s names -%s, which lock has not", cliDocPath, m[1])
		}
	}
}

// Every flag has a usage, and names its argument unless it is a switch.
func TestEveryFlagHasUsage(t *testing.T) {
	for _, fs := range []*flag.FlagSet{newRunFlags(io.Discard).fs, newLBFlags("lock lb", &lbCmd{}, io.Discard).fs} {
		fs.VisitAll(func(f *flag.Flag) {
			arg, usage := flagArg(f)
			if usage == "" {
				t.Errorf("-%s has no usage", f.Name)
			}
			if isBool, _ := f.Value.(interface{ IsBoolFlag() bool }); (isBool == nil || !isBool.IsBoolFlag()) &&
				(arg == "" || arg == "VALUE" || arg == "STRING") {
				t.Errorf("-%s names its argument %q: put the argument's name in backquotes in its usage", f.Name, arg)
			}
		})
	}
}

// TestVarLockDifferences: lock takes every flag of nomad var lock (read
// from Nomad's own source, the pinned module: command/var_lock.go and the
// client flags of command/meta.go) under the same name, but for what the
// table of docs/cli.md ("Where lock differs from nomad var lock") lists as
// not taken; each flag the table names is one of nomad var lock's, and each
// default it gives for lock is the one lock -h prints.
func TestVarLockDifferences(t *testing.T) {
	nomadFlags := nomadVarLockFlags(t)
	ours := map[string]*flag.Flag{}
	newRunFlags(io.Discard).fs.VisitAll(func(f *flag.Flag) { ours[f.Name] = f })
	help := helpOf("-h")

	doc, err := os.ReadFile(cliDocPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	i := strings.Index(text, "## Where `lock` differs from `nomad var lock`")
	if i < 0 {
		t.Fatalf("%s has no section \"Where `lock` differs from `nomad var lock`\"", cliDocPath)
	}
	section, _, _ := strings.Cut(text[i+3:], "\n## ")
	rows := regexp.MustCompile("(?m)^\\| (.*?) \\| (.*?) \\| .*\\|$").FindAllStringSubmatch(section, -1)
	if len(rows) < 5 {
		t.Fatalf("the differences table has %d rows: is it still a table of | nomad var lock | lock | why |?", len(rows))
	}
	flagName := regexp.MustCompile("`-([a-z][a-z-]*)")
	defaultOf := regexp.MustCompile("default ([^ ,;()]+)")
	notTaken := map[string]bool{}
	listed := 0
	for _, row := range rows { // the header names no flag; its rule does not match
		theirs, lock := row[1], row[2]
		for _, m := range flagName.FindAllStringSubmatch(theirs, -1) {
			name := m[1]
			listed++
			if !nomadFlags[name] {
				t.Errorf("the table lists -%s, which nomad var lock does not take", name)
			}
			if strings.HasPrefix(lock, "not taken") {
				notTaken[name] = true
				if ours[name] != nil {
					t.Errorf("the table says lock does not take -%s, but lock -h lists it", name)
				}
				continue
			}
			f := ours[name]
			if f == nil || !strings.Contains(help, "  -"+name) {
				t.Errorf("the table says lock takes -%s (%q), but lock -h does not list it", name, lock)
				continue
			}
			def := f.DefValue
			if def == "" {
				def = "0" // lock -h shows no zero default
			}
			if d := defaultOf.FindStringSubmatch(lock); d != nil && d[1] != def {
				t.Errorf("the table gives lock's -%s the default %s, lock -h %q", name, d[1], def)
			}
		}
	}
	for name := range nomadFlags {
		if !notTaken[name] && (ours[name] == nil || !strings.Contains(help, "  -"+name)) {
			t.Errorf("nomad var lock takes -%s; lock -h does not list it, and the table of differences does not say why", name)
		}
	}
	t.Logf("nomad var lock v1.11 has %d flags; the table lists %d, %d not taken", len(nomadFlags), listed, len(notTaken))
}

// nomadVarLockFlags reads the flags of nomad var lock from the source of
// the Nomad module this one pins.
func nomadVarLockFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/hashicorp/nomad").Output()
	if err != nil {
		t.Fatalf("find Nomad's source in the module cache (go mod download): %v", err)
	}
	dir := strings.TrimSpace(string(out))
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, "command", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	flags := map[string]bool{}
	declared := regexp.MustCompile(`(?:flags|f)\.\w+Var\(&[^,]+, "([a-z][a-z-]*)"`)
	varLock := read("var_lock.go")
	meta := read("meta.go")
	i := strings.Index(meta, "func (m *Meta) FlagSet(")
	if i < 0 {
		t.Fatal("command/meta.go has no FlagSet: read Nomad's CLI flags anew")
	}
	metaFlags, _, _ := strings.Cut(meta[i:], "\n}\n")
	for _, src := range []string{varLock, metaFlags} {
		for _, m := range declared.FindAllStringSubmatch(src, -1) {
			flags[m[1]] = true
		}
	}
	if len(flags) < 15 || !flags["ttl"] || !flags["ca-cert"] {
		t.Fatalf("read %d flags of nomad var lock from %s: has its source changed shape?", len(flags), dir)
	}
	return flags
}
