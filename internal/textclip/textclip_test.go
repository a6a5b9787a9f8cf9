package textclip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClipKeepsShortTextWhole(t *testing.T) {
	for _, s := range []string{"", "Apply failed {(500) - agent down}, REVERT OK.", strings.Repeat("é", 200)} {
		if got := Clip(s, 400); got != s {
			t.Errorf("Clip(%q) = %q, want it unchanged", s, got)
		}
	}
}

func TestClipBoundsLongTextAndMarksTheCut(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"ascii, 1 MiB", strings.Repeat("x", 1<<20)},
		{"multi-byte runes across the cut", strings.Repeat("日本語", 1000)},
		{"invalid UTF-8", strings.Repeat("a\xff", 1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Clip(tc.in, 400)
			if len(got) > 400 {
				t.Errorf("len %d, want at most 400", len(got))
			}
			if !utf8.ValidString(got) {
				t.Errorf("not valid UTF-8: %q", got)
			}
			if !strings.HasSuffix(got, "bytes)") || !strings.Contains(got, "…(cut from ") {
				t.Errorf("%q: want the cut marked", got[max(0, len(got)-60):])
			}
			if len(got) < 300 {
				t.Errorf("len %d: the mark should leave most of the room to the text", len(got))
			}
		})
	}
}

func TestClipWithNoRoomForTextGivesTheMark(t *testing.T) {
	if got := Clip(strings.Repeat("x", 100), 5); !strings.HasPrefix(got, "…(cut from 100 bytes)") {
		t.Errorf("got %q", got)
	}
}
