package kube

import (
	"context"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Issue #48 (2): names that cannot collide, within what the store and the
// node take (a DNS label of at most 63: internal/engine validSnapshotName).
func TestSnapshotNamesDoNotCollide(t *testing.T) {
	label := regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	long := "n23456789012345678901234567890123456789012345678901234567890123"
	pairs := [][2]string{{"team", "a-backup"}, {"team-a", "backup"}, {"team-a-backup", "x"}, {"default", "nightly"},
		{long, long[:62]}, {long, long[:61] + "9"}, {long[:62], long[:62]}, {"a", "b.c"}, {"a-b", "c"}, {"a", "b-c"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		n := SnapshotName(p[0], p[1])
		assert.Regexp(t, label, n, "%v", p)
		assert.LessOrEqual(t, len(n), 63, "%v", p)
		if prev, dup := seen[n]; dup {
			t.Errorf("%v and %v are both %s", prev, p, n)
		}
		seen[n] = p
		assert.Equal(t, n, SnapshotName(p[0], p[1]), "stable")
	}
	assert.Regexp(t, `^default-nightly-[0-9a-f]{16}$`, SnapshotName("default", "nightly"), "readable")
}

// objects runs SnapshotObjects.sync against client-go's fake dynamic
// client, with a real snapshots.Service whose node answers at once.
type objects struct {
	t     *testing.T
	ctx   context.Context
	o     *SnapshotObjects
	dc    *dynamicfake.FakeDynamicClient
	idx   cache.Indexer
	snaps *snapshots.Service
}

func newObjects(t *testing.T, claims ...*corev1.PersistentVolumeClaim) *objects {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	snaps := snapService(t)
	runSnaps(t, snaps)
	src := sourceVolume()
	other := sourceVolume(func(v *volume.Volume) { v.Spec.Name, v.Spec.UUID = "prod-db", "7c1d2e3f-0000-4000-8000-000000000002" })
	vols := &recVolumes{vols: map[string]*volume.Volume{src.Spec.Name: src, other.Spec.Name: other}}
	ci := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	pi := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range claims {
		require.NoError(t, ci.Add(c))
		if c.Status.Phase == corev1.ClaimBound {
			require.NoError(t, pi.Add(heldPV(c)))
		}
	}
	dc := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{SnapshotResource: "VolumeSnapshotList"})
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	o := &SnapshotObjects{Client: dc, Snapshots: snaps, Volumes: vols, Claims: corelisters.NewPersistentVolumeClaimLister(ci), PVs: corelisters.NewPersistentVolumeLister(pi),
		Leading: func() bool { return true }, lis: cache.NewGenericLister(idx, SnapshotResource.GroupResource())}
	o.Log = slog.New(slog.DiscardHandler)
	return &objects{t: t, ctx: ctx, o: o, dc: dc, idx: idx, snaps: snaps}
}

func (h *objects) create(ns, name, uid string, source map[string]any) {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "salt-volumes.io/v1alpha1", "kind": "VolumeSnapshot",
		"spec": map[string]any{"source": source}}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID(uid))
	_, err := h.dc.Resource(SnapshotResource).Namespace(ns).Create(h.ctx, u, metav1.CreateOptions{})
	require.NoError(h.t, err)
}

func (h *objects) get(ns, name string) *unstructured.Unstructured {
	u, err := h.dc.Resource(SnapshotResource).Namespace(ns).Get(h.ctx, name, metav1.GetOptions{})
	require.NoError(h.t, err)
	return u
}

func (h *objects) status(ns, name, field string) string {
	v, _, _ := unstructured.NestedFieldNoCopy(h.get(ns, name).Object, "status", field)
	s, _ := v.(string)
	return s
}

// settle syncs ns/name (as the watch would bring it back) until it
// asks for no more.
func (h *objects) settle(ns, name string) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		require.NoError(h.t, h.idx.Update(h.get(ns, name)))
		again, err := h.o.sync(h.ctx, ns+"/"+name)
		require.NoError(h.t, err)
		if !again {
			return
		}
		require.True(h.t, time.Now().Before(deadline), "%s/%s did not settle: %v", ns, name, h.get(ns, name).Object["status"])
		time.Sleep(20 * time.Millisecond)
	}
}

