package snapshots

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// schedRig is a Service on a bbolt store holding one Available volume,
// with a fake master that the rig answers: the scheduler's decisions are
// driven by the times the test gives, not the clock.
type schedRig struct {
	t    *testing.T
	ctx  context.Context
	s    *Service
	f    *fakeSalt
	st   *store.Bolt
	v    *volume.Volume
	fail map[string]string // snapshot name -> the node's error for its take
}

func newSchedRig(t *testing.T) *schedRig {
	st, err := store.Open(filepath.Join(t.TempDir(), "store.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	v := &volume.Volume{Spec: spec.Spec{Name: "data-1", UUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301", Node: "node-1",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}}
	require.NoError(t, st.Create(ctx, v))
	v, err = st.Get("data-1")
	require.NoError(t, err)
	v.Status.Phase = volume.Available
	require.NoError(t, st.Update(ctx, v))
	v, err = st.Get("data-1")
	require.NoError(t, err)
	f := &fakeSalt{returns: map[string]saltapi.JobInfo{}}
	s := &Service{Records: st, Salt: f, Volumes: st, JobTimeout: time.Hour}
	s.init()
	return &schedRig{t: t, ctx: ctx, s: s, f: f, st: st, v: v, fail: map[string]string{}}
}

// answer gives every job without a return its node's answer: taken (at
// the time given) unless fail names it, deleted.
func (g *schedRig) answer(at time.Time) {
	g.f.mu.Lock()
	launched := append([]string(nil), g.f.launched...)
	g.f.mu.Unlock()
	for i, d := range launched {
		jid := fmt.Sprint(i + 1)
		g.f.mu.Lock()
		_, done := g.f.returns[jid]
		g.f.mu.Unlock()
		parts := strings.Fields(d)
		if done || len(parts) != 3 {
			continue
		}
		name := parts[2]
		switch {
		case parts[1] == "deleted":
			g.f.answer(jid, 0, map[string]any{"deleted": name})
		case g.fail[name] != "":
			g.f.answer(jid, 1, "ERROR: "+g.fail[name])
		default:
			g.f.answer(jid, 0, map[string]any{"name": name, "volumeUUID": g.v.Spec.UUID, "method": "reflink", "size": 1 << 30, "allocated": 4096, "takenAt": at.UTC()})
		}
	}
}

// slot runs the schedules at now until what they asked for is settled:
// the take, its outcome noted, the pruning and its deletions.
func (g *schedRig) slot(now time.Time) {
	for range 3 {
		g.s.schedulePass(g.ctx, now)
		g.s.pass(g.ctx)
		g.answer(now)
		g.s.pass(g.ctx)
	}
}

func (g *schedRig) names() []string {
	all, err := g.s.List(g.ctx, "")
	require.NoError(g.t, err)
	var out []string
	for _, sn := range all {
		out = append(out, sn.Name+":"+sn.Phase)
	}
	sort.Strings(out)
	return out
}

func (g *schedRig) schedule() *scheduleRecord {
	sc, err := g.s.readSchedule(g.ctx, "data-1")
	require.NoError(g.t, err)
	return sc
}

func (g *schedRig) takes() int {
	g.f.mu.Lock()
	defer g.f.mu.Unlock()
	n := 0
	for _, d := range g.f.launched {
		if strings.Contains(d, " taken ") {
			n++
		}
	}
	return n
}

// slotName is the name of the data-1 schedule's snapshot for the slot
// starting at at (its first try).
func (g *schedRig) slotName(at time.Time) string {
	return SlotName("data-1", g.schedule().ID, at, 0)
}

func sorted(in ...string) []string {
	sort.Strings(in)
	return in
}

var t0 = time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)

