package snapshots

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// fakeSalt is a master whose job cache the test fills in: the error
// paths (lost jobs, failures, a minion without our function) that real
// Salt gives only by accident. The real path is test/controlplane's.
type fakeSalt struct {
	mu       sync.Mutex
	n        int
	launched []string // fun action name
	kwargs   []map[string]any
	args     []any // each apply_snapshot's volume spec
	returns  map[string]saltapi.JobInfo
	fail     error
}

func (f *fakeSalt) LocalAsync(_ context.Context, tgt, fun string, arg []any, kw map[string]any) (saltapi.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return saltapi.Job{}, f.fail
	}
	f.n++
	desc := fun
	if fun == FunApply {
		desc = fmt.Sprintf("%s %v %v", fun, arg[0], arg[2])
		f.args = append(f.args, arg[1])
	}
	f.launched = append(f.launched, desc)
	f.kwargs = append(f.kwargs, kw)
	return saltapi.Job{JID: fmt.Sprint(f.n), Minions: []string{tgt}}, nil
}

func (f *fakeSalt) ListJob(_ context.Context, jid string) (saltapi.JobInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if info, ok := f.returns[jid]; ok {
		return info, nil
	}
	return saltapi.JobInfo{Known: true}, nil // running
}

func (f *fakeSalt) answer(jid string, retcode int, ret any) {
	b, _ := json.Marshal(ret)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.returns[jid] = saltapi.JobInfo{Known: true, Returns: map[string]saltapi.MinionReturn{"node-1": {Return: b, Retcode: retcode}}}
}

