package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Each decision the controller makes, against client-go's fake clientset:
// what it writes to the API server and what it asks of the control plane.
// The real-cluster tests (test/kubeapi, test/kubelet) check the same with
// a kube-apiserver and a kubelet.

// recVolumes is the control plane as the controller sees it: volumes by
// name, and what it was asked.
type recVolumes struct {
	mu          sync.Mutex
	vols        map[string]*volume.Volume
	provisioned []*spec.Spec
	resized     map[string]string
	resizeErr   error
}

func (r *recVolumes) Get(name string) (*volume.Volume, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.vols[name]; ok {
		return v.Clone(), nil
	}
	return nil, store.ErrNotFound
}

func (r *recVolumes) Provision(_ context.Context, s *spec.Spec, cl *saltvolumes.Claim) (*volume.Volume, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.provisioned = append(r.provisioned, s)
	return &volume.Volume{Spec: *s, Claim: cl}, nil
}

func (r *recVolumes) Resize(_ context.Context, name, size string) (*volume.Volume, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resizeErr != nil {
		return nil, r.resizeErr
	}
	if r.resized == nil {
		r.resized = map[string]string{}
	}
	r.resized[name] = size
	return nil, nil
}

func (r *recVolumes) Touch(string) {}

// follower starts a controller whose watches run but whose workers do
// nothing (it never leads), so that each test drives one decision itself.
func follower(t *testing.T, vols *recVolumes, objs ...runtime.Object) (*Controller, *fake.Clientset) {
	t.Helper()
	cs := fake.NewSimpleClientset(objs...)
	c := New(cs, Config{StorageClass: "static", Leading: func() bool { return false }}, nil)
	c.SetVolumes(vols)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, c.Start(ctx, 10*time.Second))
	t.Cleanup(func() { c.Stop(); cancel() })
	return c, cs
}

const claimVolume = "pvc-" + uid

// claimed is the volume provisioned for testClaim, its storage ready.
func claimed(size int64) *volume.Volume {
	v := &volume.Volume{Spec: spec.Spec{Name: claimVolume, UUID: uid, Node: "node-1", Mode: spec.ModeFilesystem, FSType: "ext4",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: spec.Size(spec.FormatSize(size))}},
		Claim: &saltvolumes.Claim{Namespace: "apps", Name: "data", UID: uid, StorageClass: "sv", ReclaimPolicy: "Delete"}}
	v.Status.Phase, v.Status.Publishing = volume.Pending, true
	v.Status.PersistentPath, v.Status.Size = "/dev/disk/by-uuid/"+uid, size
	return v
}

func boundClaim(size string) *corev1.PersistentVolumeClaim {
	return testClaim(func(p *corev1.PersistentVolumeClaim) {
		p.Spec.VolumeName = claimVolume
		p.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
		p.Status.Phase = corev1.ClaimBound
		p.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}
	})
}

func TestDecisionPublish(t *testing.T) {
	ctx := context.Background()
	c, cs := follower(t, &recVolumes{}, testClass(), testClaim())
	v := claimed(1 << 30)
	require.NoError(t, c.Publish(ctx, v))
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, claimVolume, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "data", pv.Spec.ClaimRef.Name, "a claim's PV is bound to that claim from the start")
	assert.Equal(t, "sv", pv.Spec.StorageClassName)
	assert.Equal(t, corev1.PersistentVolumeReclaimDelete, pv.Spec.PersistentVolumeReclaimPolicy)
	assert.Equal(t, DefaultProvisioner, pv.Annotations[annProvisionedBy])
	assert.Equal(t, []string{Finalizer}, pv.Finalizers)
	assert.Equal(t, "1Gi", pv.Spec.Capacity.Storage().String())
	require.NotNil(t, v.Status.PersistentVolume)
	assert.Equal(t, claimVolume, v.Status.PersistentVolume.Name)
	assert.Equal(t, int64(1), c.Metrics.PVsCreated.Value())

	// Publishing again is idempotent: nothing new is created.
	require.NoError(t, c.Publish(ctx, v))
	assert.Equal(t, int64(1), c.Metrics.PVsCreated.Value())

	// A PV by that name made for another volume is never taken over.
	other := claimed(1 << 30)
	other.Spec.UUID = "00000000-0000-4000-8000-000000000001"
	other.Status.PersistentPath = "/dev/disk/by-uuid/" + other.Spec.UUID
	assert.ErrorContains(t, c.Publish(ctx, other), "was not made for this volume")
}

