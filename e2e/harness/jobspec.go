package harness

import (
	"embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// The jobspecs the tests submit are text/template files in jobs/, one per
// kind of job: the test's builder fills a struct of values and Jobspec
// renders it. Shared blocks are defined in jobs/blocks.tmpl.
//
//go:embed jobs/*.tmpl
var jobFiles embed.FS

// JobspecFuncs are the functions the templates may call:
//
//   - quote renders a Go string as an HCL string literal (strconv.Quote);
//   - list renders a []string as an HCL list of string literals (HCLList).
//
// Neither escapes "${": an interpolation such as ${NOMAD_PORT_http} in a
// value reaches Nomad as one, which is what the tests want.
var JobspecFuncs = template.FuncMap{
	"quote": strconv.Quote,
	"list":  func(items []string) string { return HCLList(items...) },
}

var jobTemplates = template.Must(template.New("jobs").Funcs(JobspecFuncs).
	Option("missingkey=error").ParseFS(jobFiles, "jobs/*.tmpl"))

// Jobspec renders the jobspec template jobs/<name>.nomad.hcl.tmpl with data
// (a struct whose exported fields the template names). A template that does
// not execute is a bug in the test code, so it panics.
func Jobspec(name string, data any) string {
	var b strings.Builder
	if err := jobTemplates.ExecuteTemplate(&b, name+".nomad.hcl.tmpl", data); err != nil {
		panic("harness: jobspec " + name + ": " + err.Error())
	}
	return b.String()
}

// JobspecNames lists the jobspec templates, sorted.
func JobspecNames() []string {
	var names []string
	for _, t := range jobTemplates.Templates() {
		if n, ok := strings.CutSuffix(t.Name(), ".nomad.hcl.tmpl"); ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// ParseJobspec checks a rendered jobspec's HCL syntax (no schema, no
// variables: what `nomad job validate` parses first) and returns the body of
// its one job block and the job's label.
func ParseJobspec(src string) (*hclsyntax.Body, string, error) {
	f, diags := hclsyntax.ParseConfig([]byte(src), "job.nomad.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, "", diags
	}
	blocks := f.Body.(*hclsyntax.Body).Blocks
	if len(blocks) != 1 || blocks[0].Type != "job" || len(blocks[0].Labels) != 1 {
		return nil, "", fmt.Errorf("want one job block with one label, have %d blocks", len(blocks))
	}
	return blocks[0].Body, blocks[0].Labels[0], nil
}