func setup(t *testing.T) (*Service, *fakeSalt, *volume.Volume) {
	st, err := store.Open(filepath.Join(t.TempDir(), "store.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	f := &fakeSalt{returns: map[string]saltapi.JobInfo{}}
	s := &Service{Records: st, Salt: f, JobTimeout: time.Hour}
	v := &volume.Volume{Spec: spec.Spec{Name: "data-1", UUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301", Node: "node-1",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}}
	v.Status.Phase = volume.Available
	return s, f, v
}

func TestTakeSettleAndDelete(t *testing.T) {
	s, f, v := setup(t)
	ctx := context.Background()
	snap, created, err := s.Take(ctx, v, "before", "alice")
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, Pending, snap.Phase)
	assert.True(t, s.pass(ctx), "unfinished")
	assert.Equal(t, []string{FunApply + " taken before"}, f.launched)
	s.pass(ctx)
	assert.Len(t, f.launched, 1, "a running job is not started again")
	taken := time.Now().UTC().Truncate(time.Second)
	f.answer("1", 0, map[string]any{"name": "before", "volumeUUID": v.Spec.UUID, "method": "reflink", "frozen": true,
		"size": 1 << 30, "allocated": 4096, "takenAt": taken})
	assert.False(t, s.pass(ctx), "settled")
	got, err := s.Get(ctx, "before")
	require.NoError(t, err)
	assert.Equal(t, Ready, got.Phase)
	assert.Equal(t, "reflink", got.Method)
	assert.Equal(t, int64(4096), got.Allocated)
	assert.Equal(t, taken, got.TakenAt.UTC())
	assert.Equal(t, "alice", got.RequestedBy)
	again, created, err := s.Take(ctx, v, "before", "bob")
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, got, again, "asking again answers the one taken")

	_, err = s.Delete(ctx, "before", "bob")
	require.NoError(t, err)
	s.pass(ctx)
	assert.Equal(t, FunApply+" deleted before", f.launched[1])
	f.answer("2", 0, map[string]any{"deleted": "before"})
	s.pass(ctx)
	_, err = s.Get(ctx, "before")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Equal(t, int64(1), s.Taken.Load())
	assert.Equal(t, int64(1), s.Deleted.Load())
}

func TestRefusalsNameTheFieldAndWriteNothing(t *testing.T) {
	s, _, v := setup(t)
	ctx := context.Background()
	pending := v.Clone()
	pending.Status.Phase = volume.Pending
	other := v.Clone()
	other.Spec.Name, other.Spec.UUID = "data-2", "9b2f0c1e-1111-4222-8333-444455556666"
	_, _, err := s.Take(ctx, v, "taken", "")
	require.NoError(t, err)
	for _, c := range []struct {
		v       *volume.Volume
		name    string
		field   string
		status  int
		message string
	}{
		{v, "Before_Upgrade", "name", 400, "not a snapshot name"},
		{v, "a.b", "name", 400, "not a snapshot name"},
		{pending, "s", "volume", 409, "once it is Available"},
		{other, "taken", "name", 409, "is volume data-1's"},
	} {
		_, _, err := s.Take(ctx, c.v, c.name, "")
		checkRefusal(t, err, c.name, c.field, c.status, c.message)
	}
	// Copy-on-write space is a thick LV's only.
	thin := v.Clone()
	thin.Spec.SparseLoopDevice, thin.Spec.LVMLogicalVolume = nil, &spec.LVMLogicalVolume{VGName: "vg0", Size: "1Gi", ThinPool: "pool"}
	_, _, err = s.TakeFor(ctx, v, "s", "", "", 64<<20)
	checkRefusal(t, err, "sparse with a size", "size", 400, "takes no size")
	_, _, err = s.TakeFor(ctx, thin, "s", "", "", 64<<20)
	checkRefusal(t, err, "thin with a size", "size", 400, "share its pool")
	all, err := s.List(ctx, "")
	require.NoError(t, err)
	assert.Len(t, all, 1)
}

func checkRefusal(t *testing.T, err error, what, field string, status int, message string) {
	t.Helper()
	var se *Error
	require.ErrorAs(t, err, &se, what)
	assert.Equal(t, field, se.Field, what)
	assert.Equal(t, status, se.Status, what)
	assert.Contains(t, se.Msg, message, what)
}

// An LVM volume's snapshot: its copy-on-write size goes to the node as the
// size argument, and the node's answer (its LV, the space set aside) is kept.
func TestLVMSnapshotCarriesItsSize(t *testing.T) {
	s, f, v := setup(t)
	ctx := context.Background()
	v.Spec.SparseLoopDevice, v.Spec.LVMLogicalVolume = nil, &spec.LVMLogicalVolume{VGName: "vg0", Size: "1Gi"}
	snap, _, err := s.TakeFor(ctx, v, "nightly", "alice", "", 64<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(64<<20), snap.COWSize)
	s.pass(ctx)
	require.Len(t, f.kwargs, 1)
	assert.Equal(t, "67108864", f.kwargs[0]["size"])
	assert.Regexp(t, `^sv-[0-9a-f]{32}$`, f.kwargs[0]["owner"], "the record's node id goes as owner")
	f.answer("1", 0, map[string]any{"name": "nightly", "volumeUUID": v.Spec.UUID, "method": "lvm-thick", "frozen": true,
		"size": 1 << 30, "allocated": 64 << 20, "cowSize": 64 << 20, "lv": "vg0/svsnap-3f2504e0-nightly"})
	s.pass(ctx)
	got, err := s.Get(ctx, "nightly")
	require.NoError(t, err)
	assert.Equal(t, Ready, got.Phase)
	assert.Equal(t, "lvm-thick", got.Method)
	assert.Equal(t, "vg0/svsnap-3f2504e0-nightly", got.LV)
	_, err = s.Delete(ctx, "nightly", "")
	require.NoError(t, err)
	s.pass(ctx)
	assert.NotContains(t, f.kwargs[1], "size", "a deletion takes no size")
	assert.Equal(t, f.kwargs[0]["owner"], f.kwargs[1]["owner"], "the same owner deletes it")
}

// Only the node knows whether a raw device is an operator's LV: a raw
// volume's snapshot, size and all, goes to it; its refusal comes back.
func TestRawVolumeSnapshotIsTheNodesCall(t *testing.T) {
	s, f, v := setup(t)
	ctx := context.Background()
	v.Spec.SparseLoopDevice, v.Spec.RawBlockDevice = nil, &spec.RawBlockDevice{DevicePath: "/dev/vg0/db"}
	_, _, err := s.TakeFor(ctx, v, "onlv", "", "", 32<<20)
	require.NoError(t, err)
	s.pass(ctx)
	assert.Equal(t, FunApply+" taken onlv", f.launched[0])
	assert.Equal(t, "33554432", f.kwargs[0]["size"])
	f.answer("1", 3, "ERROR: volume data-1 is on /dev/sdb (/dev/sdb), a disk or partition, not an LVM logical volume")
	s.pass(ctx)
	got, err := s.Get(ctx, "onlv")
	require.NoError(t, err)
	assert.Equal(t, Failed, got.Phase)
	assert.Contains(t, got.Message, "not an LVM logical volume")
}

func TestFailuresLostJobsAndOldMinions(t *testing.T) {
	s, f, v := setup(t)
	ctx := context.Background()
	_, _, err := s.Take(ctx, v, "s1", "")
	require.NoError(t, err)

	// salt-api down: said in the snapshot, tried again.
	f.fail = fmt.Errorf("salt-api: connection refused")
	s.pass(ctx)
	got, _ := s.Get(ctx, "s1")
	assert.Contains(t, got.Message, "connection refused")
	assert.Empty(t, got.JobID)
	f.fail = nil

	// A minion whose modules predate apply_snapshot: synced once, run
	// again.
	s.pass(ctx)
	f.answer("1", 254, "'salt_volumes.apply_snapshot' is not available.")
	s.pass(ctx)
	assert.Equal(t, "saltutil.sync_all", f.launched[1])
	got, _ = s.Get(ctx, "s1")
	assert.Equal(t, Pending, got.Phase)
	assert.Contains(t, got.Message, "synced")

	// The node refuses: Failed with its message; asking again retries.
	s.pass(ctx)
	f.answer("3", 1, "ERROR: volume data-1 is not prepared on this node")
	s.pass(ctx)
	got, _ = s.Get(ctx, "s1")
	assert.Equal(t, Failed, got.Phase)
	assert.Contains(t, got.Message, "volume data-1 is not prepared on this node")
	assert.NotContains(t, got.Message, "ERROR:")
	got, created, err := s.Take(ctx, v, "s1", "")
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, Pending, got.Phase)

	// A job the master never ran: started again after 30 s.
	s.pass(ctx)
	f.mu.Lock()
	f.returns["4"] = saltapi.JobInfo{Known: false}
	f.mu.Unlock()
	r, err := s.read(ctx, "s1")
	require.NoError(t, err)
	old := time.Now().Add(-time.Minute)
	r.JobStartedAt = &old
	require.NoError(t, s.write(ctx, r))
	s.pass(ctx)
	got, _ = s.Get(ctx, "s1")
	assert.Empty(t, got.JobID)
	assert.Contains(t, got.Message, "started again")
	s.pass(ctx)
	assert.Equal(t, FunApply+" taken s1", f.launched[len(f.launched)-1])

	// A return that describes another snapshot is not this one's.
	f.answer("5", 0, map[string]any{"name": "other", "volumeUUID": v.Spec.UUID})
	s.pass(ctx)
	got, _ = s.Get(ctx, "s1")
	assert.Equal(t, Failed, got.Phase)
	assert.Equal(t, int64(2), s.Failures.Load())
}

func TestForgetDropsOnlyTheNamedVolumes(t *testing.T) {
	s, _, v := setup(t)
	ctx := context.Background()
	other := v.Clone()
	other.Spec.Name, other.Spec.UUID = "data-2", "9b2f0c1e-1111-4222-8333-444455556666"
	for _, c := range []struct {
		v    *volume.Volume
		name string
	}{{v, "a"}, {v, "b"}, {other, "c"}} {
		_, _, err := s.Take(ctx, c.v, c.name, "")
		require.NoError(t, err)
	}
	gone, err := s.Forget(ctx, []string{"data-1"})
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, gone)
	left, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, left, 1)
	assert.Equal(t, "c", left[0].Name)
}

