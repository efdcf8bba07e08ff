package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Starting state runs and finding out about them when no event says:
// launch, back-off, the job timeout, job cache lookups.

func (r *Reconciler) launch(ctx context.Context, v *volume.Volume, sls string, phase volume.Phase, res *Result) bool {
	name := v.Spec.Name
	wait := r.backingOff(name)
	st := &v.Status
	// Until it launches, the volume waits for no job: a JobID left from
	// its last run (the prepare of a volume now being deleted) would be
	// taken for this run's and its return applied as this run's result.
	// This pass may have just decided to back off (the run came back
	// busy): the worker hands that to the queue once the pass returns.
	if wait > 0 || res.Backoff {
		if wait > 0 {
			res.after(wait)
		}
		if st.Phase != phase || st.JobID != "" {
			r.leaveJob(st.JobID, name)
			st.Phase, st.JobID = phase, ""
			return true
		}
		return false
	}
	if run, busy := r.claimNode(v.Spec.Node, name); busy {
		// Our own run holds the minion: wait for its return (nodeFree
		// launches the first waiter). The timer is only a fallback: it
		// starts no Salt job while that run lasts.
		r.waitForNode(v.Spec.Node, name)
		res.after(r.opt.RetryDelay)
		step := fmt.Sprintf("queued: %s is running a state run for volume %s", v.Spec.Node, run.volume)
		if st.Phase != phase || st.Step != step || st.JobID != "" {
			r.leaveJob(st.JobID, name)
			st.Phase, st.Step, st.JobID = phase, step, ""
			return true
		}
		return false
	}
	r.leaveJob(st.JobID, name)
	r.dropWaiter(v.Spec.Node, name)
	// Volumes that queued for this node while it was busy, for the same
	// kind of run, are done by this run too: one state run (one Salt job,
	// one return) for all.
	batch := r.takeBatch(v.Spec.Node, name, sls, v.Wipe)
	specs := []any{v.Spec}
	for _, b := range batch {
		specs = append(specs, b.Spec)
	}
	wipe := sls == SLSUnprepared && v.Wipe
	// Who asked, per volume, in the job's metadata: the job cache names
	// the people behind a run the control plane's account published.
	asked := map[string]any{}
	for _, w := range append([]*volume.Volume{v}, batch...) {
		if w.RequestedBy != "" {
			asked[w.Spec.Name] = w.RequestedBy
		}
	}
	jctx := ctx
	if len(asked) > 0 {
		jctx = saltapi.WithMetadata(ctx, map[string]any{"salt-volumes": map[string]any{"requestedBy": asked}})
	}
	job, err := r.salt.LocalAsync(jctx, v.Spec.Node, FunApply, []any{strings.TrimPrefix(sls, "salt_volumes."), specs, wipe}, nil)
	st.Step = ""
	if err != nil {
		for _, b := range batch {
			r.waitForNode(v.Spec.Node, b.Spec.Name)
		}
		r.unclaimNode(v.Spec.Node, name)
		r.Metrics.LaunchErrors.Inc()
		var apiErr *saltapi.Error
		permanent := errors.Is(err, saltapi.ErrNoMinions) || (errors.As(err, &apiErr) && apiErr.Status == http.StatusBadRequest)
		r.warn.Warn("could not start the state run", "volume", name, "sls", sls, "error", err, "permanent", permanent)
		if !permanent {
			st.Phase, st.JobID = phase, ""
			st.Reason, st.Message = ReasonSaltUnavailable, fmt.Sprintf("could not start %s on %s, retrying: %v", sls, v.Spec.Node, err)
			res.Backoff = true
			return true
		}
		st.Phase, st.JobID = volume.Failed, ""
		st.Reason, st.Message = ReasonSaltRefused, fmt.Sprintf("Salt refused %s on %s: %v", sls, v.Spec.Node, err)
		if errors.Is(err, saltapi.ErrNoMinions) {
			st.Reason = ReasonNodeNotFound
			st.Message = fmt.Sprintf("no Salt minion matches node %q: check the node name against salt-key -L", v.Spec.Node)
		}
		v.DeleteRequested, v.Wipe = false, false
		return true
	}
	r.Metrics.JobsLaunched.Inc()
	names := []string{name}
	for _, b := range batch {
		names = append(names, b.Spec.Name)
	}
	r.log.Info("state run started", "volume", name, "node", v.Spec.Node, "sls", sls, "job", job.JID, "volumes", len(names))
	st.Phase, st.JobID, st.JobStartedAt = phase, job.JID, time.Now().UTC()
	st.Reason, st.Message = "", ""
	r.jobLog.started(name, job.JID, sls, st.JobStartedAt)
	// Each other volume takes the job id through its own worker (one
	// worker changes a volume); told before the job is indexed, so that a
	// return already seen reaches them after.
	for _, n := range names[1:] {
		r.push(n, observation{kind: obsLaunched, jid: job.JID, node: v.Spec.Node, at: st.JobStartedAt, sls: sls, wipe: v.Wipe})
	}
	r.registerJob(job.JID, names, v.Spec.Node)
	res.after(r.opt.JobTimeout)
	return true
}

