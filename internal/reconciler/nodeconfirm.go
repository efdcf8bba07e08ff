package reconciler

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/health"
)

// Node reports are hints, like job returns on the bus: Salt's batched
// minion events let any minion put a report, envelope and all, under any
// node's tag. A report that would change a volume's phase, and a restore
// report, make the control plane run salt_volumes.status on that node and
// read its return from the job cache, which the master writes from returns
// authenticated with the node's key. Only that return moves volumes and
// counts restores; reports alone only feed what is shown (usage, capacity,
// last seen), which a lying minion can falsify but which changes nothing.

// FunStatus is the function run on a node to confirm its reports.
const FunStatus = "salt_volumes.status"

// confirmGap spaces confirmations of one node: a flood of forged reports
// costs the node at most one status run per gap.
const confirmGap = time.Second

type nodeConfirm struct {
	mu       sync.Mutex
	inflight map[string]bool
	again    map[string]bool
	waiters  map[string]chan struct{} // jid -> closed when its return is seen on the bus
	// early holds status returns seen on the bus before local_async
	// answered with their jid (a fast node, a slow salt-api), oldest first.
	early      map[string]struct{}
	earlyOrder []string
}

// maxEarly bounds the status returns remembered for a jid not known yet:
// a flood of forged ones only pushes the oldest out.
const maxEarly = 256

// confirmNode starts (or queues, if one runs) a status run on node.
func (r *Reconciler) confirmNode(node string) {
	c := &r.nodeConfirm
	c.mu.Lock()
	if c.inflight == nil {
		c.inflight, c.again, c.waiters = map[string]bool{}, map[string]bool{}, map[string]chan struct{}{}
	}
	if c.inflight[node] {
		c.again[node] = true
		c.mu.Unlock()
		return
	}
	c.inflight[node] = true
	c.mu.Unlock()
	go func() {
		for {
			start := time.Now()
			r.confirmOnce(r.runCtx(), node)
			if wait := confirmGap - time.Since(start); wait > 0 {
				time.Sleep(wait)
			}
			c.mu.Lock()
			if !c.again[node] || r.runCtx().Err() != nil {
				delete(c.inflight, node)
				c.mu.Unlock()
				return
			}
			delete(c.again, node)
			c.mu.Unlock()
		}
	}()
}

// statusReturned is the bus hint that a status job returned.
func (r *Reconciler) statusReturned(jid string) {
	c := &r.nodeConfirm
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.waiters[jid]; ok {
		delete(c.waiters, jid)
		close(ch)
		return
	}
	if c.early == nil {
		c.early = map[string]struct{}{}
	}
	c.early[jid] = struct{}{}
	c.earlyOrder = append(c.earlyOrder, jid)
	if len(c.earlyOrder) > maxEarly {
		delete(c.early, c.earlyOrder[0])
		c.earlyOrder = c.earlyOrder[1:]
	}
}

// statusWait bounds the wait for a status return: past it the job cache
// is asked once anyway (a lost bus event), and the confirmation given up.
const statusWait = 30 * time.Second

func (r *Reconciler) confirmOnce(ctx context.Context, node string) {
	c := &r.nodeConfirm
	ch := make(chan struct{})
	job, err := r.salt.LocalAsync(ctx, node, FunStatus, nil, nil)
	if err != nil {
		r.warn.Warn("could not run salt_volumes.status to confirm a node report", "node", node, "error", err)
		return
	}
	c.mu.Lock()
	if _, seen := c.early[job.JID]; seen {
		// Returned before local_async answered: the bus said so already.
		delete(c.early, job.JID)
		close(ch)
	} else {
		c.waiters[job.JID] = ch
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiters, job.JID)
		c.mu.Unlock()
	}()
	deadline := time.NewTimer(statusWait)
	defer deadline.Stop()
	select {
	case <-ctx.Done():
		return
	case <-ch:
	case <-deadline.C:
	}
	// The master fires the return just before it writes the job cache:
	// retries at 1 ms, 2 ms, ... as for job hints.
	var looked time.Time
	for try, delay := 0, time.Millisecond; try < maxHintTries; try, delay = try+1, delay*2 {
		info, err := r.cache.get(ctx, job.JID, looked)
		looked = time.Now()
		if err == nil {
			if ret, ok := info.Returns[node]; ok {
				r.applyStatus(node, job.JID, ret.Return, ret.Retcode)
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	r.warn.Warn("no confirmed salt_volumes.status return; node report not applied", "node", node, "job", job.JID)
}

// applyStatus moves the node's volumes by its confirmed status.
func (r *Reconciler) applyStatus(node, jid string, raw json.RawMessage, retcode int) {
	var st health.Status
	if err := json.Unmarshal(raw, &st); err != nil || retcode != 0 || st.Capacity == nil {
		msg := string(raw)
		if len(msg) > 300 {
			msg = msg[:300]
		}
		r.warn.Warn("salt_volumes.status failed on the node; node report not applied", "node", node, "job", jid, "retcode", retcode, "return", msg)
		return
	}
	now := time.Now()
	rep := r.Nodes.Confirmed(node, st, now)
	r.Nodes.Record(rep)
	if st.LastRestore != nil {
		if c := r.Nodes.CountRestore(node, *st.LastRestore); c.Runs > 0 {
			r.log.Info("node restored its volumes", "node", node, "runs", c.Runs, "restored", c.Restored, "failed", c.Failed)
		}
	}
	for _, v := range r.store.OnNode(node) {
		d := rep.Find(v.Spec.UUID)
		if healthNews(v, d) {
			r.push(v.Spec.Name, observation{kind: obsHealth, node: node, device: d, at: now, jid: jid})
		}
	}
	r.Metrics.NodeReportsConfirmed.Inc()
}

func (r *Reconciler) runCtx() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil {
		return context.Background()
	}
	return r.ctx
}