// Issue #48: a snapshot records the object it belongs to, and every write
// on its behalf checks it; records written before owners read as owned
// by none.
func TestOwners(t *testing.T) {
	s, _, v := setup(t)
	ctx := context.Background()
	a := Owner{Namespace: "team", Name: "a-backup", UID: "u1"}
	b := Owner{Namespace: "team-a", Name: "backup", UID: "u2"}
	_, created, err := s.TakeOwned(ctx, v, "snap-a", "k8s:volumesnapshot team/a-backup", 0, a)
	require.NoError(t, err)
	assert.True(t, created)
	_, _, err = s.TakeOwned(ctx, v, "snap-a", "k8s:volumesnapshot team-a/backup", 0, b)
	var se *Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 409, se.Status)
	assert.Contains(t, se.Msg, "belongs to VolumeSnapshot team/a-backup (uid u1)")
	a2 := a
	a2.UID = "u9" // a later object of the same name
	_, _, err = s.TakeOwned(ctx, v, "snap-a", "x", 0, a2)
	require.ErrorAs(t, err, &se)
	_, err = s.DeleteOwned(ctx, "snap-a", "x", b)
	require.ErrorIs(t, err, ErrNotOwner)
	_, err = s.Bind(ctx, "snap-a", b, nil)
	require.ErrorIs(t, err, ErrNotOwner)
	require.NoError(t, s.Release(ctx, "snap-a", b), "not b's: left as it is")
	_, o, err := s.Lookup(ctx, "snap-a")
	require.NoError(t, err)
	assert.Equal(t, &a, o)
	owned, err := s.OwnedBy(ctx, "team", "a-backup")
	require.NoError(t, err)
	require.Len(t, owned, 1)
	snap, err := s.DeleteOwned(ctx, "snap-a", "k8s:volumesnapshot team/a-backup", a)
	require.NoError(t, err)
	assert.Equal(t, Deleting, snap.Phase)

	// A record from before owners: no owner; bound once, then only its
	// owner's.
	old := `{"name":"old","volume":"data-1","volumeUUID":"` + v.Spec.UUID + `","node":"node-1","phase":"Ready","requestedBy":"alice","createdAt":"2025-01-01T00:00:00Z","updatedAt":"2025-01-01T00:00:00Z","spec":{"name":"data-1"}}`
	require.NoError(t, s.Records.PutRecord(ctx, Kind, "old", []byte(old)))
	_, o, err = s.Lookup(ctx, "old")
	require.NoError(t, err)
	assert.Nil(t, o)
	_, err = s.Bind(ctx, "old", b, func(sn Snapshot) bool { return sn.RequestedBy == "bob" })
	require.ErrorIs(t, err, ErrNotOwner, "adopt says no")
	_, err = s.Bind(ctx, "old", b, nil)
	require.NoError(t, err)
	_, err = s.Bind(ctx, "old", a, nil)
	require.ErrorIs(t, err, ErrNotOwner)
	require.NoError(t, s.Release(ctx, "old", b))
	_, o, _ = s.Lookup(ctx, "old")
	assert.Nil(t, o)
	sn, err := s.Get(ctx, "old")
	require.NoError(t, err)
	assert.Equal(t, Ready, sn.Phase, "released, kept")
}

