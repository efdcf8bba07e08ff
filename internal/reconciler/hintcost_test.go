package reconciler

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A forged return naming ten made-up volumes under a jid Salt never saw
// (#48 item 17): its names share each lookup of the job, first try and
// retries alike, instead of each reading the job cache on its own.
func TestHintsOfOneJobShareTheirLookups(t *testing.T) {
	g := newRig(t, Options{})
	require.Eventually(t, func() bool {
		g.r.mu.Lock()
		defer g.r.mu.Unlock()
		return g.r.term != nil
	}, 5*time.Second, time.Millisecond, "the rig reconciles (hints reach only a leader)")
	r := map[string]any{}
	for i := range 10 {
		for k, v := range stateRet(fmt.Sprintf("made-up-%d", i), "prepared", true, "", nil) {
			r[k] = v
		}
	}
	g.r.Handle(ret("20261127191919191919", "node-1", 0, r)) // on the bus only: the job cache never saw it
	require.Eventually(t, func() bool { return g.r.Metrics.Rejected.Unconfirmed.Value() == 10 }, 5*time.Second, time.Millisecond,
		"every name dropped once Salt's job cache did not confirm it")
	t.Logf("job lookups for one forged return of 10 names: %d", g.r.Metrics.Lookups.Value())
	// One per try when the names' retries come together (3 here, alone);
	// a loaded machine spreads their timers, so a few more may start.
	// Each name on its own was 21.
	assert.LessOrEqual(t, g.r.Metrics.Lookups.Value(), int64(9), "the ten names share their lookups")
}
