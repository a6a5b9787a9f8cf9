package harness

import "testing"

func TestInSmoke(t *testing.T) {
	marked := map[string][]string{
		"TestWhole":            nil,
		"TestSome":             {"handover", "crash"},
		"TestSome/crash/deep":  nil,
		"TestNested/group":     {"row"},
		"TestNested/group/row": nil,
	}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"TestWhole", true},
		{"TestWhole/any/depth", true},
		{"TestSome", true},
		{"TestSome/handover", true},
		{"TestSome/handover/inner", true},
		{"TestSome/crash", true},
		{"TestSome/other", false},
		{"TestSome/other/inner", false},
		{"TestNested", false},
		{"TestNested/group/row", true},
		{"TestNested/group/other", false},
		{"TestUnmarked", false},
		{"TestWholeX", false},
	} {
		if got := inSmoke(marked, tc.name); got != tc.want {
			t.Errorf("inSmoke(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
