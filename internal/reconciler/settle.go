package reconciler

import (
	"context"
	"fmt"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Applying observations: a job return settles the volume that waited for
// it, another run's updates or removes it; act starts what the volume needs
// next.

func (r *Reconciler) apply(v *volume.Volume, o observation, res *Result) effect {
	st := &v.Status
	switch o.kind {
	case obsProgress:
		if o.node != v.Spec.Node {
			r.Metrics.Rejected.Progress.Inc()
			r.warn.Warn("progress event from another minion ignored", "volume", v.Spec.Name, "node", v.Spec.Node, "from", o.node)
			return unchanged
		}
		if o.uuid != v.Spec.UUID || o.step == "" {
			return unchanged
		}
		now := time.Now().UTC()
		switch {
		case !waiting(v):
			// The return overtook it (Salt 3006): the job's log keeps it.
			r.jobLog.late(v.Spec.Name, o.step, o.seq, now, o.total > 0)
			return unchanged
		case r.stepBehind(v, o.seq):
			// A later step is shown already; the log puts this one before it
			// (a long step's report only if its step is not there yet).
			if o.step != st.Step {
				r.jobLog.step(v.Spec.Name, st.JobID, o.step, o.seq, now, o.total > 0)
			}
			return unchanged
		case o.step == st.Step:
			// A long step reports its bytes as it goes: shown, not logged
			// again, and saved at most once each progressSaveEvery (a
			// write of the volume, and an event to every watcher, each),
			// but for the last report. Only while a job runs.
			if o.total == 0 || st.JobID == "" || st.Progress != nil && st.Progress.Step == o.step && st.Progress.Done == o.done && st.Progress.Total == o.total {
				return unchanged
			}
			// The last report is saved at once, once: a sender of
			// one "last" report after another waits like any other.
			final := o.done == o.total && (st.Progress == nil || st.Progress.Done != st.Progress.Total)
			if !final && !r.progressDue(v.Spec.Name, now) {
				return unchanged
			}
			st.Progress = &saltvolumes.Progress{Step: o.step, Done: o.done, Total: o.total}
			return changed
		}
		st.Step = o.step
		st.Progress = nil
		if o.total > 0 && st.JobID != "" {
			st.Progress = &saltvolumes.Progress{Step: o.step, Done: o.done, Total: o.total}
			r.progressDue(v.Spec.Name, now)
		}
		r.jobLog.step(v.Spec.Name, st.JobID, o.step, o.seq, now, o.total > 0)
		return changed
	case obsForget:
		if st.Phase != volume.Failed && !v.NodeForgotten {
			// Failed no more (its node reported it healthy meanwhile): the
			// request lapses, or a later failure would forget the volume
			// unasked.
			r.log.Info("forget dropped", "volume", v.Spec.Name, "phase", st.Phase)
			v.ForgetRequested = false
			return changed
		}
		r.forgetJob(st.JobID, v.Spec.Name)
		r.log.Warn("volume forgotten without touching its node", "volume", v.Spec.Name, "node", v.Spec.Node, "phase", st.Phase, "reason", st.Reason, "nodeDrained", v.NodeForgotten)
		return removed
	case obsLost:
		if o.jid != st.JobID || !waiting(v) {
			return unchanged
		}
		r.forgetJob(o.jid, v.Spec.Name)
		r.Metrics.JobsRelaunched.Inc()
		r.log.Warn("job unknown to Salt; launching it again", "volume", v.Spec.Name, "job", o.jid)
		st.JobID, st.Message = "", "job "+o.jid+" was unknown to Salt; launched again"
		return changed
	case obsHealth:
		return r.applyHealth(v, o)
	case obsLaunched:
		return r.joined(v, o, res)
	case obsReturn:
		if o.jid == st.JobID && o.node == v.Spec.Node && waiting(v) {
			if o.how == "lookup" {
				r.Metrics.JobsReconstructed.Inc()
			}
			return r.settle(v, o.outcome, res)
		}
		return r.foreign(v, o)
	}
	return unchanged
}

// settle applies the return of the job the volume was waiting for.
func (r *Reconciler) settle(v *volume.Volume, out volume.Outcome, res *Result) effect {
	st := &v.Status
	name := v.Spec.Name
	ended := r.forgetJob(st.JobID, name)
	if !st.JobStartedAt.IsZero() {
		r.Metrics.JobLatency.Observe(time.Since(st.JobStartedAt).Seconds())
	}
	result := "succeeded"
	switch {
	case out.Retryable:
		result = "retried"
	case !out.OK:
		result = "failed"
	}
	r.jobLog.ended(name, st.JobID, result, out.Message, time.Now().UTC())
	if out.ModulesMissing && r.syncModules(v.Spec.Node) {
		out.Retryable = true
		out.Message += "; asked the node to sync them (saltutil.sync_all), running again"
	}
	if out.Retryable {
		// The run did not happen: another state run held the minion.
		st.JobID, st.Reason, st.Message = "", ReasonRetrying, out.Message
		res.Backoff = true
		r.waitForNode(v.Spec.Node, name)
		return changed
	}
	// A run of ours ended on this node: the minion is free for the next
	// volume that found it busy, now rather than at its backoff. (The
	// other volumes of the same run find it freed already.)
	if ended {
		r.nodeFree(v.Spec.Node)
	}
	st.Step = ""
	if st.Phase == volume.Terminating {
		if out.OK {
			r.Metrics.JobsSucceeded.Inc()
			return removed
		}
		r.Metrics.JobsFailed.Inc()
		st.Phase, st.Reason, st.Message = volume.Failed, ReasonUnprepareFailed, out.Message
		if strings.Contains(out.Message, ReasonWipeUnverified+": ") {
			st.Reason = ReasonWipeUnverified
		}
		if v.DeletionMarked {
			// kubectl delete cannot be taken back: try again, backing
			// off (a kubelet unmounts a pod's volume a moment after the
			// pod is gone).
			r.log.Info("removal failed; the Volume is marked for deletion: trying again", "volume", name, "message", out.Message)
			st.JobID = ""
			res.Backoff = true
			return changed
		}
		v.DeleteRequested, v.Wipe = false, false
		return changed
	}
	if out.OK {
		if err := out.Device.Check(&v.Spec); err != nil {
			r.Metrics.Rejected.Device.Inc()
			r.Metrics.JobsFailed.Inc()
			st.Phase, st.Reason = volume.Failed, ReasonInvalidReturn
			st.Message = fmt.Sprintf("%s returned device info that does not describe this volume: %v", v.Spec.Node, err)
			return changed
		}
		r.Metrics.JobsSucceeded.Inc()
		st.Phase, st.Reason, st.Message = volume.Available, "", ""
		st.ApplyDevice(out.Device)
		st.PreparedSize, st.Growing = v.Spec.Bytes(), false
		if r.opt.Kube != nil {
			// Available means the storage is ready and its PV exists.
			st.Phase, st.Publishing, st.Step = volume.Pending, true, stepPublish
		}
		res.Forget = true
		return changed
	}
	r.Metrics.JobsFailed.Inc()
	reason := ReasonPrepareFailed
	if st.Growing || volume.GrowthAsked(v) {
		// The volume was prepared before: this run was a growth, and the
		// volume's data is as the node left it.
		reason = ReasonResizeFailed
	}
	st.Growing = false
	st.Phase, st.Reason, st.Message = volume.Failed, reason, out.Message
	if v.DeleteRequested {
		// The removal starts in this same pass and its step replaces the
		// message: say here why the creation ended.
		r.log.Info("creation failed; the deletion asked for meanwhile starts now", "volume", name, "job", st.JobID, "message", out.Message)
	}
	return changed
}

// foreign applies the return of a state run the volume was not waiting
// for: someone's salt-call or orchestrate run, or an old job of ours.
func (r *Reconciler) foreign(v *volume.Volume, o observation) effect {
	res := o.result
	if res == nil || waiting(v) || o.node != v.Spec.Node || !res.OK {
		return unchanged
	}
	if res.Device != nil && res.Device.UUID != v.Spec.UUID {
		r.log.Warn("state return names this volume with another uuid; ignored", "volume", v.Spec.Name, "job", o.jid, "uuid", res.Device.UUID)
		return unchanged
	}
	switch res.Function {
	case "prepared":
		if res.Device == nil || v.DeleteRequested {
			return unchanged
		}
		if err := res.Device.Check(&v.Spec); err != nil {
			r.Metrics.Rejected.Device.Inc()
			r.warn.Warn("state return with device info that does not describe the volume ignored", "volume", v.Spec.Name, "job", o.jid, "error", err)
			return unchanged
		}
		if v.Status.Phase == volume.Locked || v.Status.Phase == volume.Failed && healthReason(v.Status.Reason) {
			// That phase came from the node's own status, confirmed: a
			// return from outside (an operator's run, or an old job of the
			// job cache replayed on the bus by any minion) only asks the
			// node again, and its answer moves the volume.
			r.confirmNode(v.Spec.Node)
			return unchanged
		}
		before := v.Status
		v.Status.Phase, v.Status.Reason, v.Status.Message = volume.Available, "", ""
		v.Status.ApplyDevice(res.Device)
		if before == v.Status {
			return unchanged
		}
		r.log.Info("volume status updated from a state run outside the control plane", "volume", v.Spec.Name, "job", o.jid)
		return changed
	case "unprepared":
		r.log.Info("volume unprepared outside the control plane; removing it", "volume", v.Spec.Name, "job", o.jid)
		return removed
	}
	return unchanged
}

// act starts whatever job the volume needs; it reports whether v changed.
func (r *Reconciler) act(ctx context.Context, v *volume.Volume, res *Result) bool {
	st := &v.Status
	switch {
	case needsRemovalRun(v):
		if r.opt.Kube != nil {
			if done, changed := r.withdraw(ctx, v, res); !done {
				return changed
			}
		}
		return r.launch(ctx, v, SLSUnprepared, volume.Terminating, res)
	case !v.DeleteRequested && st.Phase == volume.Pending && st.Publishing && r.opt.Kube != nil:
		return r.publish(ctx, v, res)
	case !v.DeleteRequested && st.Phase == volume.Available && volume.GrowthAsked(v):
		// A spec edited to more than was prepared (kubectl edit of a
		// Volume object): the same growth salt-volumes resize starts.
		r.log.Info("volume spec asks for more: growing it", "volume", v.Spec.Name, "size", v.Spec.Bytes())
		volume.StartGrowth(v, "growing to "+spec.FormatSize(v.Spec.Bytes()))
		res.Requeue = true
		return true
	case needsPrepareRun(v):
		if st.Phase == volume.Unknown {
			if err := v.Spec.Validate(); err != nil {
				r.log.Warn("volume refused: its spec breaks the volume contract", "volume", v.Spec.Name, "error", err)
				st.Phase, st.Reason, st.Message = volume.Failed, ReasonInvalidSpec, "spec."+err.Error()+"; delete the volume and create it again with the field fixed"
				return true
			}
			if r.Requests.BeyondLimit(v) {
				r.Requests.Refused.Inc("object")
				r.log.Warn("volume refused: over limits.volumes", "volume", v.Spec.Name, "limit", r.opt.MaxVolumes)
				st.Phase, st.Reason, st.Message = volume.Failed, ReasonLimit, (&requests.LimitError{Max: r.opt.MaxVolumes}).Error()+"; nothing ran for this volume"
				return true
			}
		}
		if h, ok := r.store.(store.Holder); ok && !h.Held(v.Spec.Name) {
			// Written once before anything runs: from then on a deletion
			// made outside the control plane (kubectl delete) waits for
			// the storage to be reclaimed.
			st.Phase, st.Step = volume.Pending, stepAccepted
			res.Requeue = true
			return true
		}
		return r.launch(ctx, v, SLSPrepared, volume.Pending, res)
	case waiting(v) && st.JobID != "":
		return r.checkTimeout(ctx, v, res)
	}
	return false
}

// stepBehind tells whether a progress step numbered seq comes before one
// already shown for the volume's running job, and remembers seq if not.
// Salt 3006's minion forwards events concurrently, so a step can arrive
// after a later one; shown then, the volume's step would go backwards.
func (r *Reconciler) stepBehind(v *volume.Volume, seq int) bool {
	if seq <= 0 {
		return false
	}
	r.stepsMu.Lock()
	defer r.stepsMu.Unlock()
	if r.steps == nil {
		r.steps = map[string]stepMark{}
	}
	last, ok := r.steps[v.Spec.Name]
	if ok && last.job == v.Status.JobID && last.uuid == v.Spec.UUID && seq < last.seq {
		return true
	}
	r.steps[v.Spec.Name] = stepMark{job: v.Status.JobID, uuid: v.Spec.UUID, seq: seq}
	return false
}

// progressSaveEvery spaces the saves of a long step's reports for one
// volume: a node sends one a second at most, a forged sender any number;
// each save is a store write (an etcd revision, a Kubernetes status
// update under client-go's rate limit) and an event to every watcher.
const progressSaveEvery = 5 * time.Second

// progressDue says whether a report of volume name may be saved now (and,
// if so, counts it as saved).
func (r *Reconciler) progressDue(name string, now time.Time) bool {
	r.stepsMu.Lock()
	defer r.stepsMu.Unlock()
	if r.progressAt == nil {
		r.progressAt = map[string]time.Time{}
	}
	if now.Sub(r.progressAt[name]) < progressSaveEvery {
		return false
	}
	r.progressAt[name] = now
	return true
}

// stepMark is the last progress step shown for a volume's job.
type stepMark struct {
	job, uuid string
	seq       int
}
