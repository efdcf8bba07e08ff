package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Claims with a data source: a clone of another claim of ours in its
// namespace (a snapshot taken for it, cloned, then deleted), or a restore
// of the snapshot of a VolumeSnapshot object of its namespace. Without
// CSI, Kubernetes hands a claim's dataSource to the provisioner and checks
// nothing else: the source, its namespace, its node and its size are
// checked here.

// Kinds of data source we provision from.
const (
	kindClaim    = "PersistentVolumeClaim"
	kindSnapshot = "VolumeSnapshot"
	ourGroup     = "salt-volumes.io"
)

// errCloneWaiting: the snapshot a clone starts from is being taken.
var errCloneWaiting = errors.New("the clone's snapshot is being taken")

// SetSnapshots lets claims be provisioned from snapshots and other claims.
func (c *Controller) SetSnapshots(s *snapshots.Service) { c.snaps = s }

// Claims lists the claims the controller watches.
func (c *Controller) Claims() corelisters.PersistentVolumeClaimLister { return c.pvcs }

// PVs lists the PersistentVolumes the controller watches.
func (c *Controller) PVs() corelisters.PersistentVolumeLister { return c.pvs }

// heldVolume is the volume a claim holds: its PV's, once the claim is
// Bound and that PV's claimRef names this very claim (namespace, name and
// uid). spec.volumeName alone is only what the claim asks for, and any
// claim may ask for any PV (it then stays Pending): a claim naming an
// operator's volume must not be a way to snapshot or clone it.
func heldVolume(pvs corelisters.PersistentVolumeLister, pvc *corev1.PersistentVolumeClaim) (string, bool) {
	if pvs == nil || pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return "", false
	}
	pv, err := pvs.Get(pvc.Spec.VolumeName)
	if err != nil || pv.Spec.ClaimRef == nil {
		return "", false
	}
	r := pv.Spec.ClaimRef
	if r.UID != pvc.UID || r.Namespace != pvc.Namespace || r.Name != pvc.Name {
		return "", false
	}
	return pv.Name, true
}

// dataSource is the claim's source, from dataSourceRef (which the API
// server fills in from dataSource too) or dataSource.
func dataSource(pvc *corev1.PersistentVolumeClaim) (group, kind, name, namespace string, ok bool) {
	if r := pvc.Spec.DataSourceRef; r != nil {
		if r.APIGroup != nil {
			group = *r.APIGroup
		}
		if r.Namespace != nil {
			namespace = *r.Namespace
		}
		return group, r.Kind, r.Name, namespace, true
	}
	if r := pvc.Spec.DataSource; r != nil {
		if r.APIGroup != nil {
			group = *r.APIGroup
		}
		return group, r.Kind, r.Name, "", true
	}
	return "", "", "", "", false
}

// checkSource refuses a data source we cannot provision from, before any
// node is involved.
func checkSource(pvc *corev1.PersistentVolumeClaim) string {
	group, kind, _, ns, ok := dataSource(pvc)
	if !ok {
		return ""
	}
	if ns != "" && ns != pvc.Namespace {
		return fmt.Sprintf("dataSourceRef.namespace %s: salt-volumes clones within the claim's own namespace (%s) only", ns, pvc.Namespace)
	}
	switch {
	case group == "" && kind == kindClaim, group == ourGroup && kind == kindSnapshot:
		return ""
	}
	return fmt.Sprintf("dataSource %s (apiGroup %q): salt-volumes provisions from another claim of its classes (kind PersistentVolumeClaim) or from one of its snapshots (apiGroup salt-volumes.io, kind VolumeSnapshot); VolumeSnapshots of snapshot.storage.k8s.io are for CSI drivers", kind, group)
}

