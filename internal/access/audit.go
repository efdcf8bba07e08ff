package access

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

// Changes and requests that changed nothing (refused, failed) are kept
// apart, each within its own bound: nobody who may only be refused can
// push a change out of the trail.
const (
	auditKind    = "audit"
	refusedKind  = "audit-refused"
	sessionsKind = "audit-sessions"
)

// Entries are bounded in size whatever a request carried (a route may be
// 64 KiB): fields are cut to these lengths, the cut marked.
const (
	maxField  = 256
	maxReason = 1024
	maxGroups = 32
)

// Refusals repeated by one source and user, of one method, route, volume
// and node, within aggWindow are one entry with a count; its stored count is brought up to
// date at most once per aggFlush (and whenever the trail is read).
const (
	aggWindow = time.Minute
	aggFlush  = time.Second
	maxAggs   = 10000
)

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
	// Count is how many requests a refusal entry stands for (the same
	// source, user, method, route, volume and node within a minute), Last when the last
	// of them came (absent while there was one).
	Count int        `json:"count,omitempty"`
	Last  *time.Time `json:"last,omitempty"`
	// Session marks a login or a logout: kept apart from the changes (a
	// person may log in as often as they like).
	Session bool `json:"-"`
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…(cut)"
}

// bounded is e with every field within its bound.
func (e Entry) bounded() Entry {
	e.User, e.Source, e.Method = cut(e.User, maxField), cut(e.Source, maxField), cut(e.Method, 16)
	e.Route, e.Volume, e.UUID, e.Node = cut(e.Route, maxField), cut(e.Volume, maxField), cut(e.UUID, 64), cut(e.Node, maxField)
	e.Reason = cut(e.Reason, maxReason)
	if len(e.Groups) > maxGroups {
		e.Groups = append(e.Groups[:maxGroups:maxGroups], fmt.Sprintf("…(%d more)", len(e.Groups)-maxGroups))
	}
	for i, g := range e.Groups {
		e.Groups[i] = cut(g, maxField)
	}
	return e
}

type aggregate struct {
	key     string // the record's key
	e       Entry
	written time.Time
	dirty   bool
}

// Audit keeps entries in the store, bounded by age and count, and writes
// each as a JSON line to Log.
type Audit struct {
	Records    store.Records
	Log        *slog.Logger
	MaxAge     time.Duration
	MaxEntries int

	// MaxRefusals bounds the refusals kept apart from the changes
	// (default MaxEntries).
	MaxRefusals int

	mu     sync.Mutex
	writes map[string]int
	aggs   map[string]*aggregate
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
	e = e.bounded()
	if a.Log != nil {
		a.Log.Info("audit", "user", e.User, "role", string(e.Role), "groups", e.Groups, "source", e.Source,
			"method", e.Method, "route", e.Route, "volume", e.Volume, "uuid", e.UUID, "node", e.Node,
			"decision", e.Decision, "status", e.Status, "reason", e.Reason)
	}
	if a.Records == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	kind := auditKind
	switch {
	case e.Decision != "allowed":
		a.aggregate(ctx, e)
		return
	case e.Session:
		kind = sessionsKind
	}
	a.put(ctx, kind, entryKey(e.Time), e)
}

// aggregate counts a refusal into the entry of its kind within aggWindow,
// or starts one.
func (a *Audit) aggregate(ctx context.Context, e Entry) {
	k := strings.Join([]string{e.Source, e.User, e.Method, e.Route, e.Volume, e.Node, e.Decision, strconv.Itoa(e.Status)}, "\x00")
	a.mu.Lock()
	if a.aggs == nil {
		a.aggs = map[string]*aggregate{}
	}
	g, ok := a.aggs[k]
	if ok && e.Time.Sub(g.e.Time) < aggWindow {
		g.e.Count++
		last := e.Time
		g.e.Last = &last
		flush := time.Since(g.written) >= aggFlush
		g.dirty = !flush
		if flush {
			g.written = time.Now()
		}
		key, copyOf := g.key, g.e
		a.mu.Unlock()
		if flush {
			a.put(ctx, refusedKind, key, copyOf)
		}
		return
	}
	if len(a.aggs) >= maxAggs {
		a.mu.Unlock()
		a.flush(ctx)
		a.mu.Lock()
		for key, g := range a.aggs {
			if e.Time.Sub(g.e.Time) >= aggWindow || len(a.aggs) >= maxAggs {
				delete(a.aggs, key)
			}
		}
	}
	e.Count = 1
	a.aggs[k] = &aggregate{key: entryKey(e.Time), e: e, written: time.Now()}
	key := a.aggs[k].key
	a.mu.Unlock()
	a.put(ctx, refusedKind, key, e)
}

// flush writes the counts not yet stored.
func (a *Audit) flush(ctx context.Context) {
	a.mu.Lock()
	var todo []aggregate
	for _, g := range a.aggs {
		if g.dirty {
			g.dirty, g.written = false, time.Now()
			todo = append(todo, *g)
		}
	}
	a.mu.Unlock()
	for _, g := range todo {
		a.put(ctx, refusedKind, g.key, g.e)
	}
}

func (a *Audit) put(ctx context.Context, kind, key string, e Entry) {
	data, err := json.Marshal(e)
	if err == nil {
		err = a.Records.PutRecord(ctx, kind, key, data)
	}
	if err != nil && a.Log != nil {
		a.Log.Error("audit entry not stored (it is in this log)", "error", err)
	}
	a.mu.Lock()
	if a.writes == nil {
		a.writes = map[string]int{}
	}
	a.writes[kind]++
	prune := a.writes[kind]%pruneEvery == 1
	a.mu.Unlock()
	if prune {
		a.prune(ctx, kind)
	}
}

// entryKey sorts by time (zero-padded nanoseconds) and tells two entries
// of the same nanosecond on two replicas apart.
func entryKey(t time.Time) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%019d-%s", t.UnixNano(), hex.EncodeToString(b))
}

func (a *Audit) bounds(kind string) (time.Duration, int) {
	age, n := a.MaxAge, a.MaxEntries
	if age <= 0 {
		age = DefaultAuditAge
	}
	if n <= 0 {
		n = DefaultAuditEntries
	}
	if kind != auditKind && a.MaxRefusals > 0 {
		n = a.MaxRefusals
	}
	return age, n
}

func (a *Audit) prune(ctx context.Context, kind string) {
	recs, err := a.Records.ListRecords(ctx, kind)
	if err != nil {
		return
	}
	age, max := a.bounds(kind)
	cutoff := fmt.Sprintf("%019d", time.Now().Add(-age).UnixNano())
	for i, r := range recs {
		if len(recs)-i <= max && r.Key >= cutoff {
			break
		}
		_ = a.Records.DeleteRecord(ctx, kind, r.Key)
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
	a.flush(ctx)
	recs, err := a.Records.ListRecords(ctx, auditKind)
	if err != nil {
		return nil, err
	}
	for _, kind := range []string{refusedKind, sessionsKind} {
		more, err := a.Records.ListRecords(ctx, kind)
		if err != nil {
			return nil, err
		}
		recs = append(recs, more...)
	}
	// Each is sorted by key, and a key starts with its entry's time.
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key })
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
