// Package leader elects the one replica that reconciles, with etcd's
// concurrency package: each replica holds a session (a lease it keeps
// alive) and campaigns under one key prefix; the oldest campaign key leads.
// Leadership is a context: it ends the moment the lease is lost, a fenced
// write finds the leader key gone, or the replica stops.
package leader

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

// Elector campaigns for one replica.
type Elector struct {
	Client *clientv3.Client
	// Prefix is the election's key prefix (<store prefix>/leader).
	Prefix string
	// TTL is the session's lease (whole seconds, at least 2).
	TTL time.Duration
	// ID and URL name this replica to the others.
	ID, URL string
	Log     *slog.Logger

	leading atomic.Bool
	leader  atomic.Value // string: the current leader's "ID URL"
}

// Leading reports whether this replica leads now.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Leader names the leader as last seen ("" when none was seen).
func (e *Elector) Leader() string {
	s, _ := e.leader.Load().(string)
	return s
}

// Run campaigns until ctx ends. Each time this replica wins, lead runs
// with a context that ends with the term and the fence its writes must
// carry; the fence's Lost ends the term.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context, f *store.Fence)) {
	if e.Log == nil {
		e.Log = slog.New(slog.DiscardHandler)
	}
	ttl := max(2, int(e.TTL.Seconds()))
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(e.Client, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			e.Log.Warn("election: no session with etcd; retrying", "error", err, "in", backoff)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 200 * time.Millisecond
		e.term(ctx, sess, lead)
		sess.Close() // revokes the lease if it is still ours
	}
}

// term campaigns on one session and leads until the session or ctx ends.
func (e *Elector) term(ctx context.Context, sess *concurrency.Session, lead func(context.Context, *store.Fence)) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-sctx.Done():
		}
	}()
	el := concurrency.NewElection(sess, e.Prefix)
	go e.observe(sctx, el)
	if err := el.Campaign(sctx, e.ID+" "+e.URL); err != nil {
		if sctx.Err() == nil {
			e.Log.Warn("election: campaign failed", "error", err)
			sleep(sctx, time.Second)
		}
		return
	}
	tctx, end := context.WithCancel(sctx)
	fence := &store.Fence{Key: el.Key(), Rev: el.Rev(), Lost: end}
	e.leading.Store(true)
	e.leader.Store(e.ID + " " + e.URL)
	e.Log.Info("leading: this replica reconciles", "replica", e.ID, "leaderKey", el.Key(), "revision", el.Rev())
	lead(tctx, fence)
	e.leading.Store(false)
	end()
	if sess.Ctx().Err() == nil && ctx.Err() == nil {
		e.Log.Warn("leadership ended while the session lives (a fenced write found the leader key gone)")
	} else {
		e.Log.Info("leadership ended", "replica", e.ID)
	}
	// A successor need not wait for the lease to run out.
	rctx, c := context.WithTimeout(context.Background(), 2*time.Second)
	_ = el.Resign(rctx)
	c()
}

// observe keeps the leader's name current, for followers' /readyz.
func (e *Elector) observe(ctx context.Context, el *concurrency.Election) {
	for resp := range el.Observe(ctx) {
		if len(resp.Kvs) > 0 {
			e.leader.Store(string(resp.Kvs[0].Value))
		}
	}
}

// Describe splits a leader value ("ID URL", a Lease's "ID URL
// INCARNATION") into its id and URL.
func Describe(v string) (id, url string) {
	id, rest, _ := strings.Cut(v, " ")
	url, _, _ = strings.Cut(rest, " ")
	return id, url
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
