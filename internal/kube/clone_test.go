package kube

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// takingSalt is a master whose every snapshot job returns at once, as the
// node would answer it.
type takingSalt struct {
	mu   sync.Mutex
	args map[string][]any
}

func (f *takingSalt) LocalAsync(_ context.Context, _, _ string, arg []any, _ map[string]any) (saltapi.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	jid := time.Now().Format("150405.000000000")
	f.args[jid] = arg
	return saltapi.Job{JID: jid}, nil
}

func (f *takingSalt) ListJob(_ context.Context, jid string) (saltapi.JobInfo, error) {
	f.mu.Lock()
	arg := f.args[jid]
	f.mu.Unlock()
	sp := arg[1].(spec.Spec)
	ans := map[string]any{"name": arg[2], "volumeUUID": sp.UUID, "method": "reflink", "size": sp.Bytes(), "allocated": 4096}
	if sp.LVMLogicalVolume != nil {
		ans["method"], ans["lv"] = "lvm-thick", sp.LVMLogicalVolume.VGName+"/svsnap-"+sp.UUID[:8]+"-"+arg[2].(string)
	}
	b, _ := json.Marshal(ans)
	return saltapi.JobInfo{Known: true, Returns: map[string]saltapi.MinionReturn{sp.Node: {Return: b}}}, nil
}

const srcUID = "7c1d2e3f-0000-4000-8000-000000000001"

func sourceVolume(mut ...func(*volume.Volume)) *volume.Volume {
	v := &volume.Volume{Spec: spec.Spec{Name: "pvc-" + srcUID, UUID: srcUID, Node: "node-1", Mode: spec.ModeFilesystem, FSType: "ext4",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}}
	if err := v.Spec.Validate(); err != nil {
		panic(err)
	}
	v.Status.Phase = volume.Available
	for _, m := range mut {
		m(v)
	}
	return v
}

func cloneClaim(mut ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	return testClaim(append([]func(*corev1.PersistentVolumeClaim){func(p *corev1.PersistentVolumeClaim) {
		p.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: kindClaim, Name: "origin"}
	}}, mut...)...)
}

func originClaim() *corev1.PersistentVolumeClaim {
	return testClaim(func(p *corev1.PersistentVolumeClaim) {
		p.Name, p.UID, p.Spec.VolumeName = "origin", srcUID, "pvc-"+srcUID
		p.Status.Phase = corev1.ClaimBound
	})
}

// heldPV is the source volume's PV, its claimRef naming claim.
func heldPV(claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-" + srcUID, Labels: map[string]string{LabelManagedBy: ManagedBy}},
		Spec: corev1.PersistentVolumeSpec{ClaimRef: &corev1.ObjectReference{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}}}
}

func snapService(t *testing.T) *snapshots.Service {
	st, err := store.Open(filepath.Join(t.TempDir(), "store.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return &snapshots.Service{Records: st, Salt: &takingSalt{args: map[string][]any{}}, Every: 10 * time.Millisecond}
}

// runSnaps runs the service's loop until the test ends, and waits for it
// to return before the store closes (cleanups run last-in first-out): a
// loop still reading a closed store is a race the detector reports.
func runSnaps(t *testing.T, snaps *snapshots.Service) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); snaps.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestDecisionCloneOfAClaim(t *testing.T) {
	vols := &recVolumes{vols: map[string]*volume.Volume{"pvc-" + srcUID: sourceVolume()}}
	c, _ := follower(t, vols, testClass(), originClaim(), heldPV(originClaim()), cloneClaim())
	snaps := snapService(t)
	c.SetSnapshots(snaps)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runSnaps(t, snaps)

	// The snapshot is taken first (named for the new claim); the claim
	// waits for it, then its volume is provisioned from it.
	require.ErrorIs(t, c.syncClaim(ctx, "apps/data"), errCloneWaiting)
	snap, err := snaps.Get(ctx, "pvc-"+uid)
	require.NoError(t, err)
	assert.Equal(t, claimVolume, snap.For, "deleted once the clone is Available")
	assert.Equal(t, "pvc-"+srcUID, snap.Volume)
	require.Eventually(t, func() bool { return c.syncClaim(ctx, "apps/data") == nil }, 10*time.Second, 20*time.Millisecond)
	require.Len(t, vols.provisioned, 1)
	assert.Equal(t, &spec.Source{VolumeUUID: srcUID, Snapshot: "pvc-" + uid}, vols.provisioned[0].Source)
	assert.Equal(t, "node-1", vols.provisioned[0].Node)
}

func TestDecisionCloneRefusals(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		src   *volume.Volume
		claim *corev1.PersistentVolumeClaim
		want  string
	}{
		{"the source on another node", sourceVolume(func(v *volume.Volume) { v.Spec.Node = "node-2" }), cloneClaim(),
			"is on Salt minion node-2 but the scheduler chose node-1"},
		{"no such claim", sourceVolume(), cloneClaim(func(p *corev1.PersistentVolumeClaim) { p.Spec.DataSource.Name = "nope" }),
			"claim nope not found in namespace apps"},
		{"another filesystem", sourceVolume(func(v *volume.Volume) { v.Spec.FSType = "xfs" }), cloneClaim(),
			"holds xfs but this claim's StorageClass makes ext4"},
		{"a raw source", sourceVolume(func(v *volume.Volume) {
			v.Spec.SparseLoopDevice, v.Spec.RawBlockDevice = nil, &spec.RawBlockDevice{DevicePath: "/dev/sdb"}
		}), cloneClaim(), "is not a sparse volume"},
		{"smaller than the source", sourceVolume(func(v *volume.Volume) { v.Spec.SparseLoopDevice.Size = "2Gi"; v.Spec.SizeBytes = 2 << 30 }),
			cloneClaim(), "smaller than the source (2Gi)"},
		{"a snapshot of ours that is not there", sourceVolume(), cloneClaim(func(p *corev1.PersistentVolumeClaim) {
			g := ourGroup
			p.Spec.DataSource = nil
			p.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &g, Kind: kindSnapshot, Name: "gone"}
		}), "dataSourceRef: VolumeSnapshot gone: no snapshot of that object in namespace apps"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vols := &recVolumes{vols: map[string]*volume.Volume{"pvc-" + srcUID: c.src}}
			ctl, _ := follower(t, vols, testClass(), originClaim(), heldPV(originClaim()), c.claim)
			snaps := snapService(t)
			ctl.SetSnapshots(snaps)
			runSnaps(t, snaps)
			rctx := ctx
			s := &spec.Spec{Name: claimVolume, UUID: uid, Node: "node-1", Mode: spec.ModeFilesystem, FSType: "ext4",
				SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}
			require.NoError(t, s.Validate())
			var refuse string
			require.Eventually(t, func() bool {
				var err error
				refuse, err = ctl.withSource(rctx, c.claim, s)
				return err == nil
			}, 10*time.Second, 20*time.Millisecond)
			assert.Contains(t, refuse, c.want)
			assert.Nil(t, s.Source, "nothing to clone from")
		})
	}
}