func TestDecisionGrow(t *testing.T) {
	ctx := context.Background()
	c, cs := follower(t, &recVolumes{}, testClass(), boundClaim("1Gi"))
	require.NoError(t, c.Publish(ctx, claimed(1<<30)))
	// The volume grew on its node: publishing it again raises the PV's
	// capacity, then the bound claim's.
	require.NoError(t, c.Publish(ctx, claimed(2<<30)))
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, claimVolume, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "2Gi", pv.Spec.Capacity.Storage().String())
	pvc, err := cs.CoreV1().PersistentVolumeClaims("apps").Get(ctx, "data", metav1.GetOptions{})
	require.NoError(t, err)
	got := pvc.Status.Capacity[corev1.ResourceStorage]
	assert.Equal(t, "2Gi", got.String())
	// Never shrunk.
	require.NoError(t, c.Publish(ctx, claimed(1<<30)))
	pv, err = cs.CoreV1().PersistentVolumes().Get(ctx, claimVolume, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "2Gi", pv.Spec.Capacity.Storage().String())
}

func TestDecisionWithdraw(t *testing.T) {
	ctx := context.Background()
	c, cs := follower(t, &recVolumes{}, testClass(), testClaim())
	v := claimed(1 << 30)
	require.NoError(t, c.Publish(ctx, v))
	pvs := cs.CoreV1().PersistentVolumes()

	// Bound to a claim: refused, and the PV stays.
	pv, err := pvs.Get(ctx, claimVolume, metav1.GetOptions{})
	require.NoError(t, err)
	pv.Status.Phase = corev1.VolumeBound
	_, err = pvs.UpdateStatus(ctx, pv, metav1.UpdateOptions{})
	require.NoError(t, err)
	v.Status.Phase, v.DeleteRequested = volume.Available, true
	done, blocked, err := c.Withdraw(ctx, v)
	require.NoError(t, err)
	assert.False(t, done)
	assert.Contains(t, blocked, "is Bound to apps/data")
	_, err = pvs.Get(ctx, claimVolume, metav1.GetOptions{})
	require.NoError(t, err, "a bound PV was deleted")

	// Released: deleted, and the storage waits until it is gone.
	pv.Status.Phase = corev1.VolumeReleased
	_, err = pvs.UpdateStatus(ctx, pv, metav1.UpdateOptions{})
	require.NoError(t, err)
	done, blocked, err = c.Withdraw(ctx, v)
	require.NoError(t, err)
	assert.False(t, done, "the storage may go only once the PV is gone")
	assert.Empty(t, blocked)
	_, err = pvs.Get(ctx, claimVolume, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err))
	done, _, err = c.Withdraw(ctx, v)
	require.NoError(t, err)
	assert.True(t, done)
	assert.Nil(t, v.Status.PersistentVolume)
}

func TestDecisionProvision(t *testing.T) {
	vols := &recVolumes{}
	c, _ := follower(t, vols, testClass(), testClaim())
	require.NoError(t, c.syncClaim(context.Background(), "apps/data"))
	require.Len(t, vols.provisioned, 1)
	s := vols.provisioned[0]
	assert.Equal(t, claimVolume, s.Name, "named after the claim's UID, so a retry finds the first")
	assert.Equal(t, "node-1", s.Node, "on the node the scheduler chose")
	assert.GreaterOrEqual(t, s.Bytes(), int64(1<<30))
	assert.Equal(t, int64(1), c.Metrics.ClaimsProvisioned.Value())

	// A claim of someone else's class is not ours to provision, nor queued.
	other := testClaim(func(p *corev1.PersistentVolumeClaim) {
		p.Name, p.UID = "theirs", "6b0c6a4e-8a7e-4c57-9a43-1b2f6f3c9d12"
		class := "theirs"
		p.Spec.StorageClassName = &class
	})
	assert.False(t, c.ofOurClass(other))
	assert.True(t, c.ofOurClass(testClaim()))
}

func TestDecisionExpand(t *testing.T) {
	allow := func(sc *storagev1.StorageClass) { yes := true; sc.AllowVolumeExpansion = &yes }
	grown := boundClaim("1Gi")
	grown.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("3Gi")
	v := claimed(1 << 30)
	v.Status.Phase, v.Status.Publishing = volume.Available, false

	vols := &recVolumes{vols: map[string]*volume.Volume{claimVolume: v}}
	c, _ := follower(t, vols, testClass(allow), grown)
	require.NoError(t, c.syncClaim(context.Background(), "apps/data"))
	require.Contains(t, vols.resized, claimVolume)
	n, err := spec.ParseSize(vols.resized[claimVolume])
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, int64(3<<30))

	// The volume is busy (its last growth runs): asked again later.
	vols.resized, vols.resizeErr = nil, &requests.ResizeError{Field: "size", Reason: "busy", Conflict: true}
	assert.ErrorIs(t, c.syncClaim(context.Background(), "apps/data"), errVolumeBusy)

	// A class without allowVolumeExpansion grows nothing.
	vols2 := &recVolumes{vols: map[string]*volume.Volume{claimVolume: v}}
	c2, _ := follower(t, vols2, testClass(), grown)
	require.NoError(t, c2.syncClaim(context.Background(), "apps/data"))
	assert.Empty(t, vols2.resized)
}