// withSource sets the clone's source in s, taking the snapshot it starts
// from when the source is a claim. refuse says why it cannot be; a nil
// error and no refusal with s.Source unset never happens: waiting is
// errCloneWaiting.
func (c *Controller) withSource(ctx context.Context, pvc *corev1.PersistentVolumeClaim, s *spec.Spec) (refuse string, err error) {
	_, kind, name, _, _ := dataSource(pvc)
	if c.snaps == nil {
		return "this control plane keeps no snapshots: salt-volumes cannot provision from a data source here", nil
	}
	var snap snapshots.Snapshot
	if kind == kindSnapshot {
		// Only the snapshot of a VolumeSnapshot object of the claim's own
		// namespace: never one of another namespace's, nor one taken
		// through the API (an operator binds such a one to an object of
		// the namespace: spec.source.snapshotName).
		var refuse string
		snap, refuse, err = c.ownSnapshot(ctx, pvc.Namespace, name)
		if refuse != "" || err != nil {
			return refuse, err
		}
		if snap.Phase != snapshots.Ready {
			if snap.Phase == snapshots.Pending {
				return "", errCloneWaiting
			}
			return fmt.Sprintf("dataSourceRef: VolumeSnapshot %s's snapshot %s is %s: %s", name, snap.Name, snap.Phase, snap.Message), nil
		}
		if snap.LV != "" {
			return fmt.Sprintf("dataSourceRef: VolumeSnapshot %s's snapshot %s is an LVM snapshot (%s) and this class provisions sparse volumes: restore it as an LV with salt-volumes create NAME --from snapshot/%s", name, snap.Name, snap.LV, snap.Name), nil
		}
	} else {
		src, err := c.pvcs.PersistentVolumeClaims(pvc.Namespace).Get(name)
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("dataSource: claim %s not found in namespace %s", name, pvc.Namespace), nil
		}
		if err != nil {
			return "", err
		}
		held, ok := heldVolume(c.pvs, src)
		if !ok {
			return "", errCloneWaiting // the source claim is not bound (to its PV) yet
		}
		v, err := c.vols.Get(held)
		if err != nil {
			return fmt.Sprintf("dataSource: claim %s is bound to %s, which is not a salt-volumes volume", name, src.Spec.VolumeName), nil
		}
		if refuse := cloneable(v, s, "claim "+name); refuse != "" {
			return refuse, nil
		}
		if v.Status.Phase != volume.Available {
			return "", errCloneWaiting // its volume is being prepared (or grown)
		}
		// One snapshot per clone, named for the new claim: a retry finds
		// it, and it is deleted once the clone is Available.
		snap, _, err = c.snaps.TakeFor(ctx, v, "pvc-"+string(pvc.UID), "k8s:claim "+pvc.Namespace+"/"+pvc.Name, s.Name, 0)
		var se *snapshots.Error
		if errors.As(err, &se) {
			return "dataSource: " + se.Msg, nil
		}
		if err != nil {
			return "", err
		}
		switch snap.Phase {
		case snapshots.Failed:
			return fmt.Sprintf("dataSource: the snapshot of claim %s's volume %s failed: %s", name, v.Spec.Name, snap.Message), nil
		case snapshots.Ready:
		default:
			return "", errCloneWaiting
		}
	}
	if snap.Node != s.Node {
		return fmt.Sprintf("dataSource: the source is on Salt minion %s but the scheduler chose %s for this claim: a clone is made on its source's node (give the pod a nodeSelector for that node)", snap.Node, s.Node), nil
	}
	if snap.Size > s.Bytes() {
		return fmt.Sprintf("spec.resources.requests.storage: smaller than the source (%s): a clone is at least as large as its source", spec.FormatSize(snap.Size)), nil
	}
	s.Source = &spec.Source{VolumeUUID: snap.VolumeUUID, Snapshot: snap.Name}
	return "", nil
}

// cloneable says why volume v cannot be the source of clone s, or "".
func cloneable(v *volume.Volume, s *spec.Spec, what string) string {
	switch {
	case v.Spec.SparseLoopDevice == nil:
		return fmt.Sprintf("dataSource: %s's volume %s is not a sparse volume: only those are cloned", what, v.Spec.Name)
	case v.Spec.Node != s.Node:
		return fmt.Sprintf("dataSource: %s's volume %s is on Salt minion %s but the scheduler chose %s for this claim: a clone is made on its source's node (give the pod a nodeSelector for that node)", what, v.Spec.Name, v.Spec.Node, s.Node)
	case v.Spec.Mode != s.Mode:
		return fmt.Sprintf("dataSource: %s is volumeMode %s: the clone must be too", what, v.Spec.Mode)
	case v.Spec.FSType != s.FSType:
		return fmt.Sprintf("dataSource: %s holds %s but this claim's StorageClass makes %s: use a class of the same fsType", what, v.Spec.FSType, s.FSType)
	}
	return ""
}

// ownSnapshot is the snapshot that belongs to VolumeSnapshot object
// ns/name (its owner recorded with it): the one the object took, or the
// existing one an operator bound to it. refuse says why there is none,
// without naming anything of another namespace.
func (c *Controller) ownSnapshot(ctx context.Context, ns, name string) (snapshots.Snapshot, string, error) {
	snap, owner, err := c.snaps.Lookup(ctx, SnapshotName(ns, name))
	if err == nil && owner != nil && owner.Namespace == ns && owner.Name == name {
		return snap, "", nil
	}
	if err != nil && !errors.Is(err, snapshots.ErrNotFound) {
		return snapshots.Snapshot{}, "", err
	}
	owned, err := c.snaps.OwnedBy(ctx, ns, name)
	if err != nil {
		return snapshots.Snapshot{}, "", err
	}
	switch len(owned) {
	case 1:
		return owned[0], "", nil
	case 0:
		return snapshots.Snapshot{}, fmt.Sprintf("dataSourceRef: VolumeSnapshot %s: no snapshot of that object in namespace %s (kubectl get volumesnapshots.salt-volumes.io -n %s): a claim restores only the VolumeSnapshot objects of its own namespace; a snapshot taken through the API is restored here once an operator binds it to an object of this namespace (spec.source.snapshotName)", name, ns, ns), nil
	}
	names := make([]string, len(owned))
	for i, s := range owned {
		names[i] = s.Name
	}
	return snapshots.Snapshot{}, fmt.Sprintf("dataSourceRef: VolumeSnapshot %s: snapshots %s all belong to an object of that name (an earlier one's finalizer was removed by hand?): an operator deletes the stale one (salt-volumes snapshot rm)", name, strings.Join(names, ", ")), nil
}
