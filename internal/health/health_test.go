package health

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

func report(at time.Time, alloc int64, vols ...saltvolumes.Device) *Report {
	v := append([]saltvolumes.Device{{UUID: "u1", State: "prepared", Size: 1 << 30, Allocated: alloc}}, vols...)
	return &Report{Node: "n1", Kind: "change", Interval: 10 * time.Second, Heartbeat: 5 * time.Minute, Volumes: v, Received: at,
		Capacity: &saltvolumes.Capacity{Size: 100, Free: 40, Committed: 50, OvercommitRatio: 1}}
}

func TestSilentAfterThreeHeartbeats(t *testing.T) {
	g := New()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g.Record(report(t0, 1, saltvolumes.Device{UUID: "o1", State: "orphan", BackingFile: "/x/o1"}))
	g.Now = func() time.Time { return t0.Add(15 * time.Minute) }
	c, h := g.NodeView("n1")
	require.NotNil(t, c)
	assert.EqualValues(t, 50, c.Committed)
	assert.False(t, h.Silent, "three heartbeats plus an interval is not silent yet")
	require.Len(t, h.Orphans, 1)
	assert.Equal(t, "/x/o1", h.Orphans[0].BackingFile)
	g.Now = func() time.Time { return t0.Add(15*time.Minute + 11*time.Second) }
	_, h = g.NodeView("n1")
	assert.True(t, h.Silent)
	assert.Equal(t, "absent", g.Usage("n1", "o1").State, "an orphan is not the volume of that uuid")
}

func TestHistoryKeepsADay(t *testing.T) {
	g := New()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 3000 {
		g.Record(report(t0.Add(time.Duration(i)*time.Minute), int64(i)))
	}
	end := t0.Add(2999 * time.Minute)
	h := g.History("u1", time.Time{})
	require.LessOrEqual(t, len(h), MaxSamples)
	assert.Equal(t, int64(2999), h[len(h)-1].Allocated)
	assert.False(t, h[0].At.Before(end.Add(-HistoryWindow)), "nothing older than a day")
	// Steady values within a minute are one sample.
	g.Record(report(end.Add(time.Second), 2999))
	assert.Len(t, g.History("u1", end), 1)
	g.Forget("u1")
	assert.Empty(t, g.History("u1", time.Time{}))
}

func TestParseNeedsTimings(t *testing.T) {
	_, err := Parse("n1", map[string]any{"kind": "start", "volumes": []any{}}, time.Now())
	require.ErrorContains(t, err, "interval and heartbeat")
	r, err := Parse("n1", map[string]any{"kind": "start", "interval": 10, "heartbeat": 300.0, "volumes": []any{map[string]any{"uuid": "u1", "state": "detached"}}}, time.Now())
	require.NoError(t, err)
	assert.Equal(t, 5*time.Minute, r.Heartbeat)
	assert.Equal(t, "detached", r.Find("u1").State)
}

// What keep saves comes back, minus what has aged out; a volume that
// reported since the start keeps its own samples.
func TestUsageSnapshotRestore(t *testing.T) {
	g := New()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		g.Record(report(t0.Add(time.Duration(i)*time.Minute), 7))
	}
	ident := func(h []saltvolumes.UsageSample) []saltvolumes.UsageSample { return h }
	snap, changed := g.UsageSnapshot(ident)
	assert.True(t, changed)
	require.Len(t, snap["u1"], 5)
	_, changed = g.UsageSnapshot(ident)
	assert.False(t, changed, "nothing new since")

	old := saltvolumes.UsageSample{At: t0.Add(-25 * time.Hour), Allocated: 1}
	snap["u1"] = append([]saltvolumes.UsageSample{old}, snap["u1"]...)
	snap["u2"] = []saltvolumes.UsageSample{{At: t0, Allocated: 3}}
	h := New()
	h.Now = func() time.Time { return t0.Add(10 * time.Minute) }
	h.Record(&Report{Node: "n1", Received: t0.Add(9 * time.Minute), Volumes: []saltvolumes.Device{{UUID: "u2", State: "prepared", Allocated: 9}}})
	h.RestoreUsage(snap)
	got := h.History("u1", time.Time{})
	require.Len(t, got, 5, "the sample older than a day is dropped")
	assert.Equal(t, t0, got[0].At)
	u2 := h.History("u2", time.Time{})
	require.Len(t, u2, 1)
	assert.Equal(t, int64(9), u2[0].Allocated, "what arrived after the start wins")
}