func TestSlotNamesAndDueSlots(t *testing.T) {
	const id = "sv-00112233445566778899aabbccddeeff"
	n := SlotName("data-1", id, t0, 0)
	assert.Regexp(t, `^data-1-20261128010000-[0-9a-f]{6}$`, n)
	assert.Equal(t, n, SlotName("data-1", id, t0.In(time.FixedZone("x", 3600)), 0), "UTC, whatever the zone")
	assert.Equal(t, n, SlotName("data-1", id, t0, 0), "the same slot, the same name")
	// The tag is the schedule's and the slot's: another schedule of the
	// name, the next slot or the next try end otherwise, and the next
	// slot's tag is not the last one's.
	assert.NotEqual(t, n, SlotName("data-1", "sv-ffeeddccbbaa99887766554433221100", t0, 0))
	assert.NotEqual(t, n[len(n)-slotTag:], SlotName("data-1", id, t0.Add(time.Hour), 0)[len(n)-slotTag:])
	assert.NotEqual(t, n, SlotName("data-1", id, t0, 1))

	long := strings.Repeat("a", 40) + "-" + strings.Repeat("b", 22)
	other := strings.Repeat("a", 40) + "-" + strings.Repeat("c", 22)
	n1, n2 := SlotName(long, id, t0, 0), SlotName(other, id, t0, 0)
	for _, n := range []string{n1, n2, SlotName(strings.Repeat("x", 63), id, t0, 2), SlotName(strings.Repeat("x", 41), id, t0, 0),
		SlotName(strings.Repeat("x", 42), id, t0, 0), SlotName(strings.Repeat("a", 30)+"-"+strings.Repeat("z", 24), id, t0, 0)} {
		assert.LessOrEqual(t, len(n), 63, n)
		assert.Regexp(t, names, n)
	}
	assert.Len(t, SlotName(strings.Repeat("x", 41), id, t0, 0), 63, "41 is used as it is")
	assert.Contains(t, SlotName(strings.Repeat("x", 42), id, t0, 0), "--20261128010000-", "42 is cut and hashed")
	assert.NotEqual(t, n1[:41], n2[:41], "two long names alike in their start differ")
	assert.Equal(t, n1, SlotName(long, id, t0, 0), "the same slot, the same name")

	assert.Equal(t, t0, slotOf(t0.Add(59*time.Minute), time.Hour))
	assert.Equal(t, t0.Add(time.Hour), slotOf(t0.Add(time.Hour), time.Hour))
	assert.Equal(t, t0.Add(2*time.Second), slotOf(t0.Add(3*time.Second), 2*time.Second))

	for _, c := range []struct {
		in   string
		want time.Duration
	}{{"30s", 30 * time.Second}, {"15m", 15 * time.Minute}, {"1h", time.Hour}, {"7d", 7 * 24 * time.Hour}} {
		d, err := ParseInterval("every", c.in)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, d, c.in)
		assert.Equal(t, c.in, FormatInterval(d))
	}
	for _, bad := range []string{"", "1 hour", "-1h", "0d", "x"} {
		_, err := ParseInterval("every", bad)
		checkRefusal(t, err, bad, "every", 400, "is not an interval: use a whole number and a unit")
	}
}

func TestScheduleRefusalsNameTheFieldAndWriteNothing(t *testing.T) {
	g := newSchedRig(t)
	for _, c := range []struct {
		sp      ScheduleSpec
		field   string
		message string
	}{
		{ScheduleSpec{Every: 30 * time.Second, Keep: 2}, "every", "every: 30s is shorter than the shortest interval, 1m: give 1m or more"},
		{ScheduleSpec{Every: 1500 * time.Millisecond * 60, Keep: 2}, "", ""},
		{ScheduleSpec{Every: time.Hour, Keep: 0}, "keep", "keep: 0 is out of bounds"},
		{ScheduleSpec{Every: time.Hour, Keep: 1001}, "keep", "1 to 1000"},
		{ScheduleSpec{Every: time.Hour, Keep: 2, MaxAge: time.Minute}, "maxAge", "shorter than every"},
		{ScheduleSpec{Every: time.Minute, Keep: 2, MaxAge: 1001 * time.Minute}, "maxAge", "at most 1000 times the interval"},
		{ScheduleSpec{Every: 366 * 24 * time.Hour, Keep: 2}, "every", "longer than a year"},
		{ScheduleSpec{Every: 90500 * time.Millisecond, Keep: 2}, "every", "not a whole number of seconds"},
	} {
		_, _, err := g.s.SetSchedule(g.ctx, g.v, c.sp, "alice")
		if c.field == "" {
			require.NoError(t, err)
			_, err = g.s.Unschedule(g.ctx, "data-1")
			require.NoError(t, err)
			continue
		}
		checkRefusal(t, err, fmt.Sprint(c.sp), c.field, 400, c.message)
	}
	gone := g.v.Clone()
	gone.DeleteRequested = true
	_, _, err := g.s.SetSchedule(g.ctx, gone, ScheduleSpec{Every: time.Hour, Keep: 2}, "alice")
	checkRefusal(t, err, "deleting", "volume", 409, "is being deleted")
	all, err := g.s.Schedules(g.ctx, "")
	require.NoError(t, err)
	assert.Empty(t, all, "nothing was written")
	_, err = g.s.Unschedule(g.ctx, "data-1")
	assert.ErrorIs(t, err, ErrNoSchedule)

	// The floor is serve's to lower (a test knob).
	g.s.MinScheduleEvery = time.Second
	_, created, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: 2 * time.Second, Keep: 2}, "alice")
	require.NoError(t, err)
	assert.True(t, created)
}