// A snapshot of that name the node has and this record did not take
// (Salt's, another record's) is refused by the node: the record is Failed
// with the node's words, the same owner goes with every retry, and
// deleting the Failed record removes only the record (the node refuses
// to delete a snapshot not this owner's, which the leader takes as done).
func TestNameTakenOnTheNodeIsFailedNeverTakenOver(t *testing.T) {
	s, f, v := setup(t)
	ctx := context.Background()
	_, _, err := s.Take(ctx, v, "before-upgrade", "alice")
	require.NoError(t, err)
	s.pass(ctx)
	require.Len(t, f.kwargs, 1)
	owner := f.kwargs[0]["owner"]
	require.NotEmpty(t, owner)
	f.answer("1", 3, "ERROR: name_taken: snapshot before-upgrade of data-1 is on this node already, taken through Salt (a state, a schedule or salt-call) or by an older salt-volumes at 2026-11-27T10:00:00Z, not by this request: it is not taken over and nothing was changed: take this snapshot under another name")
	s.pass(ctx)
	got, err := s.Get(ctx, "before-upgrade")
	require.NoError(t, err)
	assert.Equal(t, Failed, got.Phase)
	assert.Contains(t, got.Message, "through Salt")
	assert.Contains(t, got.Message, "another name")
	assert.NotContains(t, got.Message, "name_taken: ")

	// Asked again: retried with the same owner.
	_, _, err = s.Take(ctx, v, "before-upgrade", "alice")
	require.NoError(t, err)
	s.pass(ctx)
	require.Len(t, f.kwargs, 2)
	assert.Equal(t, owner, f.kwargs[1]["owner"])
	f.answer("2", 3, "ERROR: name_taken: snapshot before-upgrade of data-1 is on this node already")
	s.pass(ctx)

	_, err = s.Delete(ctx, "before-upgrade", "alice")
	require.NoError(t, err)
	s.pass(ctx)
	require.Len(t, f.kwargs, 3)
	assert.Equal(t, FunApply+" deleted before-upgrade", f.launched[2])
	assert.Equal(t, owner, f.kwargs[2]["owner"], "the delete is the owner's only")
	f.answer("3", 3, "ERROR: name_taken: snapshot before-upgrade of data-1 is on this node already")
	s.pass(ctx)
	_, err = s.Get(ctx, "before-upgrade")
	assert.ErrorIs(t, err, ErrNotFound, "only the record went")
	assert.Equal(t, int64(0), s.Taken.Load())
}