// What a hostile minion's reports can make the registry hold: the
// history of the node's own stored volumes, its last report (bounded), and
// no node Salt has not confirmed.
func TestReportsAreBoundedByWhatTheStoreKnows(t *testing.T) {
	g := New()
	g.Known = func(node string) map[string]bool {
		if node == "n1" {
			return map[string]bool{"u1": true}
		}
		return nil
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var flood []saltvolumes.Device
	for i := range 500 {
		flood = append(flood, saltvolumes.Device{UUID: fmt.Sprintf("fake-%d", i), State: "prepared", Allocated: int64(i)})
	}
	require.Equal(t, "", g.Record(report(t0, 7, flood...)))
	assert.Len(t, g.History("u1", time.Time{}), 1, "the stored volume's history")
	assert.Empty(t, g.History("fake-1", time.Time{}), "no history for a volume the store does not hold")
	g.mu.Lock()
	assert.Len(t, g.history, 1)
	g.mu.Unlock()

	// Over the cap: refused whole, counted, the last good report kept.
	for i := range MaxReportVolumes {
		flood = append(flood, saltvolumes.Device{UUID: fmt.Sprintf("more-%d", i)})
	}
	assert.Equal(t, RefusedTooMany, g.Record(report(t0.Add(time.Minute), 8, flood...)))
	assert.EqualValues(t, 1, g.RefusedTooMany.Value())
	assert.EqualValues(t, 7, g.Usage("n1", "u1").Allocated, "the refused report changed nothing")

	// A node with no stored volume: not shown until Salt confirms it.
	other := report(t0, 1)
	other.Node = "made-up"
	assert.Equal(t, RefusedUnknownNode, g.Record(other))
	assert.EqualValues(t, 1, g.RefusedUnknownNode.Value())
	assert.Equal(t, []string{"n1"}, g.Names())
	confirmed := report(t0, 1)
	confirmed.Node, confirmed.Kind = "empty-node", "confirmed"
	assert.Equal(t, "", g.Record(confirmed))
	again := report(t0.Add(time.Minute), 1)
	again.Node = "empty-node"
	assert.Equal(t, "", g.Record(again), "once confirmed, its beacon's reports are taken")
	assert.ElementsMatch(t, []string{"n1", "empty-node"}, g.Names())

	// A saved history is pruned to the volumes the store holds.
	g.Now = func() time.Time { return t0.Add(time.Hour) }
	g.RestoreUsage(map[string][]saltvolumes.UsageSample{"gone": {{At: t0, Allocated: 1}}})
	require.NotEmpty(t, g.History("gone", time.Time{}), "restored")
	g.PruneHistory(func(u string) bool { return u == "u1" })
	assert.Empty(t, g.History("gone", time.Time{}))
	assert.NotEmpty(t, g.History("u1", time.Time{}))
}

// A node's thin pools become metric series: only LVM names and percents
// are kept, and at most MaxThinPools of one report.
func TestThinPoolsBounded(t *testing.T) {
	g := New()
	rep := report(time.Now(), 1)
	rep.Capacity.ThinPools = []saltvolumes.ThinPool{
		{Name: "vg0/pool", DataPercent: 12.5, MetadataPercent: 88},
		{Name: `vg0/pool"} 1\nfake_metric{x="`, DataPercent: 1},
		{Name: "vg0/p2", DataPercent: 101},
		{Name: "../etc", DataPercent: 1},
		{Name: "vg0/pool", DataPercent: 1},
	}
	for i := range 2 * MaxThinPools {
		rep.Capacity.ThinPools = append(rep.Capacity.ThinPools, saltvolumes.ThinPool{Name: fmt.Sprintf("vg%d/pool", i)})
	}
	require.Empty(t, g.Record(rep))
	c, _ := g.NodeView("n1")
	require.Len(t, c.ThinPools, MaxThinPools)
	assert.Equal(t, saltvolumes.ThinPool{Name: "vg0/pool", DataPercent: 12.5, MetadataPercent: 88}, c.ThinPools[0])
	assert.Equal(t, "vg1/pool", c.ThinPools[1].Name, "the next kept: the loop's, vg0/pool being kept already")
	names := map[string]bool{}
	for _, p := range c.ThinPools {
		assert.NotContains(t, p.Name, `"`)
		assert.False(t, names[p.Name], "%s twice: one series a pool", p.Name)
		names[p.Name] = true
	}
}

// A node's volume groups and candidate disks are offered to people
// creating volumes: only LVM names, /dev paths and sizes that add up are
// kept, each once, a model without control characters, at most
// MaxVGs and MaxDisks of one report.
func TestVGsAndDisksBounded(t *testing.T) {
	g := New()
	rep := report(time.Now(), 1)
	rep.Capacity.VGs = []saltvolumes.VGSpace{
		{Name: "vg0", Size: 10 << 30, Free: 4 << 30},
		{Name: "vg0", Size: 1, Free: 1},
		{Name: "../etc", Size: 1},
		{Name: "vg1", Size: 1 << 30, Free: 2 << 30},
		{Name: "<script>", Size: 1},
	}
	for i := range 2 * MaxVGs {
		rep.Capacity.VGs = append(rep.Capacity.VGs, saltvolumes.VGSpace{Name: fmt.Sprintf("v%d", i), Size: 1})
	}
	rep.Capacity.Disks = []saltvolumes.Disk{
		{Path: "/dev/sdb", Size: 1 << 40, Model: "ATA\x1b[31m Disk\n"},
		{Path: "/dev/sdb", Size: 1},
		{Path: "/dev/../etc/passwd", Size: 1},
		{Path: "/tmp/x", Size: 1},
		{Path: "/dev/sdc", Size: 0},
	}
	for i := range 2 * MaxDisks {
		rep.Capacity.Disks = append(rep.Capacity.Disks, saltvolumes.Disk{Path: fmt.Sprintf("/dev/vd%d", i), Size: 1})
	}
	require.Empty(t, g.Record(rep))
	c, _ := g.NodeView("n1")
	require.Len(t, c.VGs, MaxVGs)
	assert.Equal(t, saltvolumes.VGSpace{Name: "vg0", Size: 10 << 30, Free: 4 << 30}, c.VGs[0])
	assert.Equal(t, "v0", c.VGs[1].Name, "the rest refused")
	require.Len(t, c.Disks, MaxDisks)
	assert.Equal(t, saltvolumes.Disk{Path: "/dev/sdb", Size: 1 << 40, Model: "ATA[31m Disk"}, c.Disks[0])
	assert.Equal(t, "/dev/vd0", c.Disks[1].Path, "the rest refused")
}

// A node's report carries the runs that came before the last; each is
// counted once, however often the report is read again.
func TestCountRestoreCountsEveryRunOnce(t *testing.T) {
	g := New()
	now := g.Since.Add(time.Second)
	boot := Restore{ID: "boot", At: now, Restored: 4}
	beacon := Restore{ID: "beacon", At: now.Add(time.Second), Restored: 1, Earlier: []Restore{boot}}
	assert.Equal(t, Counted{Runs: 2, Restored: 5}, g.CountRestore("n1", beacon),
		"the boot's run, read only after the beacon's replaced it")
	assert.EqualValues(t, 5, g.Reconstructed.Value())
	assert.Equal(t, Counted{}, g.CountRestore("n1", beacon), "read again")
	hand := Restore{ID: "by-hand", At: now.Add(time.Minute), Failed: 1, Earlier: []Restore{boot, {ID: "beacon", Restored: 1}}}
	assert.Equal(t, Counted{Runs: 1, Failed: 1}, g.CountRestore("n1", hand))
	assert.EqualValues(t, 5, g.Reconstructed.Value(), "runs already counted are not counted again")
	assert.EqualValues(t, 1, g.RestoreFailed.Value())
	assert.Equal(t, 1, g.CountRestore("n2", Restore{ID: "boot", At: now, Restored: 2}).Runs, "ids are a node's own")
	assert.EqualValues(t, 7, g.Reconstructed.Value())
	_, h := g.NodeView("n1")
	require.NotNil(t, h)
	assert.Equal(t, 5, h.Restored)
	assert.Equal(t, 1, h.RestoreFailed)

	// A control plane started after those runs (a restart, another
	// replica leading) may not count again what the one before counted:
	// of the runs from before it started, only the last, as always.
	later := New()
	later.Since = now.Add(30 * time.Second)
	hand.Earlier = []Restore{boot, {ID: "beacon", At: now.Add(time.Second), Restored: 1}}
	assert.Equal(t, Counted{Runs: 1, Failed: 1}, later.CountRestore("n1", hand))
	next := Restore{ID: "next", At: now.Add(time.Hour), Restored: 1, Earlier: append(hand.Earlier, Restore{ID: "by-hand", At: hand.At, Failed: 1})}
	assert.Equal(t, Counted{Runs: 1, Restored: 1}, later.CountRestore("n1", next), "the runs it saw are not counted again")

	// A replica that led before, and leads again after another did: it
	// counts as a fresh start, not by what it remembers of its last term.
	g.StartCounting(now.Add(2 * time.Hour))
	more := Restore{ID: "more", At: now.Add(3 * time.Hour), Restored: 2, Earlier: append(next.Earlier, Restore{ID: "next", At: next.At, Restored: 1})}
	assert.Equal(t, Counted{Runs: 1, Restored: 2}, g.CountRestore("n1", more), "the runs of the other replica's term are not counted again")

	// What a node says is bounded by what a node can hold and keep.
	liar := New()
	liar.Since = now
	var many []Restore
	for i := range 40 {
		many = append(many, Restore{ID: fmt.Sprint(i), At: now, Restored: 1})
	}
	assert.Equal(t, Counted{Runs: keptRestores + 1, Restored: keptRestores + MaxReportVolumes}, liar.CountRestore("n1", Restore{ID: "x", At: now, Restored: 1 << 40, Earlier: many}))
	assert.Equal(t, Counted{}, liar.CountRestore("n1", Restore{ID: "x", At: now, Restored: 1 << 40, Earlier: many}), "read again")
	liar.CountRestore("n1", Restore{ID: "y", At: now, Restored: -1000, Failed: -5})
	assert.EqualValues(t, keptRestores+MaxReportVolumes, liar.Reconstructed.Value(), "no negative count")
	assert.EqualValues(t, 0, liar.RestoreFailed.Value())

	// The ids remembered are bounded.
	for i := range 2 * countedRestores {
		g.CountRestore("n3", Restore{ID: fmt.Sprint(i), At: now, Restored: 1})
	}
	assert.Len(t, g.restores["n3"], countedRestores)
}
