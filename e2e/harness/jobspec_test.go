package harness

import (
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// The jobspec templates the tests render; e2e's TestJobspecTemplates and
// bench's TestBenchJobspecs render each through its builder.
func TestJobspecNames(t *testing.T) {
	want := []string{"bench", "bench-gate", "driver", "gate", "lb", "lock", "trust"}
	if got := JobspecNames(); !slices.Equal(got, want) {
		t.Errorf("templates %q, want %q", got, want)
	}
}

// quote and list give HCL string literals that parse back to the Go strings.
func TestJobspecFuncsQuote(t *testing.T) {
	tricky := []string{"", `a"b`, `back\slash`, "new\nline\ttab", "ünï", "-marker", "x = 1 }"}
	tmpl := template.Must(template.New("t").Funcs(JobspecFuncs).Parse(
		`job {{quote .ID}} {
  one  = {{quote .One}}
  many = {{list .Many}}
}
`))
	for _, s := range tricky {
		var b strings.Builder
		if err := tmpl.Execute(&b, struct {
			ID, One string
			Many    []string
		}{s, s, tricky}); err != nil {
			t.Fatal(err)
		}
		body, id, err := ParseJobspec(b.String())
		if err != nil {
			t.Fatalf("%q: %v\n%s", s, err, b.String())
		}
		if id != s {
			t.Errorf("job label %q, want %q", id, s)
		}
		if got := literal(t, body, "one"); len(got) != 1 || got[0] != s {
			t.Errorf("one = %q, want %q", got, s)
		}
		if got := literal(t, body, "many"); !slices.Equal(got, tricky) {
			t.Errorf("many = %q, want %q", got, tricky)
		}
	}
}

// literal evaluates attribute name of body (a string or a list of strings).
func literal(t *testing.T, body *hclsyntax.Body, name string) []string {
	t.Helper()
	a := body.Attributes[name]
	if a == nil {
		t.Fatalf("no attribute %s", name)
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", name, diags)
	}
	if v.Type().IsPrimitiveType() {
		return []string{v.AsString()}
	}
	var out []string
	for _, e := range v.AsValueSlice() {
		out = append(out, e.AsString())
	}
	return out
}

// A template that does not execute panics with the template's name.
func TestJobspecPanicsOnBadData(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "jobspec lock") {
			t.Errorf("recovered %v, want a panic naming the template", r)
		}
	}()
	Jobspec("lock", struct{ ID string }{"x"})
}
