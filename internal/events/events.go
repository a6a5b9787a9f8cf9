// Package events is the list of every task event an operator can see: each
// kind of event is declared once, by the package that emits it (shim and
// driver, in their events.go), with a stable identifier and the fixed text
// every message of the kind begins with. docs/troubleshooting.md lists each
// such text with what it means and what to do; a test holds the two
// together, and another that no event text is built anywhere else.
package events

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
)

// Kind is one kind of task event.
type Kind struct {
	// ID names the kind, stably: "lock-lost", "lb-add-failed".
	ID string
	// Prefix is the fixed text every message of the kind begins with.
	Prefix string
	// Package is the directory of the package that declared it: "shim".
	Package string
}

var (
	mu    sync.Mutex
	kinds []Kind
)

// New declares a kind of event; call it from a package-level var.
func New(id, prefix string) Kind {
	k := Kind{ID: id, Prefix: prefix}
	if _, file, _, ok := runtime.Caller(1); ok {
		k.Package = filepath.Base(filepath.Dir(file))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, o := range kinds {
		if o.ID == id {
			panic("events: kind " + id + " declared twice")
		}
	}
	kinds = append(kinds, k)
	return k
}

// Text is a message of the kind: its prefix, then format and args as
// fmt.Sprintf words them.
func (k Kind) Text(format string, args ...any) string {
	if format == "" && len(args) == 0 {
		return k.Prefix
	}
	return k.Prefix + fmt.Sprintf(format, args...)
}

// All lists every kind declared by the packages linked in.
func All() []Kind {
	mu.Lock()
	defer mu.Unlock()
	return append([]Kind(nil), kinds...)
}

// Doc is a page that lists events: in a Markdown table whose first column
// holds, in backquotes, how an event's text begins, and whose other
// columns say what it means and what to do. In a listed text, <name>
// stands for a value and … for any text.
type Doc struct{ rows []docRow }

type docRow struct {
	line     int
	patterns []*regexp.Regexp
	spans    []string
	complete bool // a meaning and an action
}

// ParseDoc reads the tables of a Markdown page.
func ParseDoc(text string) Doc {
	var d Doc
	span := regexp.MustCompile("`([^`]+)`")
	placeholder := regexp.MustCompile(`<[^<>]+>|…`)
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		r := docRow{line: i + 1, complete: len(cells) >= 3}
		for _, c := range cells[1:] {
			if strings.TrimSpace(c) == "" {
				r.complete = false
			}
		}
		for _, m := range span.FindAllStringSubmatch(cells[0], -1) {
			var re strings.Builder
			re.WriteString("^")
			rest := m[1]
			last := 0
			for _, loc := range placeholder.FindAllStringIndex(rest, -1) {
				re.WriteString(regexp.QuoteMeta(rest[last:loc[0]]))
				if rest[loc[0]:loc[1]] == "…" {
					re.WriteString(`(?s:.*?)`) // any text
				} else {
					re.WriteString(`(?s:.+?)`) // a value
				}
				last = loc[1]
			}
			re.WriteString(regexp.QuoteMeta(rest[last:]))
			r.patterns = append(r.patterns, regexp.MustCompile(re.String()))
			r.spans = append(r.spans, rest)
		}
		d.rows = append(d.rows, r)
	}
	return d
}

// Check reports what the page lacks for kind k, of which examples are
// renderings: each example must begin as a listed text that begins with
// k's prefix, in a row that says what it means and what to do.
func (d Doc) Check(k Kind, examples []string) []string {
	var problems []string
	if len(examples) == 0 {
		return []string{fmt.Sprintf("event %s (%q): no example rendering", k.ID, k.Prefix)}
	}
	prefix := strings.TrimRight(k.Prefix, " ")
	for _, ex := range examples {
		if !strings.HasPrefix(ex, k.Prefix) {
			problems = append(problems, fmt.Sprintf("event %s: example %q does not begin with its prefix %q", k.ID, ex, k.Prefix))
			continue
		}
		found := false
		for _, r := range d.rows {
			for i, p := range r.patterns {
				if !strings.HasPrefix(r.spans[i], prefix) || !p.MatchString(ex) {
					continue
				}
				if !r.complete {
					problems = append(problems, fmt.Sprintf("event %s: line %d lists it without what it means and what to do", k.ID, r.line))
				}
				found = true
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("event %s: no table row lists how %q begins", k.ID, ex))
		}
	}
	return problems
}

// CheckPackage checks page (a Markdown file) against every kind declared
// by the package in directory pkg, with examples by kind ID (Doc.Check);
// it also reports examples of kinds that pkg does not declare. It returns
// what is wrong, nothing if all is well.
func CheckPackage(page, pkg string, examples map[string][]string) []string {
	text, err := os.ReadFile(page)
	if err != nil {
		return []string{err.Error()}
	}
	doc := ParseDoc(string(text))
	var problems []string
	n := 0
	seen := map[string]bool{}
	for _, k := range All() {
		if k.Package != pkg {
			continue
		}
		n++
		seen[k.ID] = true
		problems = append(problems, doc.Check(k, examples[k.ID])...)
	}
	for id := range examples {
		if !seen[id] {
			problems = append(problems, fmt.Sprintf("example for %s, which is not a kind of event declared in %s", id, pkg))
		}
	}
	if n == 0 {
		problems = append(problems, "no kind of event declared in "+pkg)
	}
	return problems
}

// Classify is the kind msg is of: the kind whose prefix is the longest that
// msg begins with. ok is false when none matches, or when two kinds share
// that prefix (the text alone cannot tell them apart).
func Classify(msg string) (k Kind, ok bool) {
	mu.Lock()
	defer mu.Unlock()
	best := -1
	for _, c := range kinds {
		if !strings.HasPrefix(msg, c.Prefix) {
			continue
		}
		switch {
		case len(c.Prefix) > best:
			k, ok, best = c, true, len(c.Prefix)
		case len(c.Prefix) == best:
			ok = false
		}
	}
	return k, ok
}
