package hclsnippet

import (
	"regexp"
	"strings"
)

// Block is one fenced code block of a Markdown file.
type Block struct {
	File string
	Line int    // of the opening fence, counted from 1
	Lang string // the fence's info string up to its first space ("" if none)
	Text string // the lines between the fences, the fence's indentation removed
}

// MarkdownBlocks returns the fenced code blocks (``` or ~~~) of a Markdown
// file, in order. An unclosed fence runs to the end of the file, as in
// CommonMark.
func MarkdownBlocks(file, src string) []Block {
	var (
		blocks []Block
		cur    *Block
		fence  string
		indent string
		body   []string
	)
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			if f := fenceOf(trimmed); f != "" && len(line)-len(trimmed) < 4 {
				info := strings.TrimSpace(strings.TrimLeft(trimmed, f[:1]))
				lang, _, _ := strings.Cut(info, " ")
				cur, fence, indent, body = &Block{File: file, Line: i + 1, Lang: lang}, f, line[:len(line)-len(trimmed)], nil
			}
			continue
		}
		if f := fenceOf(trimmed); f != "" && strings.HasPrefix(f, fence) && strings.TrimSpace(strings.TrimLeft(trimmed, f[:1])) == "" {
			cur.Text = strings.Join(body, "\n")
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		body = append(body, strings.TrimPrefix(line, indent))
	}
	if cur != nil {
		cur.Text = strings.Join(body, "\n")
		blocks = append(blocks, *cur)
	}
	return blocks
}

// fenceOf returns the run of ` or ~ (three or more) that opens line, or "".
func fenceOf(line string) string {
	for _, c := range "`~" {
		n := 0
		for n < len(line) && rune(line[n]) == c {
			n++
		}
		if n >= 3 {
			return line[:n]
		}
	}
	return ""
}

var codeSpan = regexp.MustCompile("`([^`\n]+)`")

// InlineCode returns the code spans (`...`) of a Markdown file's prose,
// outside its fenced blocks, each as a Block with no Lang.
func InlineCode(file, src string) []Block {
	inFence := map[int]bool{}
	lines := strings.Split(src, "\n")
	for _, b := range MarkdownBlocks(file, src) {
		for i := b.Line; i <= b.Line+strings.Count(b.Text, "\n")+1 && i <= len(lines); i++ {
			inFence[i] = true
		}
	}
	var spans []Block
	for i, line := range lines {
		if inFence[i+1] {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			spans = append(spans, Block{File: file, Line: i + 1, Text: m[1]})
		}
	}
	return spans
}