// A claim cannot restore an LVM snapshot: our classes make sparse volumes;
// the event says how to restore it instead.
func TestDecisionLVMSnapshotNotRestoredByAClaim(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lv := sourceVolume(func(v *volume.Volume) {
		v.Spec.SparseLoopDevice, v.Spec.LVMLogicalVolume = nil, &spec.LVMLogicalVolume{VGName: "vg0", Size: "1Gi"}
	})
	claim := cloneClaim(func(p *corev1.PersistentVolumeClaim) {
		g := ourGroup
		p.Spec.DataSource = nil
		p.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &g, Kind: kindSnapshot, Name: "nightly"}
	})
	ctl, _ := follower(t, &recVolumes{vols: map[string]*volume.Volume{lv.Spec.Name: lv}}, testClass(), claim)
	snaps := snapService(t)
	ctl.SetSnapshots(snaps)
	runSnaps(t, snaps)
	_, _, err := snaps.TakeOwned(ctx, lv, SnapshotName("apps", "nightly"), "alice", 0, snapshots.Owner{Namespace: "apps", Name: "nightly", UID: "u1"})
	require.NoError(t, err)
	name := SnapshotName("apps", "nightly")
	require.Eventually(t, func() bool {
		s, err := snaps.Get(ctx, name)
		return err == nil && s.Phase == snapshots.Ready
	}, 10*time.Second, 20*time.Millisecond)
	s := &spec.Spec{Name: claimVolume, UUID: uid, Node: "node-1", Mode: spec.ModeFilesystem, FSType: "ext4",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}
	require.NoError(t, s.Validate())
	refuse, err := ctl.withSource(ctx, claim, s)
	require.NoError(t, err)
	assert.Contains(t, refuse, "snapshot "+name+" is an LVM snapshot (vg0/svsnap-")
	assert.Contains(t, refuse, "salt-volumes create NAME --from snapshot/"+name)
	assert.Nil(t, s.Source)
}

