package reconciler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// limits.volumes holds for every way a volume enters the store: the API,
// a claim, someone else's state run (adoption), and a Volume object
// written straight into the store (kubectl).
func TestOneLimitForEveryWayIn(t *testing.T) {
	g := newRig(t, Options{MaxVolumes: 2})
	for _, n := range []string{"a", "b"} {
		_, err := g.r.Requests.Create(context.Background(), sparseSpec(n))
		require.NoError(t, err)
	}
	var le *requests.LimitError
	_, err := g.r.Requests.Create(context.Background(), sparseSpec("c"))
	require.ErrorAs(t, err, &le)
	assert.Contains(t, err.Error(), "holds 2 volumes, its limit (limits.volumes)")
	_, err = g.r.Requests.Provision(context.Background(), sparseSpec("claimed"), &saltvolumes.Claim{Namespace: "ns", Name: "data"})
	require.ErrorAs(t, err, &le)

	g.send(ret("20261126111111111111", "node-1", 0, preparedByHand(t, "by-hand")))
	require.Eventually(t, func() bool { return g.r.Requests.Refused.Adoption.Value() == 1 }, 5*time.Second, 10*time.Millisecond)
	_, err = g.store.Get("by-hand")
	assert.ErrorIs(t, err, store.ErrNotFound, "adopted over the limit")

	// A Volume object: in the store before anyone asked.
	obj := &volume.Volume{Spec: *sparseSpec("object"), CreatedAt: time.Now().UTC()}
	require.NoError(t, g.store.Create(context.Background(), obj))
	v := g.until("object", "Failed")
	assert.Equal(t, ReasonLimit, v.Status.Reason)
	assert.Contains(t, v.Status.Message, "limits.volumes")
	for _, c := range g.salt.launches() {
		assert.NotContains(t, fmt.Sprint(c), "object", "a job ran for a volume over the limit")
	}
	assert.Equal(t, map[string]int64{"api": 1, "claim": 1, "adoption": 1, "object": 1}, g.r.Requests.Refused.Values())

	// The first two keep their place: they were not failed by the third.
	for _, n := range []string{"a", "b"} {
		got, err := g.store.Get(n)
		require.NoError(t, err)
		assert.NotEqual(t, volume.Failed, got.Status.Phase, n)
	}
	// Deleting the refused object needs no job on its node.
	_, err = g.r.Requests.Delete(context.Background(), "object", false)
	require.NoError(t, err)
	g.until("object", store.Deleted)
}

// Job returns of runs not ours are hints that cost a lookup and a
// reconcile per volume name: a return naming more than MaxHintNames, or
// names past the rate, are dropped and counted; our own runs are not
// metered.
func TestForeignHintsAreBounded(t *testing.T) {
	g := newRig(t, Options{HintNamesPerSecond: 10}) // bursts of 40 names
	many := func(n int, prefix string) map[string]any {
		r := map[string]any{}
		for i := range n {
			for k, v := range stateRet(fmt.Sprintf("%s-%d", prefix, i), "prepared", true, "", nil) {
				r[k] = v
			}
		}
		return r
	}
	flood := func() int64 { return g.r.Metrics.Rejected.Flood.Value() }
	lookups := func() int64 { return g.r.Metrics.Lookups.Value() }
	g.send(ret("20261126222222222221", "node-1", 0, many(MaxHintNames+1, "huge")))
	require.Eventually(t, func() bool { return flood() == 1 }, 5*time.Second, time.Millisecond, "a return naming more than MaxHintNames")
	g.send(ret("20261126222222222222", "node-1", 0, many(30, "first")))
	require.Eventually(t, func() bool { return lookups() > 0 }, 5*time.Second, time.Millisecond, "30 names fit the burst and are looked up")
	g.send(ret("20261126222222222223", "node-1", 0, many(30, "second")))
	require.Eventually(t, func() bool { return flood() == 2 }, 5*time.Second, time.Millisecond, "30 more within the same second do not")

	// Our own runs are never metered: a create still goes through.
	_, err := g.r.Requests.Create(context.Background(), sparseSpec("ours"))
	require.NoError(t, err)
	v := g.until("ours", "Pending")
	s := sparseSpec("ours")
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("ours", "prepared", true, "", device(s))))
	g.until("ours", "Available")
	assert.EqualValues(t, 2, g.r.Metrics.Rejected.Flood.Value())
}

// A return of ours that comes before the publish is answered looks like
// someone else's run; dropped by the hint limits, it is still remembered
// and settles the volume once the job is registered.
func TestOurEarlyReturnSurvivesTheHintLimits(t *testing.T) {
	g := newRig(t, Options{HintNamesPerSecond: 1}) // bursts of 4 names
	// Spend the burst.
	g.send(ret("20261126444444444441", "node-1", 0, stateRet("a", "absent", true, "", nil)))
	for i := range 4 {
		g.send(ret(fmt.Sprintf("2026112644444444445%d", i), "node-1", 0, stateRet(fmt.Sprintf("x-%d", i), "absent", true, "", nil)))
	}
	require.Eventually(t, func() bool { return g.r.Metrics.Rejected.Flood.Value() > 0 }, 5*time.Second, time.Millisecond)
	s := sparseSpec("early-ok")
	g.salt.onLaunch = func(jid string, _ call) {
		ev := ret(jid, "node-1", 0, stateRet("early-ok", "prepared", true, "", device(s)))
		g.record(ev)
		before := g.r.Metrics.Rejected.Flood.Value()
		g.r.Handle(ev)
		assert.Equal(t, before+1, g.r.Metrics.Rejected.Flood.Value(), "the early return was not metered: the test proves nothing")
	}
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	g.until("early-ok", "Available")
}
