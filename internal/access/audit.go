package access

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

const auditKind = "audit"

// Entry is one audited request: every change, and every refusal.
type Entry struct {
	Time   time.Time `json:"time"`
	User   string    `json:"user"`
	Role   Role      `json:"role,omitempty"`
	Groups []string  `json:"groups,omitempty"`
	Source string    `json:"source"`
	Method string    `json:"method"`
	Route  string    `json:"route"`
	Volume string    `json:"volume,omitempty"`
	UUID   string    `json:"uuid,omitempty"`
	Node   string    `json:"node,omitempty"`
	// Decision: "allowed" (and done, Status 2xx), "refused" (401/403:
	// who or what was not allowed) or "failed" (allowed, then refused by
	// validation or the store: Status and Reason say why).
	Decision string `json:"decision"`
	Status   int    `json:"status"`
	Reason   string `json:"reason,omitempty"`
	// JobID and Outcome: the Salt job that carried an allowed change out
	// and how it ended (running, succeeded, failed, retried, timed out),
	// filled in when read, while the control plane remembers the job (its
	// last 8 per volume).
	JobID   string `json:"jobId,omitempty"`
	Outcome string `json:"outcome,omitempty"`
}

// Audit keeps entries in the store, bounded by age and count, and writes
// each as a JSON line to Log.
type Audit struct {
	Records    store.Records
	Log        *slog.Logger
	MaxAge     time.Duration
	MaxEntries int

	mu     sync.Mutex
	writes int
}

// Defaults for Audit's bounds.
const (
	DefaultAuditAge     = 90 * 24 * time.Hour
	DefaultAuditEntries = 5000
)

// pruneEvery: the store is trimmed once per this many entries, not on
// each (a trim lists the whole trail).
const pruneEvery = 50

// Record stores e and logs it. Failing to store it is logged, never
// fails the request it describes (that request is done by then).
func (a *Audit) Record(ctx context.Context, e Entry) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	if a.Log != nil {
		a.Log.Info("audit", "user", e.User, "role", string(e.Role), "groups", e.Groups, "source", e.Source,
			"method", e.Method, "route", e.Route, "volume", e.Volume, "uuid", e.UUID, "node", e.Node,
			"decision", e.Decision, "status", e.Status, "reason", e.Reason)
	}
	if a.Records == nil {
		return
	}
	data, err := json.Marshal(e)
	if err == nil {
		err = a.Records.PutRecord(context.WithoutCancel(ctx), auditKind, entryKey(e.Time), data)
	}
	if err != nil && a.Log != nil {
		a.Log.Error("audit entry not stored (it is in this log)", "error", err)
	}
	a.mu.Lock()
	a.writes++
	prune := a.writes%pruneEvery == 1
	a.mu.Unlock()
	if prune {
		a.prune(context.WithoutCancel(ctx))
	}
}

// entryKey sorts by time (zero-padded nanoseconds) and tells two entries
// of the same nanosecond on two replicas apart.
func entryKey(t time.Time) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%019d-%s", t.UnixNano(), hex.EncodeToString(b))
}

func (a *Audit) bounds() (time.Duration, int) {
	age, n := a.MaxAge, a.MaxEntries
	if age <= 0 {
		age = DefaultAuditAge
	}
	if n <= 0 {
		n = DefaultAuditEntries
	}
	return age, n
}

func (a *Audit) prune(ctx context.Context) {
	recs, err := a.Records.ListRecords(ctx, auditKind)
	if err != nil {
		return
	}
	age, max := a.bounds()
	cutoff := fmt.Sprintf("%019d", time.Now().Add(-age).UnixNano())
	for i, r := range recs {
		if len(recs)-i <= max && r.Key >= cutoff {
			break
		}
		_ = a.Records.DeleteRecord(ctx, auditKind, r.Key)
	}
}

// Filter selects entries; zero fields select all.
type Filter struct {
	User   string
	Volume string
	Since  time.Time
	// Limit keeps the newest Limit entries.
	Limit int
}

// List returns the entries Filter selects, oldest first.
func (a *Audit) List(ctx context.Context, f Filter) ([]Entry, error) {
	if a.Records == nil {
		return nil, nil
	}
	recs, err := a.Records.ListRecords(ctx, auditKind)
	if err != nil {
		return nil, err
	}
	out := []Entry{}
	for _, r := range recs {
		var e Entry
		if json.Unmarshal(r.Data, &e) != nil {
			continue
		}
		if (f.User != "" && e.User != f.User) || (f.Volume != "" && e.Volume != f.Volume) || e.Time.Before(f.Since) {
			continue
		}
		out = append(out, e)
	}
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[len(out)-f.Limit:]
	}
	return out, nil
}
