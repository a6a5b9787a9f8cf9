package harness

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// WaitStandbyRecords waits until at least n allocations other than holder
// have had a standby record under the lock's path for at least settle
// (<path>/standby/<alloc_id>, written as a supervisor begins to wait: what
// `lock step-down` lists), and returns them, sorted.
func (a *Agent) WaitStandbyRecords(t testing.TB, lockPath, holder string, n int, settle, timeout time.Duration) []string {
	t.Helper()
	prefix := lockPath + "/standby/"
	deadline := time.Now().Add(timeout)
	for {
		var ids []string
		metas, _, err := a.API().Variables().PrefixList(prefix, nil)
		for _, m := range metas {
			if id := strings.TrimPrefix(m.Path, prefix); id != holder && time.Since(time.Unix(0, m.ModifyTime)) >= settle {
				ids = append(ids, id)
			}
		}
		if err == nil && len(ids) >= n {
			slices.Sort(ids)
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d standby records under %s within %s (%v), want %d besides holder %s", len(ids), prefix, timeout, err, n, holder)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
