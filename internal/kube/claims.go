package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Claims: provisioning a volume for each claim of our classes once its node
// is chosen, growing it when the claim asks for more.

// ofOurClass tells whether a claim names a StorageClass we provision for:
// only those are queued, so a cluster's other claims cost a lister read.
func (c *Controller) ofOurClass(pvc *corev1.PersistentVolumeClaim) bool {
	if pvc.Spec.StorageClassName == nil {
		return false
	}
	sc, err := c.classes.Get(*pvc.Spec.StorageClassName)
	return err == nil && sc.Provisioner == c.cfg.Provisioner
}

func (c *Controller) queueAllClaims() {
	pvcs, err := c.pvcs.List(labels.Everything())
	if err != nil {
		return
	}
	for _, pvc := range pvcs {
		c.queueRestore(pvc)
		if !c.ofOurClass(pvc) {
			continue
		}
		if key, err := cache.MetaNamespaceKeyFunc(pvc); err == nil {
			c.claims.Add(key)
		}
	}
}

func (c *Controller) claimChanged(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pvc, ok := o.(*corev1.PersistentVolumeClaim)
	if !ok || c.vols == nil {
		return
	}
	// A claim's volume learns of its claim's changes (deletion, binding).
	c.vols.Touch("pvc-" + string(pvc.UID))
	if c.leading() {
		c.queueRestore(pvc)
	}
	if !c.leading() || !c.ofOurClass(pvc) {
		return // a follower's are queued when it leads (followLeadership)
	}
	if key, err := cache.MetaNamespaceKeyFunc(pvc); err == nil {
		c.claims.Add(key)
	}
}

func (c *Controller) nextClaim(ctx context.Context) bool {
	key, quit := c.claims.Get()
	if quit {
		return false
	}
	defer c.claims.Done(key)
	if !c.leading() {
		// Leadership was lost after the claim was queued: the next leader
		// queues every claim when it takes over.
		c.claims.Forget(key)
		return true
	}
	err := c.syncClaim(ctx, key)
	if after, ok := retryIn(err); ok {
		c.claims.Forget(key)
		c.claims.AddAfter(key, after)
		return true
	}
	if err != nil {
		c.log.Warn("provisioning failed; retrying", "claim", key, "error", err)
		c.claims.AddRateLimited(key)
		return true
	}
	c.claims.Forget(key)
	return true
}

// errVolumeBusy: the claim's volume cannot grow yet (being prepared,
// published or grown): asked again in a moment.
var errVolumeBusy = errors.New("the claim's volume is busy")

// errVolumeStuck: the claim's volume cannot grow until someone acts on it
// (Locked: its container opened; Failed: mended): asked again every
// stuckRetry rather than every second, and said once on the claim.
var errVolumeStuck = errors.New("the claim's volume waits for an operator")

const stuckRetry = 30 * time.Second

// retryIn says when a claim whose sync ended with err is asked again; not
// ok: by the queue's rate limiter (a failure), or not at all (nil).
func retryIn(err error) (time.Duration, bool) {
	switch {
	case errors.Is(err, errVolumeLeaving), errors.Is(err, errVolumeBusy), errors.Is(err, errCloneWaiting):
		return time.Second, true
	case errors.Is(err, errVolumeStuck):
		return stuckRetry, true
	}
	return 0, false
}

