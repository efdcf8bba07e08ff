package reconciler

import (
	"slices"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Node runs: one state run of ours per node at a time, the job index
// (jid -> its volumes), and the volumes that queued for a node meanwhile,
// done together by its next run.

// nodeRun is a state run of ours on a node.
type nodeRun struct {
	jid    string
	volume string
	at     time.Time
}

func (r *Reconciler) remember(jid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unmatched[jid] = struct{}{}
	r.unmatchedOrder = append(r.unmatchedOrder, jid)
	if len(r.unmatchedOrder) > 1024 {
		delete(r.unmatched, r.unmatchedOrder[0])
		r.unmatchedOrder = r.unmatchedOrder[1:]
	}
}

// Published tells whether jid is a run this replica started (or joined
// after a restart): the job cache overlay asks salt-api only about those.
func (r *Reconciler) Published(jid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.jobs[jid]
	return ok
}

// registerJob indexes a run of ours on node; names[0] is the volume whose
// worker started it.
func (r *Reconciler) registerJob(jid string, names []string, node string) {
	r.mu.Lock()
	r.jobs[jid] = names
	r.nodeRuns[node] = nodeRun{jid: jid, volume: names[0], at: time.Now()}
	r.jobNode[jid] = node
	_, early := r.unmatched[jid]
	delete(r.unmatched, jid)
	r.mu.Unlock()
	if early {
		for _, name := range names {
			r.push(name, observation{kind: obsHint, jid: jid})
		}
	}
}

// joinJob indexes name under jid (after a restart the index starts empty).
func (r *Reconciler) joinJob(jid, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	addName(r.jobs, jid, name)
}

// addName appends name to m[key] unless it is there; removeName takes it
// out, dropping an emptied key. The job index and the node queues are
// both such lists.
func addName(m map[string][]string, key, name string) {
	if !slices.Contains(m[key], name) {
		m[key] = append(m[key], name)
	}
}

func removeName(m map[string][]string, key, name string) {
	names := m[key]
	if i := slices.Index(names, name); i >= 0 {
		names = slices.Delete(slices.Clone(names), i, i+1)
	}
	if len(names) == 0 {
		delete(m, key)
		return
	}
	m[key] = names
}

// leaveJob drops name from jid's volumes: it waits for that run no more.
func (r *Reconciler) leaveJob(jid, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	removeName(r.jobs, jid, name)
}

// forgetJob is called when jid is over for name (it returned, timed out,
// or Salt does not know it): the run no longer holds its node. ended says
// this call freed the node (the first volume of a run to settle frees it).
func (r *Reconciler) forgetJob(jid, name string) (ended bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	removeName(r.jobs, jid, name)
	if node, ok := r.jobNode[jid]; ok {
		if r.nodeRuns[node].jid == jid {
			delete(r.nodeRuns, node)
			ended = true
		}
		if len(r.jobs[jid]) == 0 {
			delete(r.jobNode, jid)
		}
	}
	return ended
}

// claimNode reserves node for the volume's next run, or returns the run of
// another volume of ours in flight there. A run older than the job timeout
// no longer counts: its volume may be gone, and a lost return must not
// hold a node for good.
func (r *Reconciler) claimNode(node, name string) (nodeRun, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	run, ok := r.nodeRuns[node]
	if ok && run.volume != name && time.Since(run.at) < r.opt.JobTimeout && !r.opt.ConcurrentRuns {
		return run, true
	}
	r.nodeRuns[node] = nodeRun{volume: name, at: time.Now()}
	return nodeRun{}, false
}

// unclaimNode drops a claim whose run could not be started.
func (r *Reconciler) unclaimNode(node, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if run := r.nodeRuns[node]; run.volume == name && run.jid == "" {
		delete(r.nodeRuns, node)
	}
}

// waitForNode queues a volume whose run found its minion busy.
func (r *Reconciler) waitForNode(node, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busyWaiters == nil {
		r.busyWaiters = map[string][]string{}
	}
	addName(r.busyWaiters, node, name)
}

// dropWaiter takes name out of node's queue: its run started (its own, or
// another volume's that does it too).
func (r *Reconciler) dropWaiter(node, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	removeName(r.busyWaiters, node, name)
}

// nodeFree launches the first volume waiting for node at once (one: the
// minion runs one state run at a time; the others keep their turn, and
// their backoff timers stay as the fallback).
func (r *Reconciler) nodeFree(node string) {
	for {
		r.mu.Lock()
		w := r.busyWaiters[node]
		if len(w) == 0 {
			r.mu.Unlock()
			return
		}
		name := w[0]
		if len(w) == 1 {
			delete(r.busyWaiters, node)
		} else {
			r.busyWaiters[node] = w[1:]
		}
		r.mu.Unlock()
		if v, err := r.store.Get(name); err == nil && needsRun(v) {
			r.forgetBackoff(name)
			r.add(name)
			return
		}
		// Gone, or started by a run that prepared it with another volume,
		// meanwhile: the turn goes to the next one.
	}
}

// takeBatch takes from node's queue the volumes the run of sls being
// started by first can do too, up to BatchSize in all. The store's
// snapshot decides what the run does on the node, so only volumes it shows
// wanting that run are taken; one whose worker has not stored its wait
// yet stays queued for the next run. A volume deleted meanwhile still
// takes the prepare run it was counted in (joined gives its worker the job
// id), and its removal waits for that run's return, as for any deletion
// requested during a creation; a removal's wipe cannot change once
// Terminating.
func (r *Reconciler) takeBatch(node, first, sls string, wipe bool) []*volume.Volume {
	if r.opt.ConcurrentRuns || r.opt.BatchSize <= 1 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var batch []*volume.Volume
	var keep []string
	for _, n := range r.busyWaiters[node] {
		if n == first || len(batch) >= r.opt.BatchSize-1 {
			keep = append(keep, n)
			continue
		}
		b, err := r.store.Get(n)
		if err != nil || b.Spec.Node != node || !wantsRun(b, sls, wipe) {
			keep = append(keep, n)
			continue
		}
		batch = append(batch, b)
		r.forgetBackoffLocked(n)
	}
	if len(keep) == 0 {
		delete(r.busyWaiters, node)
	} else {
		r.busyWaiters[node] = keep
	}
	return batch
}

// joined applies the start of a run of another volume that does this one
// too.
func (r *Reconciler) joined(v *volume.Volume, o observation, res *Result) effect {
	st := &v.Status
	name := v.Spec.Name
	if o.node != v.Spec.Node || !wantsRun(v, o.sls, o.wipe) {
		// Changed meanwhile: the run does it anyway; what the volume now
		// wants waits for the node as usual.
		r.leaveJob(o.jid, name)
		return unchanged
	}
	r.dropWaiter(v.Spec.Node, name)
	res.Forget = true
	st.Phase = volume.Pending
	if o.sls == SLSUnprepared {
		st.Phase = volume.Terminating
	}
	st.JobID, st.JobStartedAt = o.jid, o.at
	st.Step, st.Reason, st.Message = "", "", ""
	r.jobLog.started(name, o.jid, o.sls, o.at)
	res.after(r.opt.JobTimeout)
	return changed
}

// needsPrepareRun tells whether v waits for a state run to prepare it.
func needsPrepareRun(v *volume.Volume) bool {
	st := &v.Status
	return !v.DeleteRequested && (st.Phase == volume.Unknown || (st.Phase == volume.Pending && st.JobID == "" && !st.Publishing))
}

// needsRemovalRun tells whether v waits for a state run to remove it. A
// deletion requested while the creating run is out waits for its return:
// the node may be writing the volume right now, and the return (success or
// failure) tells what there is to remove.
func needsRemovalRun(v *volume.Volume) bool {
	return v.DeleteRequested && !volume.CreationRunning(v) && (v.Status.Phase != volume.Terminating || v.Status.JobID == "")
}

// needsRun tells whether v waits for a state run of either kind.
func needsRun(v *volume.Volume) bool { return needsPrepareRun(v) || needsRemovalRun(v) }

// queuedForRemoval tells whether v waits for its node to run its removal:
// Terminating without a job, which its worker sets only past the
// withdrawal of its PersistentVolume (Kubernetes mode), so another
// volume's run may remove it.
func queuedForRemoval(v *volume.Volume, wipe bool) bool {
	return v.DeleteRequested && v.Wipe == wipe && v.Status.Phase == volume.Terminating && v.Status.JobID == ""
}

// wantsRun tells whether v wants a run of sls (with wipe, for removals).
func wantsRun(v *volume.Volume, sls string, wipe bool) bool {
	if sls == SLSUnprepared {
		return queuedForRemoval(v, wipe)
	}
	return needsPrepareRun(v)
}
