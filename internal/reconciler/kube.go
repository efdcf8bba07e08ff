package reconciler

import (
	"context"
	"fmt"

	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Steps shown while the Kubernetes side of a volume is worked on.
const (
	stepPublish  = "creating its PersistentVolume"
	stepWithdraw = "deleting its PersistentVolume"
	// A claim's volume that failed on its node for want of capacity.
	stepReschedule = "deleting it: its claim goes back to the scheduler"
	// A Volume object the control plane takes on (its finalizer).
	stepAccepted = "accepted: its state run starts next"
)

// observeKube applies what the API server says about the volume's PV; it
// reports whether v changed.
func (r *Reconciler) observeKube(ctx context.Context, v *volume.Volume) bool {
	kv := r.opt.Kube.Observe(ctx, v)
	st := &v.Status
	changed := kv.Changed
	if v.DeleteRequested {
		return changed
	}
	switch {
	case kv.Lost != "" && st.Phase == volume.Available:
		r.log.Warn("PersistentVolume deleted outside salt-volumes", "volume", v.Spec.Name, "message", kv.Lost)
		st.Phase, st.Reason, st.Message = volume.Failed, ReasonPVDeleted, kv.Lost
		return true
	case kv.Republish && st.Phase == volume.Available:
		r.log.Info("volume has no PersistentVolume; creating it", "volume", v.Spec.Name)
		st.Phase, st.Publishing, st.Step = volume.Pending, true, stepPublish
		return true
	case kv.Reclaim:
		if ok, why := volume.CanDelete(v); !ok {
			r.log.Info("claim gone, reclaim policy Delete: deletion waits", "volume", v.Spec.Name, "reason", why)
			return changed
		}
		r.log.Info("claim gone, reclaim policy Delete: deleting the volume", "volume", v.Spec.Name, "claim", v.Claim.Namespace+"/"+v.Claim.Name)
		v.DeleteRequested, v.Wipe = true, false
		return true
	case kv.Reprovision != "" && st.Phase == volume.Failed:
		r.log.Info("claim's volume failed on its node: deleting it so that the scheduler picks a node again",
			"volume", v.Spec.Name, "node", v.Spec.Node, "claim", v.Claim.Namespace+"/"+v.Claim.Name, "why", kv.Reprovision)
		v.DeleteRequested, v.Wipe = true, false
		st.Step = stepReschedule
		return true
	}
	return changed
}

// publish creates the PV of a volume whose storage is ready.
func (r *Reconciler) publish(ctx context.Context, v *volume.Volume, res *Result) bool {
	st := &v.Status
	if err := r.opt.Kube.Publish(ctx, v); err != nil {
		r.warn.Warn("could not create the PersistentVolume", "volume", v.Spec.Name, "error", err)
		st.Reason, st.Message = ReasonPublishFailed, fmt.Sprintf("creating the PersistentVolume, retrying: %v", err)
		res.Backoff = true
		return true
	}
	res.Forget = true
	st.Phase, st.Publishing, st.Step, st.Reason, st.Message = volume.Available, false, "", "", ""
	return true
}

// withdraw deletes the volume's PV before its storage; done once no claim
// holds it. changed reports whether v changed.
func (r *Reconciler) withdraw(ctx context.Context, v *volume.Volume, res *Result) (done, changed bool) {
	st := &v.Status
	ok, blocked, err := r.opt.Kube.Withdraw(ctx, v)
	switch {
	case err != nil:
		r.warn.Warn("could not delete the PersistentVolume", "volume", v.Spec.Name, "error", err)
		// JobID still names the prepare job: clear it, so nothing waits
		// for that job's return as if it were the unprepare's.
		st.Phase, st.Step, st.JobID = volume.Terminating, stepWithdraw, ""
		st.Reason, st.Message = ReasonKubeError, fmt.Sprintf("deleting the PersistentVolume, retrying: %v", err)
		res.Backoff = true
		return false, true
	case blocked != "" && v.DeletionMarked:
		// kubectl delete marked the Volume object: that cannot be taken
		// back, so the deletion waits, and says why, until the claim
		// lets the PV go.
		step := "deletion waits: " + blocked
		if st.Step == step && st.JobID == "" {
			return false, false
		}
		st.Step, st.Reason, st.Message, st.JobID = step, "", "", ""
		return false, true
	case blocked != "":
		// The PV got a claim after the deletion was accepted: the
		// criteria say no, so the deletion is dropped, not queued.
		r.log.Info("deletion refused by the PersistentVolume's state", "volume", v.Spec.Name, "reason", blocked)
		v.DeleteRequested, v.Wipe = false, false
		if st.Phase == volume.Terminating {
			// Available unless its node says otherwise: what it was before
			// the deletion (Locked, Failed) is not kept, so ask.
			st.Phase = volume.Available
			r.confirmNode(v.Spec.Node)
		}
		st.Step, st.Reason, st.Message = "", "", "deletion refused: "+blocked
		return false, true
	case !ok:
		step := "waiting until no claim holds its PersistentVolume"
		if st.Phase == volume.Terminating && st.Step == step && st.Reason == "" && st.JobID == "" {
			return false, false
		}
		st.Phase, st.Step, st.Reason, st.Message, st.JobID = volume.Terminating, step, "", "", ""
		return false, true
	}
	return true, false
}