// A job's return on the bus makes the loop look again soon (the job
// cache may lag the event), at growing steps; more hints in the window
// do not start the steps over, so a flood cannot make it look more often.
func TestHintLooksAgainSoon(t *testing.T) {
	s := &Service{Every: time.Second}
	s.init()
	assert.Equal(t, time.Second, s.nextLook(), "no hint: the loop's own interval")
	s.Hint("20261128010203040506")
	var steps []time.Duration
	for i := 0; i < 7; i++ {
		steps = append(steps, s.nextLook())
		if i == 2 {
			s.Hint("20261128010203040507") // within the window: no restart
		}
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{25 * ms, 50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second}, steps)
	s.hintMu.Lock()
	s.hintUntil = time.Now().Add(-time.Millisecond)
	s.hintMu.Unlock()
	assert.Equal(t, time.Second, s.nextLook(), "the window over: the loop's own interval")
	s.Hint("20261128010203040508")
	assert.Equal(t, 25*ms, s.nextLook(), "a hint after the window starts the steps again")

	// A flood of hints (forged: any minion can fire a return's tag)
	// wakes the loop once, then not again within hintKickEvery.
	s.hintMu.Lock()
	s.hintKicked = time.Time{}
	s.hintMu.Unlock()
	select {
	case <-s.wake:
	default:
	}
	for i := 0; i < 1000; i++ {
		s.Hint("20261128010203040509")
		if i == 0 {
			<-s.wake // the first woke it
		}
	}
	select {
	case <-s.wake:
		t.Fatal("999 more hints within 250 ms woke the loop again")
	default:
	}
}
