package kube

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Claims with a data source: a clone of another claim of ours (a snapshot
// taken for it, cloned, then deleted), or a restore of one of our
// snapshots. Without CSI, Kubernetes hands a claim's dataSource to the
// provisioner and checks nothing else: the source, its node and its size
// are checked here.

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
		// A VolumeSnapshot object of the claim's namespace, else a
		// snapshot taken through the API by that name.
		snap, err = c.snaps.Get(ctx, SnapshotName(pvc.Namespace, name))
		if errors.Is(err, snapshots.ErrNotFound) {
			snap, err = c.snaps.Get(ctx, name)
		}
		if errors.Is(err, snapshots.ErrNotFound) {
			return fmt.Sprintf("dataSourceRef: snapshot %s not found (salt-volumes snapshot ls lists them)", name), nil
		}
		if err != nil {
			return "", err
		}
		if snap.Phase != snapshots.Ready {
			if snap.Phase == snapshots.Pending {
				return "", errCloneWaiting
			}
			return fmt.Sprintf("dataSourceRef: snapshot %s is %s: %s", name, snap.Phase, snap.Message), nil
		}
		if snap.LV != "" {
			return fmt.Sprintf("dataSourceRef: snapshot %s is an LVM snapshot (%s) and this class provisions sparse volumes: restore it as an LV with salt-volumes create NAME --from snapshot/%s", name, snap.LV, name), nil
		}
	} else {
		src, err := c.pvcs.PersistentVolumeClaims(pvc.Namespace).Get(name)
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("dataSource: claim %s not found in namespace %s", name, pvc.Namespace), nil
		}
		if err != nil {
			return "", err
		}
		if src.Spec.VolumeName == "" {
			return "", errCloneWaiting // the source claim is not bound yet
		}
		v, err := c.vols.Get(src.Spec.VolumeName)
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
