package snapshots

// Outside review of the API snapshot schedules (schedules.go): each test
// is an attack, and asserts what should hold. A failing test is a finding.

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// attackVolume adds an Available sparse volume of another node (another
// person's scope) to the rig's store.
func (g *schedRig) attackVolume(name, uuid, node string) *volume.Volume {
	g.t.Helper()
	v := &volume.Volume{Spec: spec.Spec{Name: name, UUID: uuid, Node: node, SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}}
	require.NoError(g.t, g.st.Create(g.ctx, v))
	v, err := g.st.Get(name)
	require.NoError(g.t, err)
	v.Status.Phase = volume.Available
	require.NoError(g.t, g.st.Update(g.ctx, v))
	v, err = g.st.Get(name)
	require.NoError(g.t, err)
	return v
}

// A snapshot a cluster admin handed to a tenant (a pre-provisioned
// VolumeSnapshot, spec.source.snapshotName, which Binds it to the object)
// is the object's: the schedule that took it must not prune it. owned()
// looks at ScheduleID only, and drop() deletes with no owner check.
func TestAttackSchedulePrunesSnapshotBoundToVolumeSnapshot(t *testing.T) {
	g := newSchedRig(t)
	_, _, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 1}, "alice")
	require.NoError(t, err)
	start := slotOf(time.Now(), time.Minute)
	g.slot(start.Add(time.Minute))
	handed := g.slotName(start.Add(time.Minute))
	require.Contains(t, g.names(), handed+":Ready")

	// The admin binds last slot's snapshot to VolumeSnapshot team/keep-me
	// (what SnapshotObjects does for spec.source.snapshotName).
	_, err = g.s.Bind(g.ctx, handed, Owner{Namespace: "team", Name: "keep-me", UID: "u-keep", Bound: true}, nil)
	require.NoError(t, err)

	g.slot(start.Add(2 * time.Minute))
	g.slot(start.Add(3 * time.Minute))
	_, owner, err := g.s.Lookup(g.ctx, handed)
	require.NoError(t, err, "the schedule pruned a snapshot that belongs to VolumeSnapshot team/keep-me")
	assert.Equal(t, "keep-me", owner.Name)

	// Released (the object deleted; Bound keeps the snapshot), it stays
	// out of the schedule's retention: nobody's to prune but by hand.
	require.NoError(t, g.s.Release(g.ctx, handed, Owner{Namespace: "team", Name: "keep-me", UID: "u-keep", Bound: true}))
	g.slot(start.Add(4 * time.Minute))
	assert.Contains(t, g.names(), handed+":Ready", "released, it is not the schedule's again")
	assert.Len(t, g.names(), 2, "keep 1 of its own, and the one handed out")
}

// Snapshot names are one namespace for all volumes. An operator scoped
// to another node takes snapshots of their own volume under the names
// the victim schedule's next slots would have if they could be told from
// what anyone may list: the old form (<volume>-<UTC slot start>) and the
// last slot's name with the next slot's start. None is a slot's name (a
// slot's tag is keyed by the schedule's id, never shown), so no slot
// fails. The victim's node is not in the attacker's scope.
func TestAttackSlotNameSquattedByAnotherVolume(t *testing.T) {
	g := newSchedRig(t)
	mine := g.attackVolume("mine", "7c1d1a55-0000-4000-8000-00000000beef", "node-2")
	_, _, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 5}, "alice")
	require.NoError(t, err)
	start := slotOf(time.Now(), time.Minute)
	g.slot(start.Add(time.Minute))
	seen := g.slotName(start.Add(time.Minute)) // listed by anyone
	stamp := func(at time.Time) string { return at.UTC().Format(slotStamp) }
	for i := 2; i <= 4; i++ {
		at := start.Add(time.Duration(i) * time.Minute)
		for _, guess := range []string{"data-1-" + stamp(at), strings.Replace(seen, stamp(start.Add(time.Minute)), stamp(at), 1)} {
			_, created, err := g.s.Take(g.ctx, mine, guess, "mallory")
			require.NoError(t, err)
			require.True(t, created)
		}
	}
	for i := 2; i <= 4; i++ {
		g.slot(start.Add(time.Duration(i) * time.Minute))
	}
	sc := g.schedule()
	assert.Zero(t, sc.Failures, "the victim's schedule failed a squatted slot: %s", sc.LastError)
	assert.NotContains(t, sc.LastError, "is volume mine's")
	assert.Equal(t, g.slotName(start.Add(4*time.Minute)), sc.LastSnapshot)
}

