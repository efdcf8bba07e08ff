package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// PersistentVolumes: what the reconciler asks of a volume's PV (Observe,
// Publish, Withdraw, Release), and the PV watch's changes.

// ours reports whether pv was made by us for the volume with this uuid.
func ours(pv *corev1.PersistentVolume, uuid string) bool {
	return pv.Labels[LabelManagedBy] == ManagedBy && pv.Labels[LabelUUID] == uuid
}

func pvStatus(pv *corev1.PersistentVolume) *saltvolumes.PersistentVolume {
	s := &saltvolumes.PersistentVolume{Name: pv.Name, Phase: string(pv.Status.Phase), Terminating: pv.DeletionTimestamp != nil}
	if s.Phase == "" {
		s.Phase = string(corev1.VolumePending)
	}
	if r := pv.Spec.ClaimRef; r != nil && r.Name != "" {
		s.Claim = r.Namespace + "/" + r.Name
	}
	return s
}

func samePV(a, b *saltvolumes.PersistentVolume) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// Observe implements reconciler.Kubernetes.
func (c *Controller) Observe(ctx context.Context, v *volume.Volume) reconciler.KubeVerdict {
	name := v.Spec.Name
	var cur *saltvolumes.PersistentVolume
	pv, err := c.pvs.Get(name)
	if err == nil && ours(pv, v.Spec.UUID) {
		cur = pvStatus(pv)
	} else if v.Status.Phase == volume.Available && v.Status.PersistentVolume != nil {
		// Missing from the watch: ask the API server before deciding the
		// PV is gone (the watch may lag behind our own create).
		live, gerr := c.cs.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case gerr == nil && ours(live, v.Spec.UUID):
			cur = pvStatus(live)
		case gerr != nil && !apierrors.IsNotFound(gerr):
			return reconciler.KubeVerdict{} // cannot tell; the next event or resync will
		}
	}
	if cur != nil && pv != nil && ours(pv, v.Spec.UUID) {
		if moved := c.moveClass(ctx, v, pv); moved != nil {
			cur = pvStatus(moved)
		}
	}
	prev := v.Status.PersistentVolume
	kv := reconciler.KubeVerdict{Changed: !samePV(prev, cur)}
	v.Status.PersistentVolume = cur
	defer c.report(v)
	if v.DeleteRequested {
		return kv
	}
	if v.Status.Phase == volume.Available {
		switch {
		case cur == nil && (prev == nil || prev.Claim == ""):
			// Never an adopted volume: it was not made to be offered.
			kv.Republish = v.Origin != volume.OriginSalt
		case cur == nil:
			kv.Lost = fmt.Sprintf("its PersistentVolume %s was deleted outside salt-volumes while claimed by %s; the data is kept on %s: delete the volume (salt-volumes rm %s) when it is no longer needed", name, prev.Claim, v.Spec.Node, name)
		case cur.Terminating:
			kv.Lost = fmt.Sprintf("its PersistentVolume %s is being deleted outside salt-volumes (kubectl delete pv); the data is kept on %s: delete the volume (salt-volumes rm %s) to finish, and create it again if it is still needed", name, v.Spec.Node, name)
		}
	}
	if cl := v.Claim; cl != nil && cl.ReclaimPolicy == string(corev1.PersistentVolumeReclaimDelete) {
		switch {
		case cur != nil && cur.Phase == string(corev1.VolumeReleased):
			kv.Reclaim = true
		case cur == nil && v.Status.Phase != volume.Pending && !c.claimExists(cl):
			kv.Reclaim = true
		}
	}
	if cl := v.Claim; cl != nil && !kv.Reclaim && cur == nil && v.Status.Phase == volume.Failed {
		if pvc, err := c.pvcs.PersistentVolumeClaims(cl.Namespace).Get(cl.Name); err == nil {
			kv.Reprovision = reprovision(v, pvc)
		}
	}
	return kv
}

