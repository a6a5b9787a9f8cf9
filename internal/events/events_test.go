package events

import "testing"

// Classify finds a message's kind by the longest prefix, and refuses to
// guess between two kinds of the same prefix.
func TestClassify(t *testing.T) {
	short := New("test-lost", "Test lost: ")
	long := New("test-lost-watchdog", "Test lost: watchdog killed ")
	New("test-removed-a", "Test removed ")
	New("test-removed-b", "Test removed ")
	tests := []struct {
		msg  string
		want Kind
		ok   bool
	}{
		{"Test lost: no renew", short, true},
		{"Test lost: watchdog killed the workload", long, true},
		{"Test removed 10.0.0.1:80", Kind{}, false},
		{"Something else", Kind{}, false},
	}
	for _, tc := range tests {
		got, ok := Classify(tc.msg)
		if ok != tc.ok || ok && got.ID != tc.want.ID {
			t.Errorf("Classify(%q) = %s, %v; want %s, %v", tc.msg, got.ID, ok, tc.want.ID, tc.ok)
		}
	}
}
