// Package hclsnippet keeps the HCL that an error message or a task event
// tells the user to write, so that a test can parse each snippet with
// Nomad's own parsers: a message that names a fix must name one that works.
//
// A package declares each snippet once, as a package-level variable set by
// Task, Policy or Fragment, and builds its messages from that variable. The
// root module's TestHCLSnippets parses every registered snippet and fails on
// any HCL-looking string literal in the product's sources that is not
// registered.
package hclsnippet

import (
	"fmt"
	"sync"
)

// Where says where a snippet goes, and so which parser checks it.
type Where int

const (
	// InTask: blocks and arguments of a task block in a jobspec (HCL 2,
	// Nomad's jobspec parser).
	InTask Where = iota
	// InPolicy: a Nomad ACL policy (HCL 1, Nomad's ACL policy parser).
	InPolicy
	// InFragment: an HCL expression or body that fits no whole file, such
	// as an attribute's value; checked as HCL syntax only.
	InFragment
)

func (w Where) String() string {
	switch w {
	case InTask:
		return "task"
	case InPolicy:
		return "ACL policy"
	case InFragment:
		return "fragment"
	}
	return fmt.Sprintf("Where(%d)", int(w))
}

// Snippet is one registered piece of HCL.
type Snippet struct {
	Where Where
	// Format is the text as the messages use it; it may hold fmt verbs
	// that the message fills.
	Format string
	// Example fills Format's verbs for the test.
	Example []any
}

// Text is the snippet as a user would read it, Format filled with Example.
func (s Snippet) Text() string {
	if len(s.Example) == 0 {
		return s.Format
	}
	return fmt.Sprintf(s.Format, s.Example...)
}

var (
	mu       sync.Mutex
	registry []Snippet
)

func register(w Where, format string, example []any) string {
	mu.Lock()
	defer mu.Unlock()
	registry = append(registry, Snippet{Where: w, Format: format, Example: example})
	return format
}

// Task registers HCL that goes into a task block and returns format.
// example fills its fmt verbs, if it has any.
func Task(format string, example ...any) string { return register(InTask, format, example) }

// Policy registers a Nomad ACL policy and returns format.
func Policy(format string, example ...any) string { return register(InPolicy, format, example) }

// Fragment registers HCL that is checked as syntax only and returns format.
func Fragment(format string, example ...any) string { return register(InFragment, format, example) }

// All returns every snippet registered by the packages linked into this
// binary.
func All() []Snippet {
	mu.Lock()
	defer mu.Unlock()
	return append([]Snippet(nil), registry...)
}
