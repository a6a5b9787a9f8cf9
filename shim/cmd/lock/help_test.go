package main

import (
	"bytes"
	"flag"
	"io"
	"os"
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

// TestREADMEHelp: the CLI reference, docs/cli.md, shows what lock and lock
// status print for -h, and names no flag that lock or lock lb lacks. A flag
// added, renamed or reworded fails it until the page is regenerated with
// -update-readme.
func TestREADMEHelp(t *testing.T) {
	readme, err := os.ReadFile(cliDocPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	for _, args := range [][]string{{"-h"}, {"status", "-h"}} {
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
	for _, fs := range []*flag.FlagSet{newRunFlags(io.Discard).fs, newLBFlags("lock lb", &lbCmd{}, io.Discard).fs} {
		fs.VisitAll(func(f *flag.Flag) { known[f.Name] = true })
	}
	for _, m := range regexp.MustCompile("`-([a-z][a-z-]*)").FindAllStringSubmatch(text, -1) {
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
