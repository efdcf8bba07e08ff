package reconciler

import (
	"context"
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Terms of leadership: a term runs the workers and the event source,
// writes through the term's (fenced) writer, and ends with nothing kept
// in memory; the store's watch feeds the watch streams on every replica.

// noticed takes a change from the store's watch: during a term it queues
// what someone asked for through any replica (a volume created, its
// deletion, forget or growth requested).
func (r *Reconciler) noticed(ev store.Event) {
	v, prev := ev.Volume, ev.Prev
	switch {
	case ev.Type == store.Added && v.Status.Phase == volume.Unknown:
	case ev.Type == store.Modified && prev != nil &&
		(v.DeleteRequested && !prev.DeleteRequested || v.ForgetRequested && !prev.ForgetRequested):
	case ev.Type == store.Modified && prev != nil && v.Status.Reason == ReasonResizing && prev.Status.Reason != ReasonResizing,
		ev.Type == store.Modified && v.Status.Phase == volume.Available && volume.GrowthAsked(v):
		// A growth asked for (through any replica, or in the spec of a
		// Volume object): its run starts.
	default:
		return
	}
	r.add(v.Spec.Name) // dropped unless a term is under way
}

// fencedRecords: the snapshots' records written on the term's fence, like
// its volumes: etcd's fenced writer writes records too; beside Volume
// objects the records ask the Lease's still() first; a lone control
// plane's need none.
func (r *Reconciler) fencedRecords(w store.Writer) store.Records {
	switch fw := w.(type) {
	case store.Records:
		return fw
	case interface{ Still() error }:
		return store.FenceRecords(r.Snapshots.Records, fw.Still)
	}
	return nil
}

// Run reconciles until ctx ends: the only control plane on its store.
func (r *Reconciler) Run(ctx context.Context) error { return r.Lead(ctx, r.store) }

// Lead reconciles until ctx ends, writing through w: one term of this
// replica's leadership (w fenced on it), or the whole life of a lone
// control plane. Each term starts from the store alone: job index, node
// runs and back-offs are rebuilt as the first pass looks jobs up.
func (r *Reconciler) Lead(ctx context.Context, w store.Writer) error {
	t := newTerm(r.opt.RetryDelay)
	r.mu.Lock()
	r.ctx, r.w, r.term = ctx, w, t
	r.mu.Unlock()
	defer r.endTerm()
	// Restores are counted by the leader: another replica may have led
	// and counted since this one last did.
	r.Nodes.StartCounting(time.Now())
	var wg sync.WaitGroup
	for range r.opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.work(func(name string) Result { return r.reconcile(ctx, name) })
		}()
	}
	if r.Snapshots != nil {
		// Snapshots have jobs of their own, taken and deleted by the
		// leader too.
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Snapshots.Run(ctx, r.fencedRecords(w))
		}()
	}
	// Every volume gets a first pass: Unknown ones are launched, waiting
	// ones get their timeout timer back.
	for _, v := range r.store.List() {
		t.q.Add(v.Spec.Name)
	}
	if r.opt.PollInterval > 0 {
		r.log.Info("polling mode: no event source", "interval", r.opt.PollInterval)
		tick := time.NewTicker(r.opt.PollInterval)
		for done := false; !done; {
			select {
			case <-ctx.Done():
				done = true
			case <-tick.C:
				r.lookupPending(ctx, "poll")
				if r.Snapshots != nil {
					r.Snapshots.Kick()
				}
			}
		}
		tick.Stop()
	} else {
		_ = r.source.Run(ctx, func() {
			go r.lookupPending(ctx, "lookup")
			if r.Snapshots != nil {
				r.Snapshots.Kick()
			}
		}, r.Handle)
	}
	t.q.ShutDown()
	wg.Wait()
	return ctx.Err()
}

// endTerm forgets what only the term's workers kept: the next term (here
// or on another replica) starts from the store.
func (r *Reconciler) endTerm() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.term = nil
	r.inbox, r.jobs, r.jobNode = map[string][]observation{}, map[string][]string{}, map[string]string{}
	r.unmatched, r.unmatchedOrder = map[string]struct{}{}, nil
	r.busyWaiters, r.nodeRuns = map[string][]string{}, map[string]nodeRun{}
}

// writer is the term's writer.
func (r *Reconciler) writer() store.Writer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.w
}

// Touch reconciles a volume again: something it depends on outside Salt
// (its PersistentVolume, its claim) changed.
func (r *Reconciler) Touch(name string) {
	if _, err := r.store.Get(name); err == nil {
		r.add(name)
	}
}
