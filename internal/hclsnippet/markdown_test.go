package hclsnippet

import (
	"reflect"
	"testing"
)

func TestMarkdownBlocks(t *testing.T) {
	src := "# t\n\n```hcl\ntask \"a\" {\n}\n```\n\ntext\n\n  ```\n  indented\n    more\n  ```\n\n````sh title\n```\nnested\n````\n~~~\nopen"
	want := []Block{
		{File: "f.md", Line: 3, Lang: "hcl", Text: "task \"a\" {\n}"},
		{File: "f.md", Line: 10, Lang: "", Text: "indented\n  more"},
		{File: "f.md", Line: 15, Lang: "sh", Text: "```\nnested"},
		{File: "f.md", Line: 19, Lang: "", Text: "open"},
	}
	if got := MarkdownBlocks("f.md", src); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %#v\nwant %#v", got, want)
	}
}

func TestInlineCode(t *testing.T) {
	src := "a `x { y = 1 }` b\n```hcl\n`not prose`\n```\nc `d` and `e`"
	want := []Block{{File: "f.md", Line: 1, Text: "x { y = 1 }"}, {File: "f.md", Line: 5, Text: "d"}, {File: "f.md", Line: 5, Text: "e"}}
	if got := InlineCode("f.md", src); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %#v\nwant %#v", got, want)
	}
}
