package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocsIndexListsEveryPage: docs/README.md, the manual's index, lists
// every page of docs/ with a line of scope.
func TestDocsIndexListsEveryPage(t *testing.T) {
	index, err := os.ReadFile("docs/README.md")
	if err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob("docs/*.md")
	for _, page := range pages {
		name := filepath.Base(page)
		if name == "README.md" {
			continue
		}
		if !strings.Contains(string(index), "| ["+name+"]("+name+") | ") {
			t.Errorf("docs/README.md has no row | [%s](%s) | <its scope> |", name, name)
		}
	}
}