// moveClass puts the PV of a volume made with the CLI, the REST API, the
// UI or a Volume object (no claim of its own) into kubernetes.storageClass
// when it is in another class and no claim holds it. That is the upgrade
// from the days when such PVs went into the class claims are provisioned
// from (salt-volumes), where any claim of that class, in any namespace,
// could bind one by naming it. A PV's storageClassName may change (its
// source, volume mode and node affinity may not); only the leader moves,
// on the PV as the API server has it, at its resourceVersion, so that a
// claim bound meanwhile wins. A PV with a claimRef (Bound, being bound, or
// Released) keeps its class: moving it would not unbind its claim; it is
// logged once. It returns the moved PV, or nil.
func (c *Controller) moveClass(ctx context.Context, v *volume.Volume, pv *corev1.PersistentVolume) *corev1.PersistentVolume {
	want := c.cfg.StorageClass
	if v.Claim != nil || v.DeleteRequested || pv.DeletionTimestamp != nil || pv.Spec.StorageClassName == want || !c.leading() {
		return nil
	}
	if r := pv.Spec.ClaimRef; r != nil {
		if _, seen := c.classReported.LoadOrStore(pv.UID, true); !seen {
			c.log.Warn("a PersistentVolume of a volume made through the API, CLI, UI or Volume objects stays in its class while a claim holds it: any claim of that class could bind it; it moves to kubernetes.storageClass once no claim holds it (delete the claim, then clear the Released PV's claimRef, or delete and recreate the volume)",
				"pv", pv.Name, "storageClass", pv.Spec.StorageClassName, "claim", r.Namespace+"/"+r.Name, "want", want)
		}
		return nil
	}
	api := c.cs.CoreV1().PersistentVolumes()
	var moved *corev1.PersistentVolume
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, pv.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !ours(cur, v.Spec.UUID) || cur.DeletionTimestamp != nil || cur.Spec.ClaimRef != nil || cur.Spec.StorageClassName == want {
			return nil
		}
		from := cur.Spec.StorageClassName
		cur.Spec.StorageClassName = want
		if moved, err = api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return err
		}
		c.log.Info("PersistentVolume moved to the class of volumes made through the API, CLI, UI or Volume objects: claims of "+from+" no longer bind it",
			"pv", pv.Name, "from", from, "to", want)
		return nil
	})
	if err != nil {
		c.log.Warn("could not move a PersistentVolume to kubernetes.storageClass; retrying at the next reconcile", "pv", pv.Name, "storageClass", want, "error", err)
		return nil
	}
	return moved
}

func (c *Controller) claimExists(cl *saltvolumes.Claim) bool {
	pvc, err := c.pvcs.PersistentVolumeClaims(cl.Namespace).Get(cl.Name)
	return err == nil && string(pvc.UID) == cl.UID
}

// Publish implements reconciler.Kubernetes.
func (c *Controller) Publish(ctx context.Context, v *volume.Volume) error {
	want, err := c.build(v)
	if err != nil {
		return err
	}
	api := c.cs.CoreV1().PersistentVolumes()
	got, err := api.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = api.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case err != nil:
		case !ours(got, v.Spec.UUID):
			return fmt.Errorf("a PersistentVolume named %s already exists and was not made for this volume (its %s label is %q): delete or rename it", want.Name, LabelUUID, got.Labels[LabelUUID])
		case got.DeletionTimestamp != nil:
			return fmt.Errorf("the previous PersistentVolume %s is still being deleted", want.Name)
		default:
			got, err = c.grow(ctx, got, want.Spec.Capacity.Storage())
		}
	} else if err == nil {
		// Between creating the PV and recording the volume Available.
		failpoint.Hit("pv-created")
		c.Metrics.PVsCreated.Inc()
		c.log.Info("PersistentVolume created", "volume", v.Spec.Name, "node", v.Spec.Node, "size", got.Spec.Capacity.Storage().String())
	}
	if err != nil {
		return fmt.Errorf("creating PersistentVolume %s: %w", want.Name, err)
	}
	v.Status.PersistentVolume = pvStatus(got)
	if cl := v.Claim; cl != nil {
		c.event(cl, corev1.EventTypeNormal, "ProvisioningSucceeded", fmt.Sprintf("Successfully provisioned volume %s: %s on Salt minion %s (%s)",
			v.Spec.Name, spec.FormatSize(v.Status.Size), v.Spec.Node, v.Status.PersistentPath))
	}
	return nil
}