// The first snapshot is the next slot's; a slot is taken once, even when
// the pass is repeated; a take under way holds the next slot back; slots
// missed while no leader ran are not made up.
func TestScheduleDueSlotsReplayAndMissedSlots(t *testing.T) {
	g := newSchedRig(t)
	before := time.Now()
	sc, created, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 5}, "alice")
	require.NoError(t, err)
	require.True(t, created)
	assert.Equal(t, "api", sc.Source)
	assert.Equal(t, "1m", sc.Every)
	assert.False(t, sc.Overdue)
	// Made now: its slot is the current one, already counted.
	cur := slotOf(before, time.Minute)
	g.s.schedulePass(g.ctx, cur.Add(10*time.Second))
	assert.Zero(t, g.takes(), "not due within the slot it was made in")

	next := cur.Add(time.Minute)
	g.s.schedulePass(g.ctx, next)
	g.s.schedulePass(g.ctx, next.Add(time.Second))
	g.s.pass(g.ctx)
	assert.Equal(t, 1, g.takes(), "one take for the slot, whatever the passes")
	assert.Equal(t, g.slotName(next), g.schedule().Taking)

	// Replayed: the schedule's write lost (a leader gone before it), the
	// slot is asked for again and answered, not taken twice.
	lost := g.schedule()
	lost.LastSlot, lost.Taking = cur, ""
	require.NoError(t, g.s.writeSchedule(g.ctx, lost))
	g.s.schedulePass(g.ctx, next.Add(2*time.Second))
	g.s.pass(g.ctx)
	assert.Equal(t, 1, g.takes())
	assert.Equal(t, g.slotName(next), g.schedule().Taking)

	// Still being taken when the next slot begins: that slot waits.
	g.s.schedulePass(g.ctx, next.Add(time.Minute))
	assert.Equal(t, 1, g.takes())
	g.answer(next)
	g.s.pass(g.ctx)
	g.s.schedulePass(g.ctx, next.Add(time.Minute))
	g.s.pass(g.ctx)
	assert.Equal(t, 2, g.takes(), "once the first ended, the current slot")
	g.answer(next.Add(time.Minute))
	g.s.pass(g.ctx)
	g.s.schedulePass(g.ctx, next.Add(time.Minute+time.Second))
	sc2 := g.schedule()
	assert.Equal(t, g.slotName(next.Add(time.Minute)), sc2.LastSnapshot)
	require.NotNil(t, sc2.LastSuccess)

	// Ten slots missed: one snapshot, of the current slot.
	late := next.Add(12 * time.Minute)
	g.slot(late)
	assert.Equal(t, 3, g.takes())
	assert.Equal(t, g.slotName(late), g.schedule().LastSnapshot)
}

// Pruning keeps the schedule's newest keep, never the snapshot a person
// took, never one an earlier schedule of the volume took, never one a
// clone is being made from.
func TestSchedulePrunesOnlyItsOwn(t *testing.T) {
	g := newSchedRig(t)
	_, _, err := g.s.Take(g.ctx, g.v, "by-hand", "bob")
	require.NoError(t, err)
	_, _, err = g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 2}, "alice")
	require.NoError(t, err)
	start := slotOf(time.Now(), time.Minute)
	g.slot(start.Add(time.Minute))
	first := g.slotName(start.Add(time.Minute))
	// Removed and made again: a new schedule, which owns nothing of the
	// first one's.
	_, err = g.s.Unschedule(g.ctx, "data-1")
	require.NoError(t, err)
	_, _, err = g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 2}, "alice")
	require.NoError(t, err)
	var taken []string
	for i := 2; i <= 4; i++ {
		at := start.Add(time.Duration(i) * time.Minute)
		g.slot(at)
		taken = append(taken, g.slotName(at))
	}
	assert.Equal(t, sorted("by-hand:Ready", taken[1]+":Ready", taken[2]+":Ready", first+":Ready"), g.names())
	got, err := g.s.Get(g.ctx, taken[2])
	require.NoError(t, err)
	assert.Equal(t, "data-1", got.Schedule, "shown as the schedule's")
	assert.Equal(t, "schedule/data-1", got.RequestedBy)

	// A clone being made from the oldest of its own holds it.
	clone := &volume.Volume{Spec: spec.Spec{Name: "copy", UUID: "9b2f0c1e-1111-4222-8333-444455556666", Node: "node-1",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}, Source: &spec.Source{VolumeUUID: g.v.Spec.UUID, Snapshot: taken[1]}}}
	require.NoError(t, g.st.Create(g.ctx, clone))
	g.slot(start.Add(5 * time.Minute))
	assert.Contains(t, g.names(), taken[1]+":Ready", "a clone is being made from it")
	assert.Len(t, g.names(), 5)
	// Once the clone is Available, the next success prunes it.
	c, err := g.st.Get("copy")
	require.NoError(t, err)
	c.Status.Phase = volume.Available
	require.NoError(t, g.st.Update(g.ctx, c))
	g.slot(start.Add(6 * time.Minute))
	assert.Equal(t, sorted("by-hand:Ready", first+":Ready", g.slotName(start.Add(5*time.Minute))+":Ready",
		g.slotName(start.Add(6*time.Minute))+":Ready"), g.names())
}

