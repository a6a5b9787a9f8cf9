package main

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/nomad/acl"
	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/command/agent"
	"github.com/hashicorp/nomad/drivers/docker"
	nomadexec "github.com/hashicorp/nomad/drivers/exec"
	"github.com/hashicorp/nomad/drivers/rawexec"
	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/hashicorp/nomad/jobspec2"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/zclconf/go-cty/cty"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/driver"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/hclsnippet"
	_ "github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient" // its snippets
	_ "github.com/nomad-driver-singleton/nomad-driver-singleton/shim"       // its snippets
)

// What a user copies must work. These tests parse every HCL block of the
// README, the manual and examples/, and every snippet that a message or an
// event suggests, with the parser Nomad itself uses for that kind of file:
//
//   - a job, group or task: Nomad's jobspec parser (jobspec2, strict), then
//     api.Job.Canonicalize, the conversion the HTTP API applies
//     (agent.ApiJobToStructJob), structs.Job.Canonicalize and
//     structs.Job.Validate: the checks `nomad job run` gets from the server
//     short of those that need its state (namespaces, node pools, ACLs,
//     Vault and Consul). Each task's config block is then decoded with its
//     driver's own schema (singleton, docker, exec, raw_exec), as the
//     client decodes it;
//   - an ACL policy: Nomad's policy parser (acl.Parse, strict: HCL 1);
//   - an agent config: Nomad's agent config parser
//     (agent.ParseConfigFile), and our plugin's config block decoded with
//     the plugin's schema;
//   - a `lock -config` file: HCL syntax here; shim/cmd/lock's
//     TestDocConfigFiles decodes it with lock's own parser;
//   - a fragment of a driver config block: wrapped into a singleton task.

// checkHCL checks one block of HCL, classified by what it holds.
func checkHCL(name, src string) error {
	// Agent configs and ACL policies are HCL 1, which allows what HCL 2
	// does not (quoted keys, blocks on one line): their own parsers only.
	switch {
	case agentConfig.MatchString(src):
		return checkAgentConfig(name, src)
	case aclPolicy.MatchString(src):
		_, err := acl.Parse(src, true)
		return err
	}
	file, diags := hclsyntax.ParseConfig([]byte(src), name, hcl.InitialPos)
	if diags.HasErrors() {
		return diags
	}
	body := file.Body.(*hclsyntax.Body)
	var blocks, attrs []string
	for _, b := range body.Blocks {
		blocks = append(blocks, b.Type)
	}
	for a := range body.Attributes {
		attrs = append(attrs, a)
	}
	only := func(kind string) bool {
		return len(attrs) == 0 && len(blocks) > 0 && !slices.ContainsFunc(blocks, func(b string) bool { return b != kind })
	}
	switch {
	case slices.Contains(blocks, "job"):
		return checkJob(name, src)
	case only("group"):
		return checkJob(name, "job \"example\" {\n"+src+"\n}")
	case only("task"):
		return checkJob(name, wrapTasks(src))
	case only("config"):
		return checkJob(name, wrapTasks("task \"t\" {\n  driver = \"singleton\"\n  identity {\n    env = true\n  }\n"+src+"\n}"))
	case slices.Contains(attrs, "command"):
		return nil // a lock -config file: decoded by shim/cmd/lock's TestDocConfigFiles
	}
	return fmt.Errorf("%s: cannot tell what this HCL is (blocks %v, arguments %v): a job, group, task, config block, ACL policy, agent config or lock -config file", name, blocks, attrs)
}

var (
	agentConfig = regexp.MustCompile(`(?m)^(plugin|plugin_dir|client|server|data_dir)\b`)
	aclPolicy   = regexp.MustCompile(`(?m)^(namespace|node|agent|operator|host_volume|node_pool|quota)\b`)
)

// wrapTasks puts task blocks into a group with an "http" port, in a job.
func wrapTasks(tasks string) string {
	return "job \"example\" {\n  group \"web\" {\n    network {\n      port \"http\" {}\n    }\n" + tasks + "\n  }\n}"
}

