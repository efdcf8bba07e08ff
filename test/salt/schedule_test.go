package salt

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
)

// writePillar puts doc in the master's pillar for every minion and has the
// minions read it again: a scheduled job runs with the minion's own
// pillar, not a pillar= of a call.
func writePillar(t *testing.T, s *saltstack.Stack, doc map[string]any) {
	t.Helper()
	dir := filepath.Join(s.Root, "pillar")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "top.sls"), []byte("base:\n  '*':\n    - salt_volumes\n"), 0o600))
	b, err := json.Marshal(doc) // JSON is YAML
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "salt_volumes.sls"), b, 0o600))
	out, code := s.Salt("--timeout=60", s.MinionID, "saltutil.refresh_pillar", "wait=True", "--out=json")
	require.Equal(t, 0, code, out)
}

// scheduleSnapshots are the snapshots of volume u on the node named after
// schedule (<schedule>-<14 digits>), taken, but for those in except, read
// from the node's state dir.
func scheduleSnapshots(t *testing.T, stateDir, u, schedule string, except ...string) []string {
	t.Helper()
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(schedule) + `-[0-9]{14}$`)
	recs, _ := filepath.Glob(filepath.Join(stateDir, "snapshots", u, "*.json"))
	var out []string
	for _, r := range recs {
		name := strings.TrimSuffix(filepath.Base(r), ".json")
		b, err := os.ReadFile(r)
		if err != nil || !re.MatchString(name) || slices.Contains(except, name) {
			continue
		}
		var rec struct{ Phase string }
		if json.Unmarshal(b, &rec) == nil && rec.Phase == "taken" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// TestSnapshotScheduleOnTheMinionScheduler: a snapshot schedule in pillar,
// turned into an entry of the minion's own Salt scheduler by the
// salt_volumes.scheduled formula, takes a snapshot of a real sparse volume
// every 2 s and keeps the newest 2 of its own; an operator's snapshots of
// the same volume, one of them named like the schedule's, are never
// touched; a volume its pattern matches that is not in the minion's pillar
// (prepared with a pillar= of the call, as the control plane does) is not
// snapshotted; the last success is in the node's report (status, and the
// beacon's event); a bad schedule fails the formula and changes nothing;
// a schedule taken out of pillar loses its entry.
func TestSnapshotScheduleOnTheMinionScheduler(t *testing.T) {
	began := time.Now()
	s := saltstack.StartOpts(t, binary, saltstack.Options{SaltVolumes: "beacon_interval: 1\nbeacon_heartbeat: 2"})
	t.Logf("master and minion up in %s", time.Since(began).Round(100*time.Millisecond))
	var uuids []string
	cleanupNode(t, s, &uuids)
	// The beacon's formula syncs the modules too.
	out, code := s.Salt("--timeout=60", s.MinionID, "state.apply", "salt_volumes.beacon", "--out=json", "--static")
	require.Equal(t, 0, code, out)

	u := uuid.NewString()
	uuids = append(uuids, u)
	volumes := map[string]any{"sched-vol": vol("", u, s.MinionID, nil)}
	// Matches sched-other too, which is in no pillar of the minion: by
	// default a schedule takes only the volumes of the minion's pillar.
	fast := map[string]any{"match": "sched-*", "every": "2s", "keep": 2}
	// A bad schedule first (it does not stop the volume being prepared).
	writePillar(t, s, map[string]any{"salt_volumes": map[string]any{"volumes": volumes,
		"snapshot_schedules": map[string]any{"fast": map[string]any{"volumes": []string{"sched-vol"}, "every": "2 seconds", "keep": 2}}}})
	out, code = s.Salt(s.MinionID, "state.apply", "salt_volumes.prepared", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	require.Equal(t, true, states(t, saltstack.JSON(t, out), s.MinionID)["salt_volumes sched-vol"]["result"], out)
	other := uuid.NewString()
	uuids = append(uuids, other)
	out, code = s.Salt(s.MinionID, "state.apply", "salt_volumes.prepared", "--out=json", "--static",
		saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volume": vol("sched-other", other, s.MinionID, nil)}}))
	require.Equal(t, 0, code, out)
	require.Equal(t, true, states(t, saltstack.JSON(t, out), s.MinionID)["salt_volumes sched-other"]["result"], out)
	// An operator's own snapshots: one named as the schedule names its own.
	operators := []string{"fast-20200101000000", "before-upgrade"}
	for _, name := range operators {
		out, code = s.Salt(s.MinionID, "salt_volumes.snapshot", "sched-vol", "snapshot_name="+name, "--out=json", "--static")
		require.Equal(t, 0, code, out)
		taken, _ := saltstack.JSON(t, out)[s.MinionID].(map[string]any)
		require.Equal(t, "taken", taken["phase"], out)
	}

	// The salt CLI exits 0 whatever the states did: their results say.
	apply := func() (map[string]map[string]any, int) {
		out, code := s.Salt(s.MinionID, "state.apply", "salt_volumes.scheduled", "--out=json", "--static")
		return states(t, saltstack.JSON(t, out), s.MinionID), code
	}
	// The bad schedule: the formula fails naming the field, and applies
	// nothing else.
	res, _ := apply()
	require.Len(t, res, 1, "only the failing state: nothing else is applied")
	bad := res["salt_volumes snapshot schedules"]
	assert.Equal(t, false, bad["result"])
	assert.Contains(t, bad["comment"], "salt_volumes:snapshot_schedules:fast: every: '2 seconds' is not an interval: use a whole number and a unit")

	writePillar(t, s, map[string]any{"salt_volumes": map[string]any{"volumes": volumes,
		"snapshot_schedules": map[string]any{"fast": fast}}})
	bus := s.Listen()
	res, code = apply()
	require.Equal(t, 0, code, res)
	entry := res["salt_volumes schedule salt-volumes-snapshot-fast"]
	require.NotNil(t, entry, res)
	assert.Equal(t, true, entry["result"], entry["comment"])
	assert.NotEmpty(t, entry["changes"])
	scheduled := time.Now()
	t.Logf("the schedule's entry is on the minion %s after the start", scheduled.Sub(began).Round(100*time.Millisecond))

	// Applied again: nothing changes.
	res, code = apply()
	require.Equal(t, 0, code, res)
	assert.Empty(t, res["salt_volumes schedule salt-volumes-snapshot-fast"]["changes"], "the entry is as it was")

	// The scheduler runs it every 2 s; each run takes one and prunes to 2.
	seen := map[string]bool{}
	for time.Since(scheduled) < 8*time.Second {
		for _, n := range scheduleSnapshots(t, s.StateDir, u, "fast", operators[0]) {
			seen[n] = true
		}
		time.Sleep(200 * time.Millisecond)
	}
	var now []string
	require.Eventually(t, func() bool {
		// A run may be between its take and its prune: 3 for a moment.
		now = scheduleSnapshots(t, s.StateDir, u, "fast", operators[0])
		for _, n := range now {
			seen[n] = true
		}
		return len(now) == 2
	}, 10*time.Second, 100*time.Millisecond, "exactly 2 of the schedule's own snapshots: %v", now)
	var taken []string
	for n := range seen {
		taken = append(taken, n)
	}
	sort.Strings(taken)
	t.Logf("the schedule took %d snapshots in %s, keeps %v", len(taken), time.Since(scheduled).Round(time.Second), now)
	require.GreaterOrEqual(t, len(taken), 3, "it ran at least 3 times, so it pruned")
	assert.NotContains(t, now, taken[0], "the oldest of its own went")
	for _, name := range operators {
		_, err := os.Stat(filepath.Join(s.StateDir, "snapshots", u, name+".json"))
		assert.NoError(t, err, "the operator's snapshot %s is untouched", name)
	}
	assert.Empty(t, scheduleSnapshots(t, s.StateDir, other, "fast"), "sched-other is in no pillar of the minion: not snapshotted")
	// A run by hand (the id read from the Salt schedule entry) says why.
	var byHand map[string]any
	require.Eventually(t, func() bool {
		out, code := s.Salt(s.MinionID, "salt_volumes.run_snapshot_schedule", "fast", "--out=json", "--static")
		byHand, _ = saltstack.JSON(t, out)[s.MinionID].(map[string]any)
		return code == 0 && byHand["snapshot"] != nil // not while a scheduled run is going
	}, 20*time.Second, 500*time.Millisecond, "a run by hand: %v", byHand)
	skipped, _ := byHand["skipped"].([]any)
	require.Len(t, skipped, 1, byHand)
	assert.Equal(t, "sched-other", skipped[0].(map[string]any)["volume"])
	assert.Contains(t, skipped[0].(map[string]any)["reason"], "set any_volume: true")

	// The last success, in the node's report.
	out, code = s.Salt(s.MinionID, "salt_volumes.status", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	var status struct {
		SnapshotSchedules []map[string]any `json:"snapshotSchedules"`
	}
	raw, _ := json.Marshal(saltstack.JSON(t, out)[s.MinionID])
	require.NoError(t, json.Unmarshal(raw, &status))
	require.Len(t, status.SnapshotSchedules, 1, out)
	row := status.SnapshotSchedules[0]
	assert.Equal(t, "fast", row["schedule"])
	assert.Equal(t, "sched-vol", row["volume"])
	assert.Equal(t, u, row["uuid"])
	assert.Equal(t, false, row["failing"], row["lastError"])
	last, err := time.Parse(time.RFC3339, row["lastSuccess"].(string))
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now(), last, 6*time.Second, "a success within the last runs")
	assert.Regexp(t, `^fast-[0-9]{14}$`, row["lastSnapshot"])

	// And in the beacon's event (a heartbeat every 2 s).
	var lastHealth any
	_, ok := bus.Collect(15*time.Second, func(e saltstack.Event) bool {
		if e.Tag != "salt-volumes/node/"+s.MinionID+"/health" {
			return false
		}
		d, _ := e.Data["data"].(map[string]any)
		lastHealth = d["snapshotSchedules"]
		rows, _ := d["snapshotSchedules"].([]any)
		if len(rows) != 1 {
			return false
		}
		r, _ := rows[0].(map[string]any)
		return r["schedule"] == "fast" && r["uuid"] == u && r["lastSuccess"] != nil
	})
	assert.True(t, ok, "the beacon's report carries the schedule's last success; the last health event had %v", lastHealth)

	// Out of pillar: its entry goes, and with it its line in the report;
	// its snapshots stay; nothing more is taken.
	writePillar(t, s, map[string]any{"salt_volumes": map[string]any{"volumes": volumes}})
	res, code = apply()
	require.Equal(t, 0, code, res)
	gone := res["salt_volumes schedule salt-volumes-snapshot-fast absent"]
	require.NotNil(t, gone, res)
	assert.NotEmpty(t, gone["changes"])
	retired := res["salt_volumes schedule salt-volumes-snapshot-fast retired"]
	require.NotNil(t, retired, res)
	assert.Equal(t, true, retired["result"], retired["comment"])
	out, code = s.Salt(s.MinionID, "schedule.list", "show_all=True", "return_yaml=False", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	assert.NotContains(t, out, "salt-volumes-snapshot-fast")
	out, code = s.Salt(s.MinionID, "salt_volumes.snapshot_schedule_status", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	assert.Empty(t, saltstack.JSON(t, out)[s.MinionID], "no longer reported")
	// A run started before the pillar changed ended long since.
	kept := scheduleSnapshots(t, s.StateDir, u, "fast", operators[0])
	time.Sleep(3 * time.Second)
	assert.Equal(t, kept, scheduleSnapshots(t, s.StateDir, u, "fast", operators[0]), "no run after the entry went")
}