// Even a slot's exact name taken by another volume first (the id leaked,
// or chance) costs the slot nothing: it takes its next name; the other's
// snapshot is neither counted nor pruned.
func TestScheduleSlotNameTakenByAnotherTakesTheNextName(t *testing.T) {
	g := newSchedRig(t)
	mine := g.attackVolume("mine", "7c1d1a55-0000-4000-8000-00000000beef", "node-2")
	_, _, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 1}, "alice")
	require.NoError(t, err)
	id := g.schedule().ID
	start := slotOf(time.Now(), time.Minute)
	var squatted []string
	for i := 1; i <= 3; i++ {
		name := SlotName("data-1", id, start.Add(time.Duration(i)*time.Minute), 0)
		_, _, err := g.s.Take(g.ctx, mine, name, "mallory")
		require.NoError(t, err)
		squatted = append(squatted, name)
	}
	for i := 1; i <= 3; i++ {
		g.slot(start.Add(time.Duration(i) * time.Minute))
	}
	sc := g.schedule()
	assert.Zero(t, sc.Failures, sc.LastError)
	assert.Equal(t, SlotName("data-1", id, start.Add(3*time.Minute), 1), sc.LastSnapshot)
	all, err := g.s.List(g.ctx, "mine")
	require.NoError(t, err)
	require.Len(t, all, 3, "the other volume's snapshots stay, whatever keep")
	for _, sn := range all {
		assert.Contains(t, squatted, sn.Name)
		assert.Empty(t, sn.Schedule)
	}
	own, err := g.s.List(g.ctx, "data-1")
	require.NoError(t, err)
	assert.Len(t, own, 1, "keep 1 of its own")

	// Every name of a slot taken: the slot fails saying so, nothing else.
	at := start.Add(4 * time.Minute)
	for try := range slotTries {
		_, _, err := g.s.Take(g.ctx, mine, SlotName("data-1", id, at, try), "mallory")
		require.NoError(t, err)
	}
	g.slot(at)
	sc = g.schedule()
	assert.Equal(t, 1, sc.Failures)
	assert.Contains(t, sc.LastError, "are all taken by snapshots that are not this schedule's")
	own, err = g.s.List(g.ctx, "data-1")
	require.NoError(t, err)
	assert.Len(t, own, 1, "a failed slot prunes nothing")
}

// A volume name of 41 characters is used as is; a longer one is cut to 31
// and given 8 hex characters of its hash and a '-', 41 characters too. A
// volume named like a long volume's cut prefix would share its slot
// names' start: the prefix ends with '-', which no volume name does, and
// the tag is the schedule's anyway.
func TestAttackSlotNamePrefixOfALongNameIsAnotherVolumesName(t *testing.T) {
	const id = "sv-00112233445566778899aabbccddeeff"
	long := strings.Repeat("a", 39) + "-" + strings.Repeat("b", 20) // 60
	full := SlotName(long, id, t0, 0)
	cut, _, ok := strings.Cut(full, "-"+t0.UTC().Format(slotStamp)+"-")
	require.True(t, ok, full)
	require.Len(t, cut, 41)
	assert.NotRegexp(t, names, cut, "the hashed prefix is no volume name")
	trimmed := strings.TrimSuffix(cut, "-")
	require.Regexp(t, names, trimmed)
	assert.NotEqual(t, full[:len(cut)+1], SlotName(trimmed, id, t0, 0)[:len(cut)+1], "volume %s and volume %s share slot names", long, trimmed)
	assert.NotEqual(t, full, SlotName(trimmed, id, t0, 0))
}

// The schedule's slot snapshot went (deleted while being taken, or node
// forget) and another volume's snapshot of that name is Ready by the next
// pass: follow() takes any Ready record of the name as this slot's
// success, without checking it is the schedule's (ScheduleID, VolumeUUID).
// The schedule records a success it did not have and overdue never fires.
func TestAttackFollowCountsAForeignSnapshotAsTheSlotsSuccess(t *testing.T) {
	g := newSchedRig(t)
	mine := g.attackVolume("mine", "7c1d1a55-0000-4000-8000-00000000beef", "node-2")
	_, _, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 5}, "alice")
	require.NoError(t, err)
	slot := slotOf(time.Now(), time.Minute).Add(time.Minute)
	g.s.schedulePass(g.ctx, slot)
	name := g.slotName(slot)
	require.Equal(t, name, g.schedule().Taking)

	// The slot's record goes; a foreign record of the name, Ready.
	require.NoError(t, g.s.Records.DeleteRecord(g.ctx, Kind, name))
	now := time.Now().UTC()
	foreign := record{Snapshot: Snapshot{Name: name, Volume: mine.Spec.Name, VolumeUUID: mine.Spec.UUID, Node: "node-2", Phase: Ready,
		RequestedBy: "mallory", CreatedAt: now, TakenAt: &now}, Spec: mine.Spec}
	b, err := json.Marshal(foreign)
	require.NoError(t, err)
	require.NoError(t, g.s.Records.PutRecord(g.ctx, Kind, name, b))

	g.s.schedulePass(g.ctx, slot.Add(time.Second))
	sc := g.schedule()
	assert.Nil(t, sc.LastSuccess, "volume mine's snapshot was counted as data-1's scheduled snapshot")
}