// remove deletes ns/name as the API server would (a deletion timestamp,
// our finalizer holding it) and settles it: its finalizer must go.
func (h *objects) remove(ns, name string) {
	h.t.Helper()
	u := h.get(ns, name)
	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	_, err := h.dc.Resource(SnapshotResource).Namespace(ns).Update(h.ctx, u, metav1.UpdateOptions{})
	require.NoError(h.t, err)
	h.settle(ns, name)
	assert.NotContains(h.t, h.get(ns, name).GetFinalizers(), snapshotFinalizer)
}

func (h *objects) phase(name string) string {
	s, err := h.snaps.Get(h.ctx, name)
	if err != nil {
		return err.Error()
	}
	return s.Phase
}

func (h *objects) owner(name string) *snapshots.Owner {
	_, o, err := h.snaps.Lookup(h.ctx, name)
	require.NoError(h.t, err)
	return o
}

var vol = map[string]any{"volume": "pvc-" + srcUID}

// Issue #48 (2): team/a-backup and team-a/backup are two snapshots, each
// owned by its object; deleting one leaves the other's.
func TestSnapshotObjectsCollidingNamesStayApart(t *testing.T) {
	h := newObjects(t)
	h.create("team", "a-backup", "u1", vol)
	h.create("team-a", "backup", "u2", vol)
	h.settle("team", "a-backup")
	h.settle("team-a", "backup")
	one, two := h.status("team", "a-backup", "snapshot"), h.status("team-a", "backup", "snapshot")
	assert.NotEqual(t, one, two)
	assert.Equal(t, SnapshotName("team", "a-backup"), one)
	assert.Equal(t, snapshots.Ready, h.status("team", "a-backup", "phase"))
	assert.Equal(t, snapshots.Ready, h.status("team-a", "backup", "phase"))
	assert.Equal(t, &snapshots.Owner{Namespace: "team", Name: "a-backup", UID: "u1"}, h.owner(one))
	assert.Equal(t, &snapshots.Owner{Namespace: "team-a", Name: "backup", UID: "u2"}, h.owner(two))

	h.remove("team", "a-backup")
	assert.Contains(t, h.phase(one), "no such snapshot")
	assert.Equal(t, snapshots.Ready, h.phase(two), "the other object's snapshot is kept")
}

// Issue #48 (2): a record of the object's name that is not the object's
// (taken through the API; an earlier object's of the same name, whose
// finalizer was removed by hand) is refused, never taken over, and kept
// when the object goes.
func TestSnapshotObjectsNeverTakeOver(t *testing.T) {
	h := newObjects(t)
	src := sourceVolume()
	_, _, err := h.snaps.Take(h.ctx, src, SnapshotName("team", "x"), "alice")
	require.NoError(t, err)
	_, _, err = h.snaps.TakeOwned(h.ctx, src, SnapshotName("team", "y"), "k8s:volumesnapshot team/y", 0, snapshots.Owner{Namespace: "team", Name: "y", UID: "old"})
	require.NoError(t, err)
	h.create("team", "x", "u1", vol)
	h.create("team", "y", "new", vol)
	h.settle("team", "x")
	h.settle("team", "y")
	assert.Equal(t, snapshots.Failed, h.status("team", "x", "phase"))
	assert.Contains(t, h.status("team", "x", "message"), "exists and belongs to no object, not to this object: nothing was taken")
	assert.Equal(t, snapshots.Failed, h.status("team", "y", "phase"))
	assert.Contains(t, h.status("team", "y", "message"), "belongs to VolumeSnapshot team/y (uid old)")
	h.remove("team", "x")
	h.remove("team", "y")
	assert.Nil(t, h.owner(SnapshotName("team", "x")))
	assert.NotContains(t, h.phase(SnapshotName("team", "x")), "no such snapshot", "kept")
	assert.NotContains(t, h.phase(SnapshotName("team", "y")), "no such snapshot", "kept")
}

