// Package loadavg reads the machine's load averages, which the test
// summaries and the benchmark report print beside their times: other work
// on the machine shows up there.
package loadavg

import (
	"os"
	"strings"
)

// Read returns /proc/loadavg's 1, 5 and 15 minute averages, e.g.
// "2.10 1.95 1.40", or "unknown".
func Read() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
