package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// #49 item 10: a snapshot schedule made through the CLI is run by serve
// against real Salt: a snapshot per slot on the node, pruned to keep, the
// operator's own snapshot of the volume never touched; the metrics show
// its last success; removed, it takes no more and leaves what it took.
// serve's floor is lowered to 1s (snapshots.minScheduleEvery, a test
// knob) so that slots of 2s run within the test.
func TestSnapshotSchedulesFromServe(t *testing.T) {
	started := time.Now()
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	p := newPlane(t, s)
	p.Start("snapshots:\n  minScheduleEvery: 1s\n")
	c := p.Client()
	ctx := context.Background()

	_, errs, code := p.CLI("create", "sched", "--node", "node-1", "--size", "32Mi", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
	v := getJSON(t, p, "sched")
	uuids = append(uuids, v.Spec.UUID)
	_, errs, code = p.CLI("snapshot", "create", "sched", "by-hand", "--wait")
	require.Equal(t, 0, code, errs)

	// Below serve's floor: refused naming the field, nothing set.
	_, errs, code = p.CLI("snapshot", "schedule", "sched", "--every", "500ms", "--keep", "2")
	assert.Equal(t, 2, code, errs)
	assert.Contains(t, errs, "every: 500ms is shorter than the shortest interval, 1s")

	out, errs, code = p.CLI("snapshot", "schedule", "sched", "--every", "2s", "--keep", "2", "-o", "json")
	require.Equal(t, 0, code, errs)
	var sc saltvolumes.SnapshotSchedule
	require.NoError(t, json.Unmarshal([]byte(out), &sc), out)
	assert.Equal(t, "api", sc.Source)
	assert.Equal(t, "2s", sc.Every)
	assert.Equal(t, 2, sc.Keep)
	scheduled := time.Now()

	taken := func() float64 {
		n, err := p.MetricValue("salt_volumes_snapshots_taken_total")
		if err != nil {
			return -1
		}
		return n
	}
	eventually(t, 45*time.Second, "three scheduled snapshots taken", func() (bool, string) {
		n := taken()
		return n >= 4, fmt.Sprintf("taken_total %v (the one by hand included)", n)
	})
	t.Logf("three scheduled snapshots taken %s after the schedule was set", time.Since(scheduled).Round(100*time.Millisecond))

	// Slowed down (the schedule and what it owns stay): the take under
	// way ends, pruning leaves exactly keep of its own.
	_, errs, code = p.CLI("snapshot", "schedule", "sched", "--every", "1h", "--keep", "2")
	require.Equal(t, 0, code, errs)
	own := settled(t, p, "sched")
	require.Len(t, own, 2, "keep 2")
	onNode := nodeSnapshots(t, s, v.Spec.UUID)
	assert.Equal(t, append([]string{"by-hand"}, own...), onNode, "the node holds the schedule's two and the one by hand")
	hand, err := c.Snapshot(ctx, "by-hand")
	require.NoError(t, err)
	assert.Equal(t, "Ready", hand.Phase)
	assert.Empty(t, hand.Schedule)

	last := p.Metric(`salt_volumes_snapshot_schedule_last_success_timestamp_seconds{volume="sched",schedule="sched",source="api",node="node-1"}`)
	assert.InDelta(t, float64(time.Now().Unix()), last, 30, "a recent last success")
	assert.Equal(t, 0.0, p.Metric(`salt_volumes_snapshot_schedule_overdue{volume="sched",schedule="sched",source="api",node="node-1"}`))
	out, errs, code = p.CLI("snapshot", "schedules", "sched", "-o", "json")
	require.Equal(t, 0, code, errs)
	var listed struct {
		Items []saltvolumes.SnapshotSchedule
	}
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed.Items, 1, out)
	sc = listed.Items[0]
	assert.Zero(t, sc.Failures)
	assert.Contains(t, own, sc.LastSnapshot)

	// Back to 2s, then removed while it runs: what it took stays, and
	// nothing more is taken.
	before := taken()
	_, errs, code = p.CLI("snapshot", "schedule", "sched", "--every", "2s", "--keep", "2")
	require.Equal(t, 0, code, errs)
	eventually(t, 20*time.Second, "one more scheduled snapshot", func() (bool, string) {
		n := taken()
		return n > before, fmt.Sprint(n)
	})
	_, errs, code = p.CLI("snapshot", "unschedule", "sched")
	require.Equal(t, 0, code, errs)
	left := settled(t, p, "sched")
	count := taken()
	time.Sleep(5 * time.Second) // two and a half of its slots
	assert.Equal(t, count, taken(), "no snapshot taken once the schedule is gone")
	assert.Equal(t, left, settled(t, p, "sched"), "and none pruned")
	assert.Equal(t, append([]string{"by-hand"}, left...), nodeSnapshots(t, s, v.Spec.UUID))
	scheds, err := c.SnapshotSchedules(ctx, "sched", "api")
	require.NoError(t, err)
	assert.Empty(t, scheds)
	t.Logf("TestSnapshotSchedulesFromServe: %s in all", time.Since(started).Round(time.Second))
}

// settled waits until nothing of volume vol is being taken or deleted (and
// its schedule, if any, takes nothing), and returns the names of the
// snapshots its schedule took, sorted.
func settled(t *testing.T, p *plane, vol string) []string {
	t.Helper()
	c := p.Client()
	var own []string
	eventually(t, 30*time.Second, "the volume's snapshots settled", func() (bool, string) {
		items, err := c.Snapshots(context.Background(), vol)
		if err != nil {
			return false, err.Error()
		}
		scheds, err := c.SnapshotSchedules(context.Background(), vol, "api")
		if err != nil {
			return false, err.Error()
		}
		own = nil
		for _, sn := range items {
			if sn.Phase != "Ready" {
				return false, sn.Name + " " + sn.Phase
			}
			if sn.Schedule == vol {
				own = append(own, sn.Name)
			}
		}
		if len(scheds) > 0 && scheds[0].Taking != "" {
			return false, "taking " + scheds[0].Taking
		}
		return true, ""
	})
	sort.Strings(own)
	return own
}

// nodeSnapshots asks the node for a volume's snapshots, sorted by name.
func nodeSnapshots(t *testing.T, s *saltstack.Stack, uuid string) []string {
	t.Helper()
	out, code := s.SaltCall("salt_volumes.snapshots", "--out=json")
	require.Equal(t, 0, code, out)
	var res struct {
		Local []struct {
			Name       string `json:"name"`
			VolumeUUID string `json:"volumeUUID"`
		} `json:"local"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	var names []string
	for _, sn := range res.Local {
		if sn.VolumeUUID == uuid {
			names = append(names, sn.Name)
		}
	}
	sort.Strings(names)
	return names
}