// grow raises the capacity of a volume's PV to what the volume grew to,
// and then that of its claim, as the external resizer does for CSI
// volumes: the in-tree local volume plugin expands nothing, and the
// filesystem was grown online on the node already.
func (c *Controller) grow(ctx context.Context, pv *corev1.PersistentVolume, size *resource.Quantity) (*corev1.PersistentVolume, error) {
	api := c.cs.CoreV1().PersistentVolumes()
	name := pv.Name
	raised := pv.Spec.Capacity.Storage().Cmp(*size) < 0
	if raised {
		// pv changes only on success: a failed Update returns an empty
		// object, and the retry reads the PV again by its name.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := api.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.Spec.Capacity.Storage().Cmp(*size) < 0 {
				cur.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: *size}
				if cur, err = api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
					return err
				}
			}
			pv = cur
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("raising the capacity of PersistentVolume %s to %s: %w", name, size, err)
		}
		c.log.Info("PersistentVolume capacity raised", "pv", name, "size", size.String())
	}
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.Name == "" {
		return pv, nil
	}
	pvcs := c.cs.CoreV1().PersistentVolumeClaims(ref.Namespace)
	var grown *corev1.PersistentVolumeClaim
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := pvcs.Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case pvc.UID != ref.UID || pvc.Spec.VolumeName != pv.Name:
			return nil
		}
		if cur, ok := pvc.Status.Capacity[corev1.ResourceStorage]; !ok || cur.Cmp(*size) >= 0 {
			return nil // not bound yet (the binder sets it), or as large
		}
		pvc.Status.Capacity[corev1.ResourceStorage] = *size
		if pvc.Status.AllocatedResources != nil {
			pvc.Status.AllocatedResources[corev1.ResourceStorage] = *size
		}
		delete(pvc.Status.AllocatedResourceStatuses, corev1.ResourceStorage)
		pvc.Status.Conditions = slices.DeleteFunc(pvc.Status.Conditions, func(c corev1.PersistentVolumeClaimCondition) bool {
			return c.Type == corev1.PersistentVolumeClaimResizing || c.Type == corev1.PersistentVolumeClaimFileSystemResizePending
		})
		grown, err = pvcs.UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("raising the capacity of claim %s/%s to %s: %w", ref.Namespace, ref.Name, size, err)
	}
	if grown != nil {
		c.log.Info("claim capacity raised", "claim", ref.Namespace+"/"+ref.Name, "size", size.String())
	}
	// Once per growth, whoever raised the claim's capacity: kubelet may,
	// seeing the PV larger than the claim (its local plugin "expands" a
	// filesystem we grew already).
	if raised || grown != nil {
		c.event(&saltvolumes.Claim{Namespace: ref.Namespace, Name: ref.Name, UID: string(ref.UID)}, corev1.EventTypeNormal,
			"VolumeResizeSuccessful", fmt.Sprintf("volume %s grown to %s", pv.Name, size))
	}
	return pv, nil
}

// Withdraw implements reconciler.Kubernetes. It reads the PV from the API
// server, not the watch: a deletion is decided on the freshest state.
func (c *Controller) Withdraw(ctx context.Context, v *volume.Volume) (bool, string, error) {
	api := c.cs.CoreV1().PersistentVolumes()
	pv, err := api.Get(ctx, v.Spec.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		v.Status.PersistentVolume = nil
		return true, "", nil
	case err != nil:
		return false, "", err
	case !ours(pv, v.Spec.UUID):
		return true, "", nil // someone else's PV by that name: not ours to delete
	}
	v.Status.PersistentVolume = pvStatus(pv)
	if pv.DeletionTimestamp == nil {
		switch pv.Status.Phase {
		case corev1.VolumeBound, corev1.VolumePending:
			ok, why := volume.CanDelete(v)
			if !ok {
				return false, why, nil
			}
		}
		uid := pv.UID
		if err := api.Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
			return false, "", fmt.Errorf("deleting PersistentVolume %s: %w", pv.Name, err)
		}
		c.Metrics.PVsDeleted.Inc()
		c.log.Info("PersistentVolume deleted; waiting until no claim holds it", "volume", v.Spec.Name)
		return false, "", nil
	}
	// Kubernetes removes its pv-protection finalizer once no claim is
	// bound to the PV: that is when the storage may go.
	return !slices.Contains(pv.Finalizers, pvProtection), "", nil
}