func checkJob(name, src string) error {
	job, err := jobspec2.ParseWithConfig(&jobspec2.ParseConfig{Path: name, Body: []byte(src), Strict: true})
	if err != nil {
		return err
	}
	job.Canonicalize()
	sj := agent.ApiJobToStructJob(job)
	sj.Canonicalize()
	var errs []error
	if err := sj.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("validate: %w", err))
	}
	for _, g := range job.TaskGroups {
		for _, task := range g.Tasks {
			if err := checkTaskConfig(task); err != nil {
				errs = append(errs, fmt.Errorf("task %q: config: %w", task.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// taskSchemas are the config schemas of the drivers the docs use.
var taskSchemas = func() map[string]func() (*hclspec.Spec, error) {
	ctx, log := context.Background(), hclog.NewNullLogger()
	return map[string]func() (*hclspec.Spec, error){
		"singleton": driver.New(ctx, log).TaskConfigSchema,
		"docker":    docker.NewDockerDriver(ctx, log).TaskConfigSchema,
		"exec":      nomadexec.NewExecDriver(ctx, log).TaskConfigSchema,
		"raw_exec":  rawexec.NewRawExecDriver(ctx, log).TaskConfigSchema,
	}
}()

var runtimeVar = regexp.MustCompile(`\$\{(NOMAD_[A-Za-z0-9_]+)\}`)

// checkTaskConfig decodes a task's config block with its driver's schema,
// as Nomad's client does; the NOMAD_* variables it names get a value, as
// they do at run time.
func checkTaskConfig(task *api.Task) error {
	schema, ok := taskSchemas[task.Driver]
	if !ok {
		return fmt.Errorf("driver %q: no schema here to check its config with (add it to taskSchemas)", task.Driver)
	}
	return decodeWithSchema(task.Config, schema)
}

func decodeWithSchema(config map[string]any, schema func() (*hclspec.Spec, error)) error {
	s, err := schema()
	if err != nil {
		return err
	}
	spec, diags := hclspecutils.Convert(s)
	if diags.HasErrors() {
		return diags
	}
	vars := map[string]cty.Value{}
	for _, m := range runtimeVar.FindAllStringSubmatch(fmt.Sprint(config), -1) {
		vars[m[1]] = cty.StringVal("1")
	}
	if _, diags, errs := hclutils.ParseHclInterface(config, spec, vars); diags.HasErrors() {
		return errors.Join(errs...)
	}
	return nil
}

func checkAgentConfig(name, src string) error {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("snippet-%d-%s.hcl", os.Getpid(), strings.NewReplacer("/", "_", ":", "_").Replace(name)))
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		return err
	}
	defer os.Remove(path)
	cfg, err := agent.ParseConfigFile(path)
	if err != nil {
		return err
	}
	for _, p := range cfg.Plugins {
		if p.Name == "nomad-driver-singleton" {
			return decodeWithSchema(p.Config, driver.New(context.Background(), hclog.NewNullLogger()).ConfigSchema)
		}
	}
	return nil
}

// TestDocHCL: every HCL block of README.md, docs/*.md and examples/
// parses and validates; every other fenced block names its language.
func TestDocHCL(t *testing.T) {
	pages, _ := filepath.Glob("docs/*.md")
	pages = append([]string{"README.md"}, pages...)
	checked, inline := 0, 0
	skipped := map[string]int{}
	for _, page := range pages {
		src, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range hclsnippet.MarkdownBlocks(page, string(src)) {
			where := fmt.Sprintf("%s:%d", b.File, b.Line)
			switch b.Lang {
			case "hcl":
				checked++
				if err := checkHCL(where, b.Text); err != nil {
					t.Errorf("%s: ```hcl block does not work as written: %v\n%s", where, err, b.Text)
				}
			case "":
				t.Errorf("%s: a fenced block without a language: name it (```hcl is checked here; ```text, ```sh, ```console are not HCL)", where)
			default:
				skipped[b.Lang]++ // not HCL: sh, console, text, haproxy...
			}
		}
		for _, span := range hclsnippet.InlineCode(page, string(src)) {
			for _, text := range blocksIn(span.Text) {
				inline++
				if err := checkLiteralSnippet(text); err != nil {
					t.Errorf("%s:%d: inline `%s` does not parse: %v", span.File, span.Line, span.Text, err)
				}
			}
		}
	}
	files, _ := filepath.Glob("examples/*.nomad.hcl")
	more, _ := filepath.Glob("examples/*/*.hcl")
	for _, f := range append(files, more...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		if err := checkHCL(f, string(src)); err != nil {
			t.Errorf("%s does not work as written: %v", f, err)
		}
	}
	t.Logf("checked %d HCL blocks and files, and %d inline HCL blocks in prose; not HCL, by language: %v", checked, inline, skipped)
	if checked < 30 {
		t.Errorf("checked only %d HCL blocks and files: is the extraction broken?", checked)
	}
}

// wrapSnippet puts a registered snippet where it goes.
func checkSnippet(s hclsnippet.Snippet) error {
	text := s.Text()
	switch s.Where {
	case hclsnippet.InTask:
		return checkJob("snippet", wrapTasks("task \"t\" {\n  driver = \"raw_exec\"\n  config {\n    command = \"/bin/true\"\n  }\n"+text+"\n}"))
	case hclsnippet.InPolicy:
		_, err := acl.Parse(text, true)
		return err
	case hclsnippet.InFragment:
		if _, diags := hclsyntax.ParseExpression([]byte(text), "snippet", hcl.InitialPos); !diags.HasErrors() {
			return nil
		}
		_, diags := hclsyntax.ParseConfig([]byte(text), "snippet", hcl.InitialPos)
		if diags.HasErrors() {
			return diags
		}
		return nil
	}
	return fmt.Errorf("unknown place %v", s.Where)
}

// TestHCLSnippets: every snippet that a message or an event of shim,
// lockclient or driver suggests works where it says it goes.
func TestHCLSnippets(t *testing.T) {
	all := hclsnippet.All()
	for _, s := range all {
		if err := checkSnippet(s); err != nil {
			t.Errorf("a message suggests %s HCL that does not work: %v\n%s", s.Where, err, s.Text())
		}
	}
	t.Logf("checked %d registered snippets", len(all))
	if len(all) < 4 {
		t.Errorf("only %d snippets registered: did a package stop registering its snippets?", len(all))
	}
}

// hclLike finds the start of an HCL block in a message: a name, labels
// (quoted or %q) and an opening brace.
var hclLike = regexp.MustCompile(`\b[a-z_]+(?:\s+(?:"[^"\n]*"|%q))*\s*\{`)

// TestMessageSnippetsParse: a string in the product's Go code that holds an
// HCL block (a message, an event) either is registered with hclsnippet (so
// TestHCLSnippets checks it where it goes) or parses as it stands: an ACL
// policy with Nomad's policy parser, anything else as HCL 2. A message
// added later with a broken snippet fails here.
func TestMessageSnippetsParse(t *testing.T) {
	found := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == "e2e" || path == "tools" || path == "examples" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, s := range messageSnippets(f) {
			found++
			pos := fset.Position(s.pos)
			if s.registered && f.Name.Name == "main" {
				t.Errorf("%s: a snippet registered in package main, which the test cannot import: register it in the package that owns the message text (shim, driver, lockclient)", pos)
			}
			if s.registered {
				continue
			}
			if err := checkLiteralSnippet(s.text); err != nil {
				t.Errorf("%s: a message suggests HCL that does not parse: %v\n%s\n(write a block with more than one argument on several lines; register it with hclsnippet.Task so that it is checked where it goes)", pos, err, s.text)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d HCL snippets in the product's message strings", found)
	if found < 10 {
		t.Errorf("found only %d snippets in messages: is the scan broken?", found)
	}
}

type literalSnippet struct {
	pos        token.Pos
	text       string
	registered bool // an argument of hclsnippet.Task/Policy/Fragment
}

// messageSnippets returns the HCL blocks in the string constants of a Go
// file: each run of string literals joined by + is read as one string,
// with what is not a literal read as %s.
func messageSnippets(f *ast.File) []literalSnippet {
	var out []literalSnippet
	var walk func(n ast.Node, registered bool)
	walk = func(n ast.Node, registered bool) {
		ast.Inspect(n, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "hclsnippet" {
						for _, a := range n.Args {
							walk(a, true)
						}
						return false
					}
				}
			case *ast.BinaryExpr, *ast.BasicLit:
				s, ok := foldString(n.(ast.Expr))
				if !ok {
					return true
				}
				for _, text := range blocksIn(s) {
					out = append(out, literalSnippet{pos: n.Pos(), text: text, registered: registered})
				}
				return false
			}
			return true
		})
	}
	walk(f, false)
	return out
}

// foldString joins a chain of string literals; a part that is not a
// literal reads as "%s". ok is false if no part is a string literal.
func foldString(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.ParenExpr:
		return foldString(e.X)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		l, lok := foldString(e.X)
		r, rok := foldString(e.Y)
		if !lok && !rok {
			return "", false
		}
		if !lok {
			l = "%s"
		}
		if !rok {
			r = "%s"
		}
		return l + r, true
	}
	return "", false
}

// blocksIn returns each HCL block of s whose braces hold an argument (a
// "=" inside): from its name to its matching closing brace.
func blocksIn(s string) []string {
	var out []string
	for _, loc := range hclLike.FindAllStringIndex(s, -1) {
		depth, end := 0, -1
		for i := loc[1] - 1; i < len(s) && end < 0; i++ {
			switch s[i] {
			case '{':
				depth++
			case '}':
				if depth--; depth == 0 {
					end = i + 1
				}
			}
		}
		if end < 0 || !strings.Contains(s[loc[1]:end], "=") {
			continue
		}
		// An inner block of one already found is checked with it.
		if len(out) > 0 && strings.Contains(out[len(out)-1], s[loc[0]:end]) {
			continue
		}
		out = append(out, s[loc[0]:end])
	}
	return out
}

// fillVerbs gives a message's fmt verbs example values.
var fillVerbs = strings.NewReplacer(`%q`, `"example"`, `%s`, `example`, `%d`, `1`, `%v`, `example`)

func checkLiteralSnippet(text string) error {
	text = fillVerbs.Replace(text)
	switch {
	case agentConfig.MatchString(text):
		return checkAgentConfig("message", text)
	case aclPolicy.MatchString(text):
		_, err := acl.Parse(text, true)
		return err
	}
	if _, diags := hclsyntax.ParseConfig([]byte(text), "message", hcl.InitialPos); diags.HasErrors() {
		return diags
	}
	return nil
}

// The checks fail on what the issue found broken: a test that cannot fail
// proves nothing.
func TestSnippetChecksCatchBrokenHCL(t *testing.T) {
	broken := []struct{ name, src string }{
		{"two arguments on one line", "task \"gate\" {\n  driver = \"singleton\"\n  lifecycle { hook = \"prestart\"  sidecar = true }\n  config {\n    gate = true\n  }\n}"},
		{"an argument defined twice", "task \"api\" {\n  driver = \"docker\"\n  config {\n    image = \"x\"\n    args = [\"a\"]\n    args = [\"b\"]\n  }\n}"},
		{"a jobspec field that does not exist", "task \"a\" {\n  driver = \"singleton\"\n  restart {\n    attempt = 0\n  }\n  config {\n    command = \"x\"\n  }\n}"},
		{"a driver config field that does not exist", "task \"a\" {\n  driver = \"singleton\"\n  config {\n    command = \"x\"\n    lock {\n      holder = 2\n    }\n  }\n}"},
		{"a job Nomad's server refuses", "task \"a\" {\n  driver = \"singleton\"\n  lifecycle {\n    hook = \"sometime\"\n  }\n  config {\n    command = \"x\"\n  }\n}"},
		{"a policy capability that does not exist", `namespace "default" { capabilities = ["read-jobs"] }`},
		{"an unknown plugin config field", "plugin \"nomad-driver-singleton\" {\n  config {\n    default_tll = \"10s\"\n  }\n}"},
		{"something else", "frobnicate {\n  x = 1\n}"},
	}
	for _, c := range broken {
		if err := checkHCL(c.name, c.src); err == nil {
			t.Errorf("%s: accepted:\n%s", c.name, c.src)
		}
	}
	if err := checkSnippet(hclsnippet.Snippet{Where: hclsnippet.InTask, Format: `restart { attempts = 0  mode = "fail" }`}); err == nil {
		t.Error("a registered one-line two-argument block was accepted")
	}
	src := "package p\nfunc f() error { return fmt.Errorf(`add lifecycle { hook = \"prestart\"  sidecar = true } ` + \"to %q\", x) }\n"
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	snips := messageSnippets(f)
	if len(snips) != 1 || checkLiteralSnippet(snips[0].text) == nil {
		t.Errorf("a message with a broken snippet was not caught: %+v", snips)
	}
}