// A claim that asks for more while its volume is Locked (or Failed) is
// told once why it does not grow, and asked again every stuckRetry, not
// every second; once the volume is Available it grows.
func TestDecisionExpandWaitsForALockedVolume(t *testing.T) {
	allow := func(sc *storagev1.StorageClass) { yes := true; sc.AllowVolumeExpansion = &yes }
	grown := boundClaim("1Gi")
	grown.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("3Gi")
	v := claimed(1 << 30)
	v.Status.Phase, v.Status.Publishing = volume.Locked, false
	v.Status.Reason, v.Status.Message = reconciler.ReasonContainerClosed, "the encrypted container of "+claimVolume+" is not open on node-1"
	vols := &recVolumes{vols: map[string]*volume.Volume{claimVolume: v}}
	c, _ := follower(t, vols, testClass(allow), grown)
	rec := record.NewFakeRecorder(10)
	c.recorder = rec

	for range 3 {
		err := c.syncClaim(context.Background(), "apps/data")
		assert.ErrorIs(t, err, errVolumeStuck)
		after, ok := retryIn(err)
		assert.True(t, ok, "the claim stays queued")
		assert.Equal(t, stuckRetry, after, "asked again after stuckRetry, not every second")
	}
	assert.Empty(t, vols.resized, "a Locked volume is not asked to grow")
	require.Len(t, rec.Events, 1, "told once, not at every retry")
	ev := <-rec.Events
	assert.Contains(t, ev, "Warning VolumeResizeWaiting volume "+claimVolume+" is Locked (ContainerClosed)")
	assert.Contains(t, ev, "is not open on node-1")
	assert.GreaterOrEqual(t, stuckRetry, 10*time.Second)

	// Failed for another reason than its growth: the same.
	v.Status.Phase, v.Status.Reason, v.Status.Message = volume.Failed, reconciler.ReasonStorageLost, "node-1 has no record of this volume"
	assert.ErrorIs(t, c.syncClaim(context.Background(), "apps/data"), errVolumeStuck)
	require.Len(t, rec.Events, 1)
	assert.Contains(t, <-rec.Events, "is Failed (StorageLost)")

	// Opened: it grows, and a later lock is told again.
	v.Status.Phase, v.Status.Reason, v.Status.Message = volume.Available, "", ""
	require.NoError(t, c.syncClaim(context.Background(), "apps/data"))
	require.Contains(t, vols.resized, claimVolume)
	require.Len(t, rec.Events, 1)
	assert.Contains(t, <-rec.Events, "Normal Resizing")
	v.Status.Phase, v.Status.Reason, v.Status.Message = volume.Locked, reconciler.ReasonContainerClosed, "the encrypted container of "+claimVolume+" is not open on node-1"
	assert.ErrorIs(t, c.syncClaim(context.Background(), "apps/data"), errVolumeStuck)
	require.Len(t, rec.Events, 1, "locked again: told again")
	assert.Contains(t, <-rec.Events, "Warning VolumeResizeWaiting")
}

func TestDecisionReschedule(t *testing.T) {
	ctx := context.Background()
	c, cs := follower(t, &recVolumes{}, testClass(), testClaim())
	// Deleted before it was ever published: the claim goes back to the
	// scheduler.
	v := claimed(1 << 30)
	v.Status.Phase, v.Status.Publishing = volume.Failed, false
	require.NoError(t, c.Release(ctx, v))
	pvc, err := cs.CoreV1().PersistentVolumeClaims("apps").Get(ctx, "data", metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, pvc.Annotations, annSelectedNode)

	// A claim whose pod went to another node meanwhile keeps its choice.
	c2, cs2 := follower(t, &recVolumes{}, testClass(), testClaim(func(p *corev1.PersistentVolumeClaim) { p.Annotations[annSelectedNode] = "node-2" }))
	require.NoError(t, c2.Release(ctx, v))
	pvc, err = cs2.CoreV1().PersistentVolumeClaims("apps").Get(ctx, "data", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "node-2", pvc.Annotations[annSelectedNode])
}