// Release implements reconciler.Kubernetes.
func (c *Controller) Release(ctx context.Context, v *volume.Volume) error {
	c.forgetSaid(v.Spec.Name, growKey(v.Spec.Name))
	err := c.release(ctx, v.Spec.Name, v.Spec.UUID)
	if v.Claim != nil && v.Status.PersistentVolume == nil {
		err = errors.Join(err, c.unselect(ctx, v))
	}
	return err
}

// unselect gives the claim of a volume deleted before it was ever
// published back to the scheduler, as Kubernetes' own provisioners do: it
// removes the claim's selected-node annotation if it still names the
// volume's node. The scheduler then places the claim's pod again, perhaps
// on another node, and names that node on the claim, which provisions a
// new volume there. Without it the pod would wait on a node that will not
// get its volume.
func (c *Controller) unselect(ctx context.Context, v *volume.Volume) error {
	cl := v.Claim
	node, err := c.cfg.Nodes.NodeName(v.Spec.Node)
	if err != nil {
		return nil
	}
	api := c.cs.CoreV1().PersistentVolumeClaims(cl.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := api.Get(ctx, cl.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if string(pvc.UID) != cl.UID || pvc.Spec.VolumeName != "" || pvc.DeletionTimestamp != nil || pvc.Annotations[annSelectedNode] != node {
			return nil
		}
		delete(pvc.Annotations, annSelectedNode)
		if _, err := api.Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("giving claim %s/%s back to the scheduler: %w", cl.Namespace, cl.Name, err)
		}
		c.log.Info("claim given back to the scheduler", "claim", cl.Namespace+"/"+cl.Name, "volume", v.Spec.Name, "node", node)
		c.event(cl, corev1.EventTypeNormal, "Rescheduling", fmt.Sprintf("volume %s was deleted before it was ready on node %s (see the ProvisioningFailed event): the claim goes back to the scheduler to pick a node again",
			v.Spec.Name, node))
		return nil
	})
}

// release drops our finalizer from the PV name made for uuid, and deletes
// it if no one has: its volume is gone.
func (c *Controller) release(ctx context.Context, name, uuid string) error {
	api := c.cs.CoreV1().PersistentVolumes()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pv, err := api.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if !ours(pv, uuid) {
			return nil
		}
		if pv.DeletionTimestamp == nil {
			uid := pv.UID
			if err := api.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			c.Metrics.PVsDeleted.Inc()
			if pv, err = api.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return nil
			} else if err != nil {
				return err
			}
		}
		if !slices.Contains(pv.Finalizers, Finalizer) {
			return nil
		}
		pv.Finalizers = slices.DeleteFunc(pv.Finalizers, func(f string) bool { return f == Finalizer })
		if _, err := api.Update(ctx, pv, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		c.Metrics.FinalizersReleased.Inc()
		c.log.Info("PersistentVolume released", "volume", name)
		return nil
	})
}

// pvChanged re-reconciles the PV's volume. A PV of ours being deleted whose
// volume is gone (the control plane stopped between reclaiming the storage
// and dropping the finalizer, or the volume was forgotten) is released.
func (c *Controller) pvChanged(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pv, ok := o.(*corev1.PersistentVolume)
	if !ok || pv.Labels[LabelManagedBy] != ManagedBy || c.vols == nil {
		return
	}
	if _, err := c.vols.Get(pv.Name); err == nil {
		c.vols.Touch(pv.Name)
		return
	}
	// Only the leader releases: a follower's cache may lag the store.
	if pv.DeletionTimestamp != nil && slices.Contains(pv.Finalizers, Finalizer) && c.leading() {
		c.spawn(func() {
			ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
			defer cancel()
			if err := c.release(ctx, pv.Name, pv.Labels[LabelUUID]); err != nil {
				c.log.Warn("could not release the PersistentVolume of a deleted volume", "pv", pv.Name, "error", err)
			}
		})
	}
}