// A clone made from one of the schedule's snapshots that never becomes
// Available (Failed, or Pending on a full node) holds that snapshot from
// pruning for good: cloning() looks at the phase only, never its age.
// Whoever can make such a clone on the node keeps `keep` from being kept.
func TestAttackFailedCloneHoldsPruningForever(t *testing.T) {
	g := newSchedRig(t)
	_, _, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 1}, "alice")
	require.NoError(t, err)
	start := slotOf(time.Now(), time.Minute)
	g.slot(start.Add(time.Minute))
	first := g.slotName(start.Add(time.Minute))
	clone := &volume.Volume{Spec: spec.Spec{Name: "stuck", UUID: "9b2f0c1e-1111-4222-8333-444455550000", Node: "node-1",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}, Source: &spec.Source{VolumeUUID: g.v.Spec.UUID, Snapshot: first}}}
	require.NoError(t, g.st.Create(g.ctx, clone))
	c, err := g.st.Get("stuck")
	require.NoError(t, err)
	c.Status.Phase = volume.Failed
	require.NoError(t, g.st.Update(g.ctx, c))
	for i := 2; i <= 4; i++ {
		g.slot(start.Add(time.Duration(i) * time.Minute))
	}
	assert.NotContains(t, g.names(), first+":Ready", "a Failed clone holds the schedule's snapshot past keep 1 forever")
}

// every is documented up to 365d, maxAge optional. MaxKeep*sp.Every in
// check() overflows int64 nanoseconds from every >= ~107d: the product is
// negative, so any maxAge, and even none (0 > negative), is refused with
// a nonsensical limit.
func TestAttackLongIntervalsOverflowTheMaxAgeBound(t *testing.T) {
	g := newSchedRig(t)
	for _, sp := range []ScheduleSpec{
		{Every: 200 * 24 * time.Hour, Keep: 3},
		{Every: 365 * 24 * time.Hour, Keep: 3, MaxAge: 3 * 365 * 24 * time.Hour},
	} {
		_, _, err := g.s.SetSchedule(g.ctx, g.v, sp, "alice")
		assert.NoError(t, err, "every %s maxAge %s", FormatInterval(sp.Every), FormatInterval(sp.MaxAge))
	}
}

// A clone Pending for good (a full node) holds the snapshot it is made
// from for an hour at most, counted from the first pass that held it.
func TestScheduleCloneHoldIsBounded(t *testing.T) {
	g := newSchedRig(t)
	_, _, err := g.s.SetSchedule(g.ctx, g.v, ScheduleSpec{Every: time.Minute, Keep: 1}, "alice")
	require.NoError(t, err)
	start := slotOf(time.Now(), time.Minute)
	g.slot(start.Add(time.Minute))
	first := g.slotName(start.Add(time.Minute))
	clone := &volume.Volume{Spec: spec.Spec{Name: "pending", UUID: "9b2f0c1e-1111-4222-8333-444455550001", Node: "node-1",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}, Source: &spec.Source{VolumeUUID: g.v.Spec.UUID, Snapshot: first}}}
	require.NoError(t, g.st.Create(g.ctx, clone))
	g.slot(start.Add(2 * time.Minute))
	assert.Contains(t, g.names(), first+":Ready", "held while the clone is made")
	held := g.schedule().Held[first]
	assert.Equal(t, start.Add(2*time.Minute), held)
	g.slot(start.Add(62 * time.Minute))
	assert.Contains(t, g.names(), first+":Ready", "within the hour")
	g.slot(start.Add(63 * time.Minute))
	assert.NotContains(t, g.names(), first+":Ready", "past the hour: pruned")
	assert.Empty(t, g.schedule().Held, "the hold is forgotten")
}
