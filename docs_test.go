package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks: every relative link in README.md and docs/*.md names a
// file or directory of the repository and, for a Markdown file, an anchor
// that one of its headings (or an explicit <a id>) produces under GitHub's
// rules. A section renamed or moved without its links fails it.
func TestDocLinks(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"README.md"}, pages...)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := githubAnchors(string(text))
		anchors[path] = a
		return a
	}
	links := 0
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range markdownLinks(string(text)) {
			target := l.target
			if i := strings.IndexAny(target, " \t"); i >= 0 { // [x](path "title")
				target = target[:i]
			}
			if target == "" || regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`).MatchString(target) {
				continue // absolute URL, mailto:
			}
			links++
			file, anchor, _ := strings.Cut(target, "#")
			dest := page
			if file != "" {
				dest = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", page, l.line, l.target, dest)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s:%d: link %q: an anchor into a file that is not Markdown", page, l.line, l.target)
				continue
			}
			if !anchorsOf(dest)[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading whose anchor is #%s", page, l.line, l.target, dest, anchor)
			}
		}
	}
	for _, page := range pages[1:] {
		if !opensWithTOC(page) {
			t.Errorf("%s does not open with a table of contents (a list of links to its sections before its first section)", page)
		}
	}
	if links < 20 {
		t.Errorf("found only %d relative links in %d pages: is the link parser broken?", links, len(pages))
	}
}

// TestCodeCitesDocs: every docs/<page>.md[#anchor] that a Go, HCL or shell
// file of the repository cites (code comments cite the manual by section)
// names a page and a heading that exist.
func TestCodeCitesDocs(t *testing.T) {
	cite := regexp.MustCompile(`docs/[a-z0-9-]+\.md(#[a-z0-9_-]+)?`)
	cited := 0
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "dist", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".hcl", ".sh":
		default:
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range cite.FindAllString(string(text), -1) {
			cited++
			file, anchor, _ := strings.Cut(m, "#")
			page, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("%s cites %s: %v", path, m, err)
				continue
			}
			if anchor != "" && !githubAnchors(string(page))[anchor] {
				t.Errorf("%s cites %s: %s has no heading whose anchor is #%s", path, m, file, anchor)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cited == 0 {
		t.Error("no file cites docs/: is the walk broken?")
	}
}

// opensWithTOC: the page lists links to its own sections before its first
// "## " heading.
func opensWithTOC(page string) bool {
	text, err := os.ReadFile(page)
	if err != nil {
		return false
	}
	head, _, _ := strings.Cut(string(text), "\n## ")
	return regexp.MustCompile(`(?m)^\s*- \[[^\]]+\]\(#[^)]+\)$`).MatchString(head)
}

type mdLink struct {
	target string
	line   int
}

var (
	fenceRE      = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpanRE   = regexp.MustCompile("`+[^`]*`+")
	inlineLinkRE = regexp.MustCompile(`\]\(([^()\s]*(?:\([^()]*\)[^()\s]*)*(?:\s+"[^"]*")?)\)`)
	headingRE    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	explicitRE   = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	mdLinkTextRE = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTagRE    = regexp.MustCompile(`<[^>]*>`)
)

// markdownLinks lists the inline links of a Markdown text, outside fenced
// code blocks and code spans.
func markdownLinks(text string) []mdLink {
	var out []mdLink
	inFence := false
	for i, line := range strings.Split(text, "\n") {
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		line = codeSpanRE.ReplaceAllString(line, "")
		for _, m := range inlineLinkRE.FindAllStringSubmatch(line, -1) {
			out = append(out, mdLink{target: m[1], line: i + 1})
		}
	}
	return out
}

// githubAnchors is the set of anchors GitHub gives a Markdown file: one
// per heading (its text lower-cased, punctuation dropped, spaces turned
// into hyphens, repeats numbered -1, -2, ...) and any <a id="...">.
func githubAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range explicitRE.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := githubSlug(m[1])
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// githubSlug turns a heading's Markdown into its anchor, as GitHub does.
func githubSlug(heading string) string {
	heading = mdLinkTextRE.ReplaceAllString(heading, "$1")
	// HTML tags go, but not a code span's text, which is shown as is.
	var text strings.Builder
	last := 0
	for _, m := range codeSpanRE.FindAllStringIndex(heading, -1) {
		text.WriteString(htmlTagRE.ReplaceAllString(heading[last:m[0]], ""))
		text.WriteString(heading[m[0]:m[1]])
		last = m[1]
	}
	text.WriteString(htmlTagRE.ReplaceAllString(heading[last:], ""))
	heading = text.String()
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// The slugs of headings this repository uses, as GitHub renders them.
func TestGitHubSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Quick start": "quick-start",
		"`lock [flags] <path> <command> [args...]`":    "lock-flags-path-command-args",
		`How the lease keeps "never two at once"`:      "how-the-lease-keeps-never-two-at-once",
		"Gating other tasks (docker, exec, raw_exec)":  "gating-other-tasks-docker-exec-raw_exec",
		"Load balancer (Baragon-style LB API)":         "load-balancer-baragon-style-lb-api",
		"The `singleton` task driver":                  "the-singleton-task-driver",
		"Security: who is trusted":                     "security-who-is-trusted",
		"1. Graceful handover":                         "1-graceful-handover",
		"A real load balancer: HAProxy":                "a-real-load-balancer-haproxy",
		"Links to [the manual](manual.md) and `code`":  "links-to-the-manual-and-code",
		"What `lock` does — and what it does not (2×)": "what-lock-does--and-what-it-does-not-2",
	} {
		if got := githubSlug(heading); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", heading, got, want)
		}
	}
	a := githubAnchors("# A\n## A\n```\n# A\n```\n### A\n")
	for _, want := range []string{"a", "a-1", "a-2"} {
		if !a[want] {
			t.Errorf("githubAnchors: no %q in %v", want, a)
		}
	}
	if a["a-3"] {
		t.Errorf("githubAnchors counted a heading inside a code block: %v", a)
	}
}