// A failing take prunes nothing and says why; the next success prunes.
// maxAge prunes the schedule's own past their age, keep or not.
func TestScheduleFailureNeverPrunesAndMaxAge(t *testing.T) {
	g := newSchedRig(t)
	_, _, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 1, MaxAge: 3 * time.Minute}, "alice")
	require.NoError(t, err)
	start := slotOf(time.Now(), time.Minute)
	s1, s2, s3 := start.Add(time.Minute), start.Add(2*time.Minute), start.Add(3*time.Minute)
	g.slot(s1)
	g.fail[g.slotName(s2)] = "no_room: the state dir has 1 MiB free"
	g.slot(s2)
	sc := g.schedule()
	assert.Equal(t, 1, sc.Failures)
	assert.Contains(t, sc.LastError, "no_room: the state dir has 1 MiB free")
	assert.Equal(t, g.slotName(s1), sc.LastSnapshot)
	assert.Contains(t, g.names(), g.slotName(s1)+":Ready", "a failing take never prunes")
	view := sc.view(s2)
	assert.True(t, view.Failing)
	assert.False(t, view.Overdue)

	g.slot(s3)
	sc = g.schedule()
	assert.Zero(t, sc.Failures)
	assert.Empty(t, sc.LastError)
	assert.Equal(t, []string{g.slotName(s3) + ":Ready"}, g.names(), "keep 1: the older one and the failed record go")

	// Overdue: nothing within twice the interval and a minute.
	assert.False(t, sc.overdue(s3.Add(3*time.Minute)))
	assert.True(t, sc.overdue(s3.Add(3*time.Minute+time.Second)))

	// maxAge: with a larger keep, the ones past 3m go all the same.
	_, _, err = g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 10, MaxAge: 3 * time.Minute}, "alice")
	require.NoError(t, err)
	for i := 4; i <= 8; i++ {
		g.slot(start.Add(time.Duration(i) * time.Minute))
	}
	var want []string
	for i := 5; i <= 8; i++ {
		want = append(want, g.slotName(start.Add(time.Duration(i)*time.Minute))+":Ready")
	}
	assert.Equal(t, want, g.names(), "those older than 3m at the last success are pruned")
}

// A volume gone, made again under the name (another uuid) or being
// deleted takes its schedule with it: removed by the leader's pass, not
// failing (and overdue) for good; nothing is taken of a new volume.
func TestScheduleOfAVolumeGoneOrReplaced(t *testing.T) {
	g := newSchedRig(t)
	_, _, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 1}, "alice")
	require.NoError(t, err)
	sc := g.schedule()
	sc.VolumeUUID = "00000000-0000-4000-8000-000000000000"
	require.NoError(t, g.s.writeSchedule(g.ctx, sc))
	g.slot(slotOf(time.Now(), time.Minute).Add(time.Minute))
	assert.Zero(t, g.takes())
	_, err = g.s.readSchedule(g.ctx, "data-1")
	assert.ErrorIs(t, err, ErrNoSchedule, "the schedule of a volume made again goes")

	// Being deleted: the schedule goes, and what it took stays.
	_, _, err = g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 1}, "alice")
	require.NoError(t, err)
	start := slotOf(time.Now(), time.Minute)
	g.slot(start.Add(time.Minute))
	took := g.slotName(start.Add(time.Minute))
	require.Equal(t, []string{took + ":Ready"}, g.names())
	v, err := g.st.Get("data-1")
	require.NoError(t, err)
	v.DeleteRequested = true
	require.NoError(t, g.st.Update(g.ctx, v))
	g.slot(start.Add(2 * time.Minute))
	_, err = g.s.readSchedule(g.ctx, "data-1")
	assert.ErrorIs(t, err, ErrNoSchedule, "the schedule of a volume being deleted goes")
	assert.Equal(t, []string{took + ":Ready"}, g.names(), "its snapshots stay")
	assert.Equal(t, 1, g.takes())

	// Gone from the store (deleted, rm --forget, node forget).
	v, err = g.st.Get("data-1")
	require.NoError(t, err)
	v.DeleteRequested = false
	require.NoError(t, g.st.Update(g.ctx, v))
	_, _, err = g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 1}, "alice")
	require.NoError(t, err)
	v, err = g.st.Get("data-1")
	require.NoError(t, err)
	require.NoError(t, g.st.Delete(g.ctx, v))
	g.s.schedulePass(g.ctx, start.Add(3*time.Minute))
	all, err := g.s.Schedules(g.ctx, "")
	require.NoError(t, err)
	assert.Empty(t, all, "the schedule of a volume gone goes")
	assert.Equal(t, 1, g.takes())
}
