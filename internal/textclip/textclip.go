// Package textclip bounds text that reaches a task event, a status file or a
// log line from a source we do not control (an LB's answer), so that no
// such source can fill Nomad's Raft log or a file the plugin must read.
package textclip

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Clip returns s as valid UTF-8 of at most max bytes. A longer s keeps its
// first bytes, cut at a rune boundary, and ends in a mark that says it was
// cut and how long it was, so that a reader never takes it for the whole.
// The mark is included in max; a max too small for it returns the mark
// alone.
func Clip(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= max {
		return s
	}
	mark := "…(cut from " + strconv.Itoa(len(s)) + " bytes)"
	keep := max - len(mark)
	if keep <= 0 {
		return mark
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + mark
}
