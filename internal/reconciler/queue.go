package reconciler

import (
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"k8s.io/client-go/util/workqueue"
)

// Result is what one reconcile pass decided about the volume's next pass.
// Every retry and wake-up is decided here and handed to the queue in one
// place (the worker), never scheduled from inside the pass.
type Result struct {
	// Requeue: another pass as soon as a worker is free (a request came in
	// while this pass saved, or this pass started what the next finishes).
	Requeue bool
	// RequeueAfter: another pass after this long at the latest (the job's
	// timeout, a lookup to try again).
	RequeueAfter time.Duration
	// Backoff: a transient failure (a busy minion, salt-api or the API
	// server down): another pass after the volume's exponential backoff
	// (RetryDelay doubling up to a minute), and no state run before it
	// even if an event wakes the volume earlier.
	Backoff bool
	// Forget: the volume's backoff starts over (it succeeded, was removed,
	// or its node became free).
	Forget bool
}

// after asks for a pass after d at the latest; the earliest ask wins.
func (res *Result) after(d time.Duration) {
	if res.RequeueAfter == 0 || d < res.RequeueAfter {
		res.RequeueAfter = d
	}
}

// backoff is the queue's rate limiter: client-go's per-item exponential
// one, which also remembers until when each volume waits, so that a pass an
// event brings early starts no state run before its time.
type backoff struct {
	workqueue.TypedRateLimiter[string]
	mu    sync.Mutex
	until map[string]time.Time
}

func newBackoff(first time.Duration) *backoff {
	return &backoff{
		TypedRateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[string](first, time.Minute),
		until:            map[string]time.Time{},
	}
}

func (b *backoff) When(name string) time.Duration {
	d := b.TypedRateLimiter.When(name)
	b.mu.Lock()
	b.until[name] = time.Now().Add(d)
	b.mu.Unlock()
	return d
}

func (b *backoff) Forget(name string) {
	b.TypedRateLimiter.Forget(name)
	b.mu.Lock()
	delete(b.until, name)
	b.mu.Unlock()
}

// wait is how long name still backs off.
func (b *backoff) wait(name string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Until(b.until[name])
}

// term is one term's queue: client-go's work queue (one volume never on two
// workers, repeated adds coalesced, delayed adds, per-volume backoff) and
// its rate limiter, dropped whole when the term ends.
type term struct {
	q       workqueue.TypedRateLimitingInterface[string]
	backoff *backoff
}

func newTerm(retryDelay time.Duration) *term {
	b := newBackoff(retryDelay)
	return &term{
		backoff: b,
		q: workqueue.NewTypedRateLimitingQueueWithConfig[string](b,
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "volumes", MetricsProvider: metrics.WorkQueues}),
	}
}

// work runs passes until the queue shuts down, handing each pass's Result
// to the queue.
func (t *term) work(reconcile func(string) Result) {
	for {
		name, shutdown := t.q.Get()
		if shutdown {
			return
		}
		res := reconcile(name)
		if res.Forget {
			t.q.Forget(name)
		}
		// The backoff first: a pass asked for at once must find it set.
		if res.Backoff {
			t.q.AddRateLimited(name)
		}
		if res.Requeue {
			t.q.Add(name)
		}
		if res.RequeueAfter > 0 {
			t.q.AddAfter(name, res.RequeueAfter)
		}
		t.q.Done(name)
	}
}

// add queues name during a term, and drops it between terms (a follower
// queues nothing: its first pass lists the store anyway).
func (r *Reconciler) add(name string) {
	r.mu.Lock()
	t := r.term
	r.mu.Unlock()
	if t != nil {
		t.q.Add(name)
	}
}

// forgetBackoff starts name's backoff over, from another volume's worker:
// the node it waited for is free, or another run does it.
func (r *Reconciler) forgetBackoff(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgetBackoffLocked(name)
}

func (r *Reconciler) forgetBackoffLocked(name string) {
	if r.term != nil {
		r.term.q.Forget(name)
	}
}

// backingOff is how long name still backs off in this term.
func (r *Reconciler) backingOff(name string) time.Duration {
	r.mu.Lock()
	t := r.term
	r.mu.Unlock()
	if t == nil {
		return 0
	}
	return t.backoff.wait(name)
}