// Issue #48 (1, 3): an existing snapshot is bound to one object
// (spec.source.snapshotName, which admission keeps to admin on volumes),
// only while no other object owns it; deleting that object releases it
// and keeps it.
func TestSnapshotObjectsBindAnExistingSnapshot(t *testing.T) {
	h := newObjects(t)
	_, _, err := h.snaps.Take(h.ctx, sourceVolume(), "nightly", "alice")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.phase("nightly") == snapshots.Ready }, 10*time.Second, 20*time.Millisecond)
	h.create("evil", "granted", "ug", map[string]any{"snapshotName": "nightly"})
	h.settle("evil", "granted")
	assert.Equal(t, snapshots.Ready, h.status("evil", "granted", "phase"))
	assert.Equal(t, "nightly", h.status("evil", "granted", "snapshot"))
	assert.Equal(t, &snapshots.Owner{Namespace: "evil", Name: "granted", UID: "ug", Bound: true}, h.owner("nightly"))

	h.create("other", "grab", "uo", map[string]any{"snapshotName": "nightly"})
	h.settle("other", "grab")
	assert.Equal(t, snapshots.Failed, h.status("other", "grab", "phase"))
	assert.Contains(t, h.status("other", "grab", "message"), "snapshot nightly belongs to VolumeSnapshot evil/granted")
	h.create("other", "missing", "um", map[string]any{"snapshotName": "nope"})
	h.settle("other", "missing")
	assert.Contains(t, h.status("other", "missing", "message"), "spec.source.snapshotName: snapshot nope not found")

	h.remove("other", "grab")
	assert.Equal(t, "evil", h.owner("nightly").Namespace, "a refused object's deletion leaves the binding")
	h.remove("evil", "granted")
	assert.Equal(t, snapshots.Ready, h.phase("nightly"), "released, kept")
	assert.Nil(t, h.owner("nightly"))
}

// Issue #48 (3): an object's claim is a claim of its namespace.
// #48, the outside review of the fix: a claim of the namespace that only
// names an operator's PV (Pending) is no source.
func TestSnapshotObjectsDecoyClaimIsNoSource(t *testing.T) {
	decoy := originClaim()
	decoy.Namespace, decoy.Status.Phase = "evil", corev1.ClaimPending
	h := newObjects(t, decoy)
	h.create("evil", "steal", "u1", map[string]any{"persistentVolumeClaimName": "origin"})
	h.settle("evil", "steal")
	assert.Equal(t, snapshots.Failed, h.status("evil", "steal", "phase"))
	assert.Contains(t, h.status("evil", "steal", "message"), "not bound to its PersistentVolume")
	all, err := h.snaps.List(h.ctx, "")
	require.NoError(t, err)
	assert.Empty(t, all, "nothing taken of the volume it names")
}

func TestSnapshotObjectsClaimOfItsNamespace(t *testing.T) {
	c := originClaim() // apps/origin, bound to the source volume
	h := newObjects(t, c)
	h.create("evil", "steal", "u1", map[string]any{"persistentVolumeClaimName": "origin"})
	h.settle("evil", "steal")
	assert.Equal(t, snapshots.Failed, h.status("evil", "steal", "phase"))
	assert.Contains(t, h.status("evil", "steal", "message"), "claim origin not found in namespace evil")
	h.create("apps", "mine", "u2", map[string]any{"persistentVolumeClaimName": "origin"})
	h.settle("apps", "mine")
	assert.Equal(t, snapshots.Ready, h.status("apps", "mine", "phase"))
	assert.Equal(t, "pvc-"+srcUID, h.status("apps", "mine", "volume"))
}

// A snapshot an object took before snapshots had owners (named ns-name)
// is adopted by that object, and only by it: team/a-backup does not
// adopt team-a/backup's team-a-backup.
func TestSnapshotObjectsAdoptTheirOldSnapshots(t *testing.T) {
	h := newObjects(t)
	src := sourceVolume()
	_, _, err := h.snaps.Take(h.ctx, src, "team-x", "k8s:volumesnapshot team/x")
	require.NoError(t, err)
	_, _, err = h.snaps.Take(h.ctx, src, "team-a-backup", "k8s:volumesnapshot team-a/backup")
	require.NoError(t, err)
	h.create("team", "x", "u1", vol)
	h.create("team", "a-backup", "u2", vol)
	h.settle("team", "x")
	h.settle("team", "a-backup")
	assert.Equal(t, "team-x", h.status("team", "x", "snapshot"))
	assert.Equal(t, &snapshots.Owner{Namespace: "team", Name: "x", UID: "u1"}, h.owner("team-x"))
	assert.Equal(t, SnapshotName("team", "a-backup"), h.status("team", "a-backup", "snapshot"), "its own, not team-a/backup's")
	assert.Nil(t, h.owner("team-a-backup"))
	h.settle("team", "x") // found again through its status
	assert.Equal(t, snapshots.Ready, h.status("team", "x", "phase"))
	h.remove("team", "x")
	assert.Contains(t, h.phase("team-x"), "no such snapshot")
	h.remove("team", "a-backup")
	assert.Equal(t, snapshots.Ready, h.phase("team-a-backup"), "team-a/backup's is kept")
}
