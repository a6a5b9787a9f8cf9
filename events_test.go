package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/events"
)

// eventArg is, for each function that emits a task event (or builds one
// to emit), the index of its argument that holds the message; -1 for the
// Event itself.
var eventArg = map[string]int{
	"emit":          -1, // (*shim.Supervisor).emit(Event)
	"notify":        -1, // (*shim.Supervisor).notify(Event)
	"held":          1,  // held(State, msg)
	"stoppingEvent": 1,  // stoppingEvent(lease, msg)
	"emitEvent":     1,  // (*driver.Driver).emitEvent(cfg, msg, annotations)
	"note":          0,  // (*driver.publisher).note(msg)
}

// TestEventTextsHaveOneHome: no task event's text is built outside the
// constructors in shim/events.go and driver/events.go, which the docs and
// TestEventsDocumented follow. It fails when a message handed to an emit
// (or an Event's Message) holds a literal or a Sprintf, and
// when a string literal outside those files begins like an event.
func TestEventTextsHaveOneHome(t *testing.T) {
	var prefixes []string
	for _, k := range events.All() {
		if len(k.Prefix) >= 8 {
			prefixes = append(prefixes, k.Prefix)
		}
	}
	if len(prefixes) < 40 {
		t.Fatalf("only %d kinds of events declared: are shim and driver linked in?", len(prefixes))
	}
	var files []string
	for _, dir := range []string{"shim", "driver", "shim/cmd/lock", "lbhook", "lockclient"} {
		m, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") || filepath.Base(path) == "events.go" {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		inEmitter := strings.HasPrefix(path, "shim/") || strings.HasPrefix(path, "driver/")
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if n.Kind != token.STRING {
					break
				}
				s, err := strconv.Unquote(n.Value)
				if err != nil {
					break
				}
				for _, p := range prefixes {
					if strings.HasPrefix(s, p) {
						t.Errorf("%s: a literal begins like the event %q: word it in events.go", fset.Position(n.Pos()), p)
					}
				}
			case *ast.CallExpr:
				if !inEmitter {
					break
				}
				i, ok := eventArg[funcName(n.Fun)]
				if !ok {
					break
				}
				checked++
				if i < 0 {
					if len(n.Args) == 1 {
						if lit, ok := n.Args[0].(*ast.CompositeLit); ok {
							checkMessageField(t, fset, lit)
						}
					}
				} else if i < len(n.Args) {
					checkMessage(t, fset, n.Args[i])
				}
			case *ast.CompositeLit:
				if inEmitter && isEventType(n.Type) {
					checkMessageField(t, fset, n)
				}
			}
			return true
		})
	}
	if checked < 40 {
		t.Errorf("found only %d calls that emit events: is the scan broken?", checked)
	}
}

func funcName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}

func isEventType(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name == "Event"
	case *ast.SelectorExpr:
		return e.Sel.Name == "Event"
	}
	return false
}

func checkMessageField(t *testing.T, fset *token.FileSet, lit *ast.CompositeLit) {
	for _, el := range lit.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok && funcName(kv.Key) == "Message" {
			checkMessage(t, fset, kv.Value)
		}
	}
}

// checkMessage fails if e builds text: a string literal (alone or
// concatenated), or a call of fmt's.
func checkMessage(t *testing.T, fset *token.FileSet, e ast.Expr) {
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if n.Kind == token.STRING {
				t.Errorf("%s: an event's text built here (%s): add a constructor to events.go", fset.Position(n.Pos()), n.Value)
			}
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && x.Name == "fmt" {
				t.Errorf("%s: an event's text formatted here (fmt.%s): add a constructor to events.go", fset.Position(n.Pos()), n.Sel.Name)
			}
		}
		return true
	})
}
