package reconciler

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// maxHintTries bounds the lookups of one bus hint. The master fires the
// return event before it writes the job cache, so the first lookup can come
// too early; retries at 1 ms, 2 ms, 4 ms, ... cover about 4 s (a read of
// the job cache on disk takes well under a millisecond), after which a
// job of ours is left to its timeout and any other hint is dropped.
const maxHintTries = 12

// confirm turns bus hints into returns read from the job cache; other
// observations pass through. v is nil for a volume the store does not hold
// (a candidate for adoption).
func (r *Reconciler) confirm(ctx context.Context, name string, v *volume.Volume, obs []observation) []observation {
	out := make([]observation, 0, len(obs))
	for _, o := range obs {
		if o.kind != obsHint {
			out = append(out, o)
			continue
		}
		found, retry := r.confirmHint(ctx, name, v, o)
		out = append(out, found...)
		if retry {
			o.tries, o.looked = o.tries+1, time.Now()
			time.AfterFunc(time.Millisecond<<(o.tries-1), func() { r.push(name, o) })
		}
	}
	return out
}

// confirmHint looks the hinted job up. Only the return of the volume's own
// node counts; for a volume the store does not hold, every minion's
// return is a candidate, attributed to that (authenticated) minion.
func (r *Reconciler) confirmHint(ctx context.Context, name string, v *volume.Volume, o observation) ([]observation, bool) {
	info, err := r.cache.get(ctx, o.jid, o.looked)
	if err != nil {
		r.warn.Warn("job lookup failed", "job", o.jid, "error", err)
		return nil, o.tries+1 < maxHintTries
	}
	var nodes []string
	if v != nil {
		nodes = []string{v.Spec.Node}
	} else {
		for n := range info.Returns {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
	}
	var found []observation
	for _, n := range nodes {
		if ret, ok := info.Returns[n]; ok {
			found = append(found, returnObservation(o.jid, n, name, "event", ret))
		}
	}
	if len(found) > 0 {
		return found, false
	}
	// Every job the master published is in the cache before any return;
	// minion-made jids (salt-call) appear with their first return.
	if o.tries+1 < maxHintTries && (info.Known || o.tries < 2) {
		return nil, true
	}
	r.Metrics.Rejected.Unconfirmed.Inc()
	r.warn.Warn("job return on the event bus not confirmed by Salt's job cache; ignored", "volume", name, "job", o.jid)
	return nil, false
}

// returnObservation reads one minion's return from the job cache.
func returnObservation(jid, node, name, how string, ret saltapi.MinionReturn) observation {
	o := observation{kind: obsReturn, jid: jid, node: node, how: how, outcome: volume.OutcomeFor(name, ret.Retcode, ret.Return)}
	for _, res := range volume.StateResults(ret.Return) {
		if res.Volume == name {
			o.result = &res
			break
		}
	}
	return o
}

// jobCache shares job lookups: one highstate returning ten volumes costs
// one salt-api request, not ten.
type jobCache struct {
	salt    Salt
	lookups *metrics.Counter
	mu      sync.Mutex
	m       map[string]*jobFetch
	// done lists finished fetches in the order they finished, so that
	// expiry looks only at the oldest ones.
	done []doneFetch
	head int // done[:head] are expired
}

type doneFetch struct {
	jid string
	f   *jobFetch
}

// jobCacheTTL is how long a finished lookup is kept for other volumes of
// the same job.
const jobCacheTTL = 5 * time.Second

type jobFetch struct {
	done    chan struct{}
	started time.Time
	at      time.Time
	info    saltapi.JobInfo
	err     error
}

func newJobCache(salt Salt, lookups *metrics.Counter) *jobCache {
	return &jobCache{salt: salt, lookups: lookups, m: map[string]*jobFetch{}}
}

// get returns the job's info, joining a lookup in flight, or reusing one
// finished in the last 200 ms; with since set (a retry, whose previous
// try ended then), only a lookup that started after since, in flight or
// done: as fresh as a new one. The names of one return retry together,
// so a return of ten names costs one read of the job cache per try, not
// ten (#48: a forged return cost 21).
func (c *jobCache) get(ctx context.Context, jid string, since time.Time) (saltapi.JobInfo, error) {
	now := time.Now()
	c.mu.Lock()
	for ; c.head < len(c.done) && now.Sub(c.done[c.head].f.at) > jobCacheTTL; c.head++ {
		if d := c.done[c.head]; c.m[d.jid] == d.f {
			delete(c.m, d.jid)
		}
		c.done[c.head] = doneFetch{}
	}
	if c.head > 1024 && c.head > len(c.done)/2 {
		c.done = append(c.done[:0], c.done[c.head:]...)
		c.head = 0
	}
	f, ok := c.m[jid]
	reuse := ok && f.started.After(since) && (!since.IsZero() || f.at.IsZero() || now.Sub(f.at) < 200*time.Millisecond)
	if !reuse {
		f = &jobFetch{done: make(chan struct{}), started: now}
		c.m[jid] = f
		c.mu.Unlock()
		c.lookups.Inc()
		info, err := c.salt.ListJob(ctx, jid)
		c.mu.Lock()
		f.info, f.err, f.at = info, err, time.Now()
		close(f.done)
		c.done = append(c.done, doneFetch{jid, f})
		c.mu.Unlock()
		return info, err
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.info, f.err
	case <-ctx.Done():
		return saltapi.JobInfo{}, ctx.Err()
	}
}

// rateLog logs a warning at most once per interval per message, saying how
// many were suppressed: a flood of forged events or a salt-api outage must
// not flood the log.
type rateLog struct {
	log   *slog.Logger
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time
	quiet map[string]int
}

func newRateLog(log *slog.Logger, every time.Duration) *rateLog {
	return &rateLog{log: log, every: every, last: map[string]time.Time{}, quiet: map[string]int{}}
}

func (l *rateLog) Warn(msg string, args ...any) {
	l.mu.Lock()
	if time.Since(l.last[msg]) < l.every {
		l.quiet[msg]++
		l.mu.Unlock()
		return
	}
	n := l.quiet[msg]
	l.last[msg], l.quiet[msg] = time.Now(), 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.log.Warn(msg, args...)
}