// Issue #48 (1): a claim restores only the snapshots of its own
// namespace's VolumeSnapshot objects: not one taken through the API, not
// another namespace's by its control-plane name (new or old style), and
// the refusal names no node. An operator's binding makes an API snapshot
// restorable in one namespace.
func TestDecisionClaimRestoresOnlyItsNamespacesSnapshots(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := sourceVolume()
	snaps := snapService(t)
	runSnaps(t, snaps)
	ready := func(name string) {
		t.Helper()
		require.Eventually(t, func() bool {
			s, err := snaps.Get(ctx, name)
			return err == nil && s.Phase == snapshots.Ready
		}, 10*time.Second, 20*time.Millisecond)
	}
	// An operator's snapshot through the API, and namespace a's objects
	// nightly (as named now) and old (as named before: a-old, no owner).
	_, _, err := snaps.Take(ctx, src, "nightly", "alice")
	require.NoError(t, err)
	aNightly := SnapshotName("a", "nightly")
	_, _, err = snaps.TakeOwned(ctx, src, aNightly, "k8s:volumesnapshot a/nightly", 0, snapshots.Owner{Namespace: "a", Name: "nightly", UID: "ua"})
	require.NoError(t, err)
	_, _, err = snaps.Take(ctx, src, "a-old", "k8s:volumesnapshot a/old")
	require.NoError(t, err)
	for _, n := range []string{"nightly", aNightly, "a-old"} {
		ready(n)
	}
	s := func() *spec.Spec {
		s := &spec.Spec{Name: claimVolume, UUID: uid, Node: "node-1", Mode: spec.ModeFilesystem, FSType: "ext4",
			SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}
		require.NoError(t, s.Validate())
		return s
	}
	for _, ref := range []string{"nightly", aNightly, "a-old", "a-nightly"} {
		claim := cloneClaim(func(p *corev1.PersistentVolumeClaim) {
			g := ourGroup
			p.Namespace, p.Spec.DataSource = "evil", nil
			p.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &g, Kind: kindSnapshot, Name: ref}
		})
		ctl, _ := follower(t, &recVolumes{vols: map[string]*volume.Volume{src.Spec.Name: src}}, testClass(), claim)
		ctl.SetSnapshots(snaps)
		sp := s()
		refuse, err := ctl.withSource(ctx, claim, sp)
		require.NoError(t, err)
		assert.Contains(t, refuse, "dataSourceRef: VolumeSnapshot "+ref+": no snapshot of that object in namespace evil", ref)
		assert.Contains(t, refuse, "a claim restores only the VolumeSnapshot objects of its own namespace", ref)
		assert.NotContains(t, refuse, "node-1", "the refusal does not say where another's snapshot is")
		assert.Nil(t, sp.Source, ref)
	}
	// Namespace a's own claim restores its object's snapshot.
	claim := cloneClaim(func(p *corev1.PersistentVolumeClaim) {
		g := ourGroup
		p.Namespace, p.Spec.DataSource = "a", nil
		p.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &g, Kind: kindSnapshot, Name: "nightly"}
	})
	ctl, _ := follower(t, &recVolumes{vols: map[string]*volume.Volume{src.Spec.Name: src}}, testClass(), claim)
	ctl.SetSnapshots(snaps)
	sp := s()
	refuse, err := ctl.withSource(ctx, claim, sp)
	require.NoError(t, err)
	assert.Empty(t, refuse)
	assert.Equal(t, &spec.Source{VolumeUUID: srcUID, Snapshot: aNightly}, sp.Source)

	// The operator binds the API snapshot to evil/granted: restorable
	// there by that object's name, and only there.
	_, err = snaps.Bind(ctx, "nightly", snapshots.Owner{Namespace: "evil", Name: "granted", UID: "ug", Bound: true}, nil)
	require.NoError(t, err)
	for ns, want := range map[string]string{"evil": "", "a": "no snapshot of that object in namespace a"} {
		claim := cloneClaim(func(p *corev1.PersistentVolumeClaim) {
			g := ourGroup
			p.Namespace, p.Spec.DataSource = ns, nil
			p.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &g, Kind: kindSnapshot, Name: "granted"}
		})
		ctl, _ := follower(t, &recVolumes{vols: map[string]*volume.Volume{src.Spec.Name: src}}, testClass(), claim)
		ctl.SetSnapshots(snaps)
		sp := s()
		refuse, err := ctl.withSource(ctx, claim, sp)
		require.NoError(t, err)
		if want == "" {
			assert.Empty(t, refuse)
			assert.Equal(t, &spec.Source{VolumeUUID: srcUID, Snapshot: "nightly"}, sp.Source)
		} else {
			assert.Contains(t, refuse, want)
		}
	}
}

// #48, the outside review of the fix: a claim that only names a PV
// (spec.volumeName, Pending, never bound) is no way to clone the volume
// behind it: only a claim its PV's claimRef names holds it.
func TestDecisionCloneOfADecoyClaimWaits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	decoy := originClaim()
	decoy.Status.Phase = corev1.ClaimPending
	operators := heldPV(testClaim(func(p *corev1.PersistentVolumeClaim) { p.Namespace, p.Name, p.UID = "prod", "db", "d0d0" }))
	vols := &recVolumes{vols: map[string]*volume.Volume{"pvc-" + srcUID: sourceVolume()}}
	for _, tc := range []struct {
		name  string
		claim *corev1.PersistentVolumeClaim
	}{{"pending, naming the PV", decoy}, {"bound, but the PV's claimRef names another claim", originClaim()}} {
		t.Run(tc.name, func(t *testing.T) {
			ctl, _ := follower(t, vols, testClass(), tc.claim, operators, cloneClaim())
			snaps := snapService(t)
			ctl.SetSnapshots(snaps)
			runSnaps(t, snaps)
			s := &spec.Spec{Name: claimVolume, UUID: uid, Node: "node-1", Mode: spec.ModeFilesystem, FSType: "ext4",
				SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}
			require.NoError(t, s.Validate())
			_, err := ctl.withSource(ctx, cloneClaim(), s)
			assert.ErrorIs(t, err, errCloneWaiting)
			assert.Nil(t, s.Source)
			all, err := snaps.List(ctx, "")
			require.NoError(t, err)
			assert.Empty(t, all, "no snapshot of the operator's volume was taken")
		})
	}
}
