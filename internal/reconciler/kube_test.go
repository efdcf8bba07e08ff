package reconciler

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// fakeKube stands in for the API server in the phase machine's tests; the
// real one is exercised in test/controlplane (TestKubernetes).
type fakeKube struct {
	mu         sync.Mutex
	publishErr error
	published  int
	withdrawn  bool // the PV is gone / unused
	blocked    string
	released   []string
	lost       string
}

func (f *fakeKube) Observe(_ context.Context, v *volume.Volume) KubeVerdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	return KubeVerdict{Lost: f.lost}
}

func (f *fakeKube) Publish(_ context.Context, v *volume.Volume) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.publishErr != nil {
		return f.publishErr
	}
	f.published++
	v.Status.PersistentVolume = &saltvolumes.PersistentVolume{Name: v.Spec.Name, Phase: "Available"}
	return nil
}

func (f *fakeKube) Withdraw(_ context.Context, v *volume.Volume) (bool, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.withdrawn, f.blocked, nil
}

func (f *fakeKube) Release(_ context.Context, v *volume.Volume) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, v.Spec.Name)
	return nil
}

func (f *fakeKube) set(fn func(*fakeKube)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func TestKubeAvailableOnlyOncePublished(t *testing.T) {
	k := &fakeKube{publishErr: errors.New("apiserver down")}
	g := newRig(t, Options{Kube: k, RetryDelay: 50 * time.Millisecond})
	s := sparseSpec("k-pub")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("k-pub", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("k-pub", "prepared", true, "", device(s))))
	for {
		v = g.next("k-pub").Volume
		require.Equal(t, volume.Pending, v.Status.Phase, "not Available while the PV cannot be created")
		if v.Status.Reason == ReasonPublishFailed {
			break
		}
	}
	assert.Contains(t, v.Status.Message, "apiserver down")
	assert.Len(t, g.salt.launches(), 1, "the storage is not prepared again")
	k.set(func(f *fakeKube) { f.publishErr = nil })
	v = g.until("k-pub", "Available")
	assert.Equal(t, "Available", v.Status.PersistentVolume.Phase)
	assert.Empty(t, v.Status.Reason)
}

// The prepare job's id stays on the volume after it settles: a deletion
// waiting for its PV must not take that job's return for the unprepare's
// (it once did, and dropped the volume without unpreparing it).
func TestKubeDeletionWaitsForThePVThenUnprepares(t *testing.T) {
	k := &fakeKube{}
	g := newRig(t, Options{Kube: k})
	s := sparseSpec("k-del")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("k-del", "Pending")
	prepare := ret(v.Status.JobID, "node-1", 0, stateRet("k-del", "prepared", true, "", device(s)))
	g.send(prepare)
	g.until("k-del", "Available")

	_, err = g.r.Requests.Delete(context.Background(), "k-del", false)
	require.NoError(t, err)
	v = g.until("k-del", "Terminating")
	assert.Contains(t, v.Status.Step, "no claim holds")
	assert.Empty(t, v.Status.JobID)
	passes := g.r.Metrics.Reconciles.Value()
	g.send(prepare) // the old return again, as a lookup after a restart would find it
	g.passed(passes)
	passes = g.r.Metrics.Reconciles.Value()
	g.r.Touch("k-del")
	g.passed(passes)
	got, err := g.store.Get("k-del")
	require.NoError(t, err, "still there: its storage was not reclaimed")
	assert.Equal(t, volume.Terminating, got.Status.Phase)
	assert.Len(t, g.salt.launches(), 1, "no unprepare while a claim may hold the PV")

	k.set(func(f *fakeKube) { f.withdrawn = true })
	g.r.Touch("k-del")
	// The run is launched before its job id is saved: wait for the save.
	require.Eventually(t, func() bool {
		v, _ = g.store.Get("k-del")
		return len(g.salt.launches()) >= 2 && v.Status.JobID != ""
	}, 5*time.Second, 10*time.Millisecond)
	calls := g.salt.launches()
	assert.Equal(t, SLSUnprepared, calls[1].SLS())
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("k-del", "absent", true, "", nil)))
	g.until("k-del", store.Deleted)
	k.mu.Lock()
	assert.Equal(t, []string{"k-del"}, k.released, "the PV's finalizer is dropped with the volume")
	k.mu.Unlock()
}

func TestKubeDeletionRefusedWhenAClaimArrived(t *testing.T) {
	k := &fakeKube{blocked: "its PersistentVolume k-race is Bound to default/c"}
	g := newRig(t, Options{Kube: k})
	s := sparseSpec("k-race")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("k-race", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("k-race", "prepared", true, "", device(s))))
	g.until("k-race", "Available")
	_, err = g.r.Requests.Delete(context.Background(), "k-race", false)
	require.NoError(t, err)
	v = g.next("k-race").Volume
	for v.Status.Message == "" {
		v = g.next("k-race").Volume // the request, then the refusal
	}
	assert.Equal(t, volume.Available, v.Status.Phase)
	assert.Contains(t, v.Status.Message, "deletion refused: its PersistentVolume k-race is Bound")
	got, _ := g.store.Get("k-race")
	assert.False(t, got.DeleteRequested)
	assert.Len(t, g.salt.launches(), 1, "nothing ran on the node")
}

func TestKubeLostPVFailsTheVolume(t *testing.T) {
	k := &fakeKube{}
	g := newRig(t, Options{Kube: k})
	s := sparseSpec("k-lost")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("k-lost", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("k-lost", "prepared", true, "", device(s))))
	g.until("k-lost", "Available")
	k.set(func(f *fakeKube) { f.lost = "its PersistentVolume k-lost was deleted" })
	g.r.Touch("k-lost")
	v = g.until("k-lost", "Failed")
	assert.Equal(t, ReasonPVDeleted, v.Status.Reason)
	ok, _ := volume.CanDelete(v)
	assert.True(t, ok, "a volume whose PV is gone can be deleted")
}

// A volume adopted from someone else's state run is Available with no PV:
// a PV without a claimRef would be offered to any claim that names it.
func TestKubeAdoptedVolumesAreNotPublished(t *testing.T) {
	k := &fakeKube{}
	g := newRig(t, Options{Kube: k})
	g.send(ret("20261126333333333333", "node-1", 0, preparedByHand(t, "by-hand")))
	ev := g.next("by-hand")
	assert.Equal(t, volume.Available, ev.Volume.Status.Phase)
	assert.Equal(t, volume.OriginSalt, ev.Volume.Origin)
	passes := g.r.Metrics.Reconciles.Value()
	g.r.Touch("by-hand")
	g.passed(passes) // a reconcile pass that must publish nothing
	k.mu.Lock()
	defer k.mu.Unlock()
	assert.Zero(t, k.published, "an adopted volume got a PersistentVolume")
}
