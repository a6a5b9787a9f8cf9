package harness

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestDynamicBlocksAreExclusive: two clients never get the same block of
// the dynamic port range, a released block can be taken again, and a block
// another process holds is never handed out.
func TestDynamicBlocksAreExclusive(t *testing.T) {
	low1, high1, release1, ok1 := dynamicBlock()
	low2, high2, release2, ok2 := dynamicBlock()
	defer release2()
	if !ok1 || !ok2 {
		t.Skipf("no reservations here (%s)", reservationDir)
	}
	if low1 == low2 || high1-low1 != dynamicBlockPorts-1 || low1 < dynamicPortsLow || high2 > dynamicPortsHigh {
		t.Fatalf("blocks [%d, %d] and [%d, %d]: want two distinct blocks of %d ports in [%d, %d]",
			low1, high1, low2, high2, dynamicBlockPorts, dynamicPortsLow, dynamicPortsHigh)
	}
	name := "dynamic-" + strconv.Itoa((low1-dynamicPortsLow)/dynamicBlockPorts)
	if _, taken := reserve(name); !taken {
		t.Fatalf("%s is held, yet reserve took it again", name)
	}
	// Another process sees it held too (flock -n fails with 1).
	if out, err := exec.Command("flock", "-n", reservationDir+"/"+name, "true").CombinedOutput(); err == nil {
		t.Fatalf("another process took %s while this one held it: %s", name, out)
	} else if strings.Contains(err.Error(), "executable file not found") {
		t.Logf("no flock(1) here: %v", err)
	}
	release1()
	f, taken := reserve(name)
	if f == nil || taken {
		t.Fatalf("%s released, yet reserve did not take it (taken %v)", name, taken)
	}
	f.Close()
}
