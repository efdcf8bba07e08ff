package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/record"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// A claim whose volume is Locked is told why its pods wait, once each
// time it locks, as a warning; so is the Volume object, on the transition.
func TestLockedVolumeWarnsItsClaimOnce(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	c := &Controller{recorder: rec, reported: map[string]string{}}
	v := &volume.Volume{Spec: spec.Spec{Name: "db-0", UUID: "0b1c9a3e-5d0f-4f4e-9a43-0c4d7e2a9b11", Node: "node-1", Mode: spec.ModeFilesystem, FSType: "ext4"}, Claim: &saltvolumes.Claim{Namespace: "apps", Name: "data-db-0", UID: "u1"}}
	v.Status.PersistentVolume = &saltvolumes.PersistentVolume{Name: "db-0", Phase: "Bound", Claim: "apps/data-db-0"}
	v.Status.Phase, v.Status.Reason, v.Status.Message = volume.Locked, reconciler.ReasonContainerClosed, "the encrypted container of db-0 is not open on node-1"
	c.report(v)
	c.report(v)
	require.Len(t, rec.Events, 1)
	ev := <-rec.Events
	assert.Contains(t, ev, "Warning VolumeLocked volume db-0 on node-1 is Locked (ContainerClosed)")
	assert.Contains(t, ev, "pods using it wait until it is opened")

	// Opened, then locked again (a second boot without its key): told
	// again.
	locked := v.Status
	v.Status.Phase, v.Status.Reason, v.Status.Message = volume.Available, "", ""
	c.report(v)
	v.Status = locked
	c.report(v)
	require.Len(t, rec.Events, 1, "each lock is told")
	assert.Contains(t, <-rec.Events, "Warning VolumeLocked")

	prev := *v
	prev.Status.Phase, prev.Status.Reason, prev.Status.Message = volume.Available, "", ""
	c.VolumeEvent(store.Event{Type: store.Modified, Volume: v, Prev: &prev}, "uid-1")
	require.Len(t, rec.Events, 1)
	assert.Contains(t, <-rec.Events, "Warning StateTransition Available -> Locked (ContainerClosed)")
}