// checkTimeout re-arms the job timer, or, past the timeout, asks the job
// cache once and fails the volume if the node never answered.
func (r *Reconciler) checkTimeout(ctx context.Context, v *volume.Volume, res *Result) bool {
	st := &v.Status
	r.joinJob(st.JobID, v.Spec.Name)
	left := r.opt.JobTimeout - time.Since(st.JobStartedAt)
	if left > 0 {
		res.after(left)
		return false
	}
	o, ok, err := r.lookup(ctx, v, "lookup")
	if err != nil {
		r.log.Warn("job lookup failed", "volume", v.Spec.Name, "job", st.JobID, "error", err)
		res.after(r.opt.RetryDelay)
		return false
	}
	if ok {
		removalNext(v, res)
		return r.apply(v, o, res) != unchanged
	}
	r.Metrics.JobsTimedOut.Inc()
	if r.forgetJob(st.JobID, v.Spec.Name) {
		r.nodeFree(v.Spec.Node)
	}
	r.jobLog.ended(v.Spec.Name, st.JobID, "timed out", "", time.Now().UTC())
	st.Reason = ReasonJobTimeout
	st.Message = fmt.Sprintf("no return from %s for job %s within %s: is the minion up? (salt-run jobs.lookup_jid %s)", v.Spec.Node, st.JobID, r.opt.JobTimeout, st.JobID)
	if st.Phase == volume.Terminating {
		v.DeleteRequested, v.Wipe = false, false
	}
	removalNext(v, res)
	st.Phase, st.Step = volume.Failed, ""
	return true
}

// removalNext queues the next pass of a volume whose creation ends inside
// act (timed out, or found by a late lookup) while a deletion waits for
// it: that pass starts the removal.
func removalNext(v *volume.Volume, res *Result) {
	if v.DeleteRequested && volume.CreationRunning(v) {
		res.Requeue = true
	}
}

// lookup asks the job cache about the volume's job: a return (or the job
// being unknown) becomes an observation; ok is false while it still runs.
func (r *Reconciler) lookup(ctx context.Context, v *volume.Volume, how string) (observation, bool, error) {
	r.Metrics.Lookups.Inc()
	jid := v.Status.JobID
	info, err := r.salt.ListJob(ctx, jid)
	if err != nil {
		return observation{}, false, err
	}
	if ret, ok := info.Returns[v.Spec.Node]; ok {
		return returnObservation(jid, v.Spec.Node, v.Spec.Name, how, ret), true, nil
	}
	if !info.Known {
		return observation{kind: obsLost, jid: jid}, true, nil
	}
	return observation{}, false, nil
}

// lookupPending asks the job cache once about every job a volume waits for:
// returns fired while no one listened are found there.
func (r *Reconciler) lookupPending(ctx context.Context, how string) {
	sem := make(chan struct{}, r.opt.LookupParallel)
	var wg sync.WaitGroup
	var failed sync.Once
	for _, v := range r.store.List() {
		if !waiting(v) || v.Status.JobID == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			o, ok, err := r.lookup(ctx, v, how)
			if err != nil {
				failed.Do(func() { r.log.Warn("job lookup failed; trying again shortly", "error", err) })
				r.mu.Lock()
				r.lookupRetry = true
				r.mu.Unlock()
				return
			}
			if ok {
				r.push(v.Spec.Name, o)
			}
		}()
	}
	wg.Wait()
	r.mu.Lock()
	again := r.lookupRetry
	r.lookupRetry = false
	r.mu.Unlock()
	if again && how == "lookup" && ctx.Err() == nil {
		time.AfterFunc(5*time.Second, func() { r.lookupPending(ctx, how) })
	}
}
