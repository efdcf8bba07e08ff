package kube

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Events: what claims and Volume objects are told (kubectl describe).

// report tells a provisioned volume's claim what happened to it: failures
// and the steps of its preparation, once each.
func (c *Controller) report(v *volume.Volume) {
	cl := v.Claim
	if cl == nil {
		return
	}
	if v.Status.PersistentVolume != nil && v.Status.Phase == volume.Available {
		// Settled: the next lock or failure is news again.
		c.forgetSaid(v.Spec.Name)
		return
	}
	st := v.Status
	var kind, reason, msg string
	switch {
	case st.Phase == volume.Failed && st.Reason == reconciler.ReasonResizeFailed:
		kind, reason, msg = corev1.EventTypeWarning, "VolumeResizeFailed", fmt.Sprintf("growing volume %s on %s failed: %s", v.Spec.Name, v.Spec.Node, st.Message)
	case st.Phase == volume.Pending && st.Reason == reconciler.ReasonResizing:
		return // said when the growth started (Resizing)
	case st.Phase == volume.Locked:
		// The claim is where kubectl describe leads from a pod stuck
		// mounting: the kubelet only says the device is not there.
		kind, reason, msg = corev1.EventTypeWarning, "VolumeLocked", fmt.Sprintf("volume %s on %s is Locked (%s): %s; pods using it wait until it is opened", v.Spec.Name, v.Spec.Node, st.Reason, st.Message)
	case st.Phase == volume.Failed:
		kind, reason, msg = corev1.EventTypeWarning, "ProvisioningFailed", fmt.Sprintf("volume %s failed on %s (%s): %s", v.Spec.Name, v.Spec.Node, st.Reason, st.Message)
	case st.Phase == volume.Pending && st.Reason != "":
		kind, reason, msg = corev1.EventTypeWarning, "ProvisioningRetrying", fmt.Sprintf("volume %s on %s (%s): %s", v.Spec.Name, v.Spec.Node, st.Reason, st.Message)
	case st.Phase == volume.Pending && st.Step != "":
		kind, reason, msg = corev1.EventTypeNormal, "ProvisioningProgress", fmt.Sprintf("volume %s on %s: %s", v.Spec.Name, v.Spec.Node, st.Step)
	default:
		return
	}
	c.sayOnce(cl, v.Spec.Name, kind, reason, msg)
}

func (c *Controller) event(cl *saltvolumes.Claim, kind, reason, msg string) {
	if c.recorder == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: cl.Namespace, Name: cl.Name, UID: types.UID(cl.UID)}
	c.recorder.Event(ref, kind, reason, msg)
}

// sayOnce is event, once for each message under key until forgetSaid:
// a claim asked again and again is told what holds it only when that
// changes.
func (c *Controller) sayOnce(cl *saltvolumes.Claim, key, kind, reason, msg string) {
	c.mu.Lock()
	dup := c.reported[key] == msg
	c.reported[key] = msg
	c.mu.Unlock()
	if !dup {
		c.event(cl, kind, reason, msg)
	}
}

func (c *Controller) forgetSaid(keys ...string) {
	c.mu.Lock()
	for _, k := range keys {
		delete(c.reported, k)
	}
	c.mu.Unlock()
}

// Classes lists the StorageClasses we provision for (for the API).
func (c *Controller) Classes() []*storagev1.StorageClass {
	all, _ := c.classes.List(labels.Everything())
	var out []*storagev1.StorageClass
	for _, sc := range all {
		if sc.Provisioner == c.cfg.Provisioner {
			out = append(out, sc)
		}
	}
	return out
}

// VolumeEvent records, as Events on a Volume object (kubectl describe
// volume), each change of its phase and each Salt job started for it. uid
// is the object's. Called by the leader only, for every change of the
// store.
func (c *Controller) VolumeEvent(ev store.Event, uid string) {
	if c.recorder == nil || ev.Type != store.Modified || ev.Prev == nil {
		return
	}
	v, p := &ev.Volume.Status, &ev.Prev.Status
	ref := &corev1.ObjectReference{Kind: "Volume", APIVersion: "salt-volumes.io/v1alpha1", Name: ev.Volume.Spec.Name, UID: types.UID(uid)}
	if v.JobID != "" && v.JobID != p.JobID {
		sls := reconciler.SLSPrepared
		if v.Phase == volume.Terminating {
			sls = reconciler.SLSUnprepared
		}
		c.recorder.Eventf(ref, corev1.EventTypeNormal, "SaltCall", "%s started on %s: job %s", sls, ev.Volume.Spec.Node, v.JobID)
	}
	if v.Phase != p.Phase {
		kind := corev1.EventTypeNormal
		if v.Phase == volume.Failed || v.Phase == volume.Locked {
			kind = corev1.EventTypeWarning
		}
		from := p.Phase
		if from == volume.Unknown {
			from = "Accepted"
		}
		msg := fmt.Sprintf("%s -> %s", from, v.Phase)
		if v.Reason != "" {
			msg += " (" + v.Reason + ")"
		}
		if v.Message != "" {
			msg += ": " + v.Message
		}
		c.recorder.Event(ref, kind, "StateTransition", msg)
	}
}
