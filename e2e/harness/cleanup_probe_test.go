package harness

import "testing"

func TestAgentProbe(t *testing.T) {
	for argv, want := range map[string]bool{
		"java -version":                true,
		"/usr/bin/java -version":       true,
		"qemu-system-x86_64 --version": true,
		"java -jar app.jar":            false,
		"/tmp/x/testworkload -version": false,
		"sleep 600":                    false,
		"java -version extra":          false,
	} {
		if got := agentProbe(argv); got != want {
			t.Errorf("agentProbe(%q) = %v, want %v", argv, got, want)
		}
	}
}
