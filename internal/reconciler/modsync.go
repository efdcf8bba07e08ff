package reconciler

import (
	"context"
	"sync"
	"time"
)

// FunSyncAll puts the file roots' custom modules on a minion; the
// account's ACL allows it with the environment pinned to base (its first
// argument), so no other branch's modules can be loaded through it.
const FunSyncAll = "saltutil.sync_all"

// A node whose minion lost its cache (reinstalled with its disks and
// records intact, a new key under the same id) has no salt_volumes modules
// until they are synced: its volumes' state runs do not render. The
// reconciler asks the node to sync once per window and runs the state
// again a few times while the sync lands; past that, the failure stands.
const (
	syncWindow = 10 * time.Minute
	syncReruns = 5
)

type moduleSync struct {
	mu    sync.Mutex
	at    map[string]time.Time
	tries map[string]int
}

// syncModules says whether a run that found the modules missing on node
// should run again, asking the node to sync them first when it has not
// been asked within the window.
func (r *Reconciler) syncModules(node string) bool {
	s := &r.modSync
	s.mu.Lock()
	if s.at == nil {
		s.at, s.tries = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	ask := now.Sub(s.at[node]) > syncWindow
	if ask {
		s.at[node], s.tries[node] = now, 0
	}
	s.tries[node]++
	rerun := s.tries[node] <= syncReruns
	s.mu.Unlock()
	if !ask {
		return rerun
	}
	ctx := r.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	if _, err := r.salt.LocalAsync(ctx, node, FunSyncAll, []any{"base"}, nil); err != nil {
		r.warn.Warn("could not ask the node to sync the salt_volumes modules", "node", node, "error", err)
		return false
	}
	r.log.Info("the salt_volumes modules are missing on the node (a new minion cache?): asked it to sync them", "node", node)
	return true
}