// expand grows a bound claim's volume when the claim asks for more than it
// has (kubectl edit of spec.resources.requests.storage; the API server
// lets that through only for classes with allowVolumeExpansion). The
// volume's PV and the claim's capacity follow once the node is done
// (Publish).
func (c *Controller) expand(ctx context.Context, pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass, v *volume.Volume) error {
	if pvc.Spec.VolumeName != v.Spec.Name || v.Spec.SparseLoopDevice == nil {
		return nil
	}
	req, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return nil
	}
	want, err := sparseSizeFor(&v.Spec, req.Value())
	if err != nil {
		return nil // the request was checked when provisioned; a change the sizing refuses shows on the resize
	}
	cur, _ := spec.ParseSize(string(v.Spec.SparseLoopDevice.Size))
	if want <= cur {
		return nil
	}
	cl := &saltvolumes.Claim{Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID)}
	if sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
		c.event(cl, corev1.EventTypeWarning, "VolumeResizeFailed", fmt.Sprintf("StorageClass %s does not set allowVolumeExpansion: true", sc.Name))
		return nil
	}
	if st := v.Status; st.Phase == volume.Locked || st.Phase == volume.Failed && st.Reason != volume.ReasonResizeFailed {
		c.sayOnce(cl, growKey(v.Spec.Name), corev1.EventTypeWarning, "VolumeResizeWaiting", fmt.Sprintf(
			"volume %s is %s (%s), so it cannot grow to %s yet; it grows once it is Available again: %s", v.Spec.Name, st.Phase, st.Reason, spec.FormatSize(want), st.Message))
		return errVolumeStuck
	}
	// Not stuck (any more): the next wait is news again.
	c.forgetSaid(growKey(v.Spec.Name))
	if _, err := c.vols.Resize(ctx, v.Spec.Name, spec.FormatSize(want)); err != nil {
		var re *requests.ResizeError
		if errors.As(err, &re) && re.Conflict {
			return errVolumeBusy
		}
		c.event(cl, corev1.EventTypeWarning, "VolumeResizeFailed", fmt.Sprintf("growing volume %s to %s: %v", v.Spec.Name, spec.FormatSize(want), err))
		return nil
	}
	c.log.Info("claim asks for more: growing its volume", "claim", pvc.Namespace+"/"+pvc.Name, "volume", v.Spec.Name, "size", want)
	c.event(cl, corev1.EventTypeNormal, "Resizing", fmt.Sprintf("salt-volumes is growing volume %s to %s (asked: %s) on Salt minion %s",
		v.Spec.Name, spec.FormatSize(want), req.String(), v.Spec.Node))
	return nil
}

// growKey is where sayOnce keeps what a claim of volume name was told
// about its growth (volume names have no '/': no clash with report's).
func growKey(name string) string { return "grow/" + name }

// errVolumeLeaving: the claim's previous volume is still being deleted.
var errVolumeLeaving = errors.New("the claim's previous volume is still being deleted")

// syncClaim provisions a volume for a claim of one of our classes once the
// scheduler has picked its node. Retries are safe: the volume's name and
// UUID come from the claim's UID, so a second try finds the first.
func (c *Controller) syncClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := c.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pvc.Spec.StorageClassName == nil {
		return nil
	}
	sc, err := c.classes.Get(*pvc.Spec.StorageClassName)
	if err != nil {
		sc = nil
	}
	if sc == nil || sc.Provisioner != c.cfg.Provisioner {
		return nil
	}
	if v, err := c.vols.Get("pvc-" + string(pvc.UID)); err == nil {
		if v.DeleteRequested {
			// A failed volume on its way out: the claim is provisioned
			// anew once it is gone.
			return errVolumeLeaving
		}
		return c.expand(ctx, pvc, sc, v)
	}
	minion := ""
	if node := pvc.Annotations[annSelectedNode]; node != "" {
		if minion, err = c.cfg.Nodes.Minion(ctx, node); err != nil {
			return err
		}
	}
	d := decideClaim(pvc, sc, c.cfg.Provisioner, minion)
	switch {
	case d.Wait:
		return nil
	case d.Refuse != "":
		c.Metrics.ClaimsRefused.Inc()
		c.event(&saltvolumes.Claim{Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID)}, corev1.EventTypeWarning, "ProvisioningFailed", d.Refuse)
		return nil
	}
	if _, _, _, _, ok := dataSource(pvc); ok {
		refuse, err := c.withSource(ctx, pvc, d.Spec)
		if err != nil {
			return err
		}
		if refuse != "" {
			c.Metrics.ClaimsRefused.Inc()
			c.event(d.Claim, corev1.EventTypeWarning, "ProvisioningFailed", refuse)
			return nil
		}
	}
	v, err := c.vols.Provision(ctx, d.Spec, d.Claim)
	if err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil
		}
		c.event(d.Claim, corev1.EventTypeWarning, "ProvisioningFailed", fmt.Sprintf("creating volume %s: %v", d.Spec.Name, err))
		return err
	}
	c.Metrics.ClaimsProvisioned.Inc()
	c.log.Info("provisioning a volume for a claim", "claim", key, "volume", v.Spec.Name, "node", v.Spec.Node, "size", d.Spec.SizeBytes)
	from := ""
	if src := d.Spec.Source; src != nil {
		from = ", a clone of snapshot " + src.Snapshot
	}
	c.event(d.Claim, corev1.EventTypeNormal, "Provisioning", fmt.Sprintf("salt-volumes is creating volume %s: a sparse %s %s volume of %s (asked: %s) on Salt minion %s%s",
		v.Spec.Name, v.Spec.Mode, v.Spec.FSType, spec.FormatSize(d.Spec.SizeBytes), d.Size, v.Spec.Node, from))
	return nil
}
