// Package api is the control plane's HTTP API: JSON over HTTP with a bearer
// token, server-sent events for watching, Prometheus metrics, health.
package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Requests records what users ask of volumes (internal/requests): the API
// only checks and forwards; the reconciler acts on what lands in the store.
type Requests interface {
	Create(ctx context.Context, s *spec.Spec) (*volume.Volume, error)
	Delete(ctx context.Context, name string, wipe bool) (*volume.Volume, error)
	Forget(ctx context.Context, name string) (*volume.Volume, error)
	ForgetNode(ctx context.Context, node string, names []string) ([]*volume.Volume, error)
	Resize(ctx context.Context, name, size string) (*volume.Volume, error)
}

// Server serves the API.
type Server struct {
	Requests Requests
	// Jobs lists a volume's state runs, newest last.
	Jobs func(volume string) []saltvolumes.Job
	// Health holds what nodes report about themselves and their volumes.
	Health *health.Registry
	// Watch fans the store's changes out to watch streams.
	Watch *store.Hub
	Store store.Reader
	// Role says what this replica does when several share a store:
	// "leader" (it reconciles) or "follower" (it serves; writes go to the
	// store and the leader acts on them). nil: the only control plane.
	Role func() Role
	// Token is the bootstrap admin token (config's token).
	Token string
	// Tokens checks every request's token (default: Token alone).
	Tokens *access.Tokens
	// Audit records changes and refusals (nil: none kept).
	Audit *access.Audit
	// Logins lets people log in with their Salt identity (nil: tokens only).
	Logins *Logins
	// Kube accepts Kubernetes bearer tokens (Kubernetes mode; nil: none).
	Kube KubeAuth
	// Snapshots of volumes (nil: none kept).
	Snapshots *snapshots.Service
	// Version is serve's, and JobTimeout how long it waits for a Salt
	// job (config's jobTimeout; 0: the reconciler's default), both told
	// by GET /api/v1/info.
	Version    string
	JobTimeout time.Duration
	// Nodes lists the minions Salt knows are up.
	Nodes func(ctx context.Context) ([]string, error)
	// Ready says why the server is not ready (nil when it is).
	Ready func() error
	// ExtraMetrics writes metrics owned by others (event source, salt-api).
	ExtraMetrics func(w *metrics.Writer)
	// UI serves the web UI at / when set.
	UI  http.Handler
	Log *slog.Logger
	// Heartbeat is the watch stream's keep-alive period (default 15s).
	Heartbeat time.Duration
	// WatchWriteTimeout ends a watch stream whose client has not taken a
	// write within it (default 10s): a client that stops reading would
	// otherwise hold its slot (limits.watchers) for ever.
	WatchWriteTimeout time.Duration
	// WatchRecheck is how often an open watch stream checks its token
	// again (default 10s): a logout, a revocation, an expiry or a lost
	// role ends the stream within it.
	WatchRecheck time.Duration
	// Limits; zero means no limit.
	MaxWatchers      int
	CreatesPerSecond float64
	// LeaderTransport carries the reads a follower passes to the leader
	// (nil: http.DefaultTransport); serve's trusts tls.caFile.
	LeaderTransport http.RoundTripper

	watchers   atomic.Int64
	tokensOnce sync.Once
	// refused counts requests without a valid token; refusedAt throttles
	// their audit entries per source.
	refused      atomic.Int64
	refusedMu    sync.Mutex
	refusedAt    map[string]time.Time
	refusedSwept time.Time
	// loginFails slows down guessing; acl caches the master's answers.
	loginFails    loginFailures
	loginsRefused atomic.Int64
	acl           aclCache
	people        personCache
	tickets       tickets
	keys          keyring
	createMu      sync.Mutex
	tokens        float64
	refilled      time.Time
}

// allowCreate is a token bucket: CreatesPerSecond, bursts of twice that.
func (s *Server) allowCreate() bool {
	if s.CreatesPerSecond <= 0 {
		return true
	}
	s.createMu.Lock()
	defer s.createMu.Unlock()
	now := time.Now()
	burst := 2 * s.CreatesPerSecond
	if s.refilled.IsZero() {
		s.tokens = burst
	} else {
		s.tokens = min(burst, s.tokens+now.Sub(s.refilled).Seconds()*s.CreatesPerSecond)
	}
	s.refilled = now
	if s.tokens < 1 {
		return false
	}
	s.tokens--
	return true
}

// Handler returns the routed handler.
func (s *Server) Handler() http.Handler {
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	if s.Heartbeat == 0 {
		s.Heartbeat = 15 * time.Second
	}
	if s.WatchWriteTimeout == 0 {
		s.WatchWriteTimeout = 10 * time.Second
	}
	if s.WatchRecheck == 0 {
		s.WatchRecheck = 10 * time.Second
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", s.readyz)
	view, op, admin := func(h http.HandlerFunc) http.Handler { return s.need(access.Viewer, h) },
		func(h http.HandlerFunc) http.Handler { return s.need(access.Operator, h) },
		func(h http.HandlerFunc) http.Handler { return s.need(access.Admin, h) }
	mux.Handle("GET /metrics", view(query(s.metrics)))
	mux.Handle("POST /api/v1/volumes", op(query(s.create)))
	mux.Handle("GET /api/v1/volumes", view(query(s.list, "node")))
	mux.Handle("GET /api/v1/volumes/{name}", view(query(s.get)))
	mux.Handle("GET /api/v1/volumes/{name}/usage", view(query(s.fromLeader(s.usage), "since")))
	mux.Handle("GET /api/v1/volumes/{name}/jobs", view(query(s.fromLeader(s.jobs))))
	mux.Handle("GET /api/v1/volumes/{name}/history", view(query(s.history)))
	mux.Handle("DELETE /api/v1/volumes/{name}", op(query(s.delete, "wipe", "forget")))
	mux.Handle("POST /api/v1/volumes/{name}/resize", op(query(s.resize)))
	mux.Handle("POST /api/v1/volumes/{name}/snapshots", op(query(s.fromLeader(s.takeSnapshot))))
	mux.Handle("GET /api/v1/volumes/{name}/snapshots", view(query(s.listSnapshots)))
	mux.Handle("GET /api/v1/snapshots", view(query(s.listSnapshots, "volume")))
	mux.Handle("GET /api/v1/snapshots/{name}", view(query(s.getSnapshot)))
	mux.Handle("DELETE /api/v1/snapshots/{name}", op(query(s.fromLeader(s.deleteSnapshot))))
	// Operator, as deleting a volume: a restore replaces the volume's
	// data with the snapshot's, as much a loss as a deletion (what was
	// written since the snapshot is gone), and nothing an operator cannot
	// already read or make (snapshot, clone).
	mux.Handle("POST /api/v1/snapshots/{name}/restore", op(query(s.fromLeader(s.restoreSnapshot))))
	// Schedules: set and removed as a snapshot is taken (operator; admin
	// for a raw device); listed with the nodes' Salt schedules, which the
	// leader hears.
	mux.Handle("PUT /api/v1/volumes/{name}/snapshot-schedule", op(query(s.fromLeader(s.setSchedule))))
	mux.Handle("DELETE /api/v1/volumes/{name}/snapshot-schedule", op(query(s.fromLeader(s.deleteSchedule))))
	mux.Handle("GET /api/v1/snapshot-schedules", view(query(s.fromLeader(s.listSchedules), "volume", "source")))
	mux.Handle("GET /api/v1/watch", s.authWatch(query(s.watch, "node", "name", "ticket")))
	mux.Handle("POST /api/v1/watch/ticket", view(query(s.watchTicket)))
	mux.Handle("GET /api/v1/nodes", view(query(s.fromLeader(s.nodes))))
	mux.Handle("POST /api/v1/nodes/{node}/forget", admin(query(s.forgetNode)))
	mux.Handle("GET /api/v1/whoami", view(query(s.whoami)))
	mux.Handle("GET /api/v1/info", view(query(s.info)))
	mux.Handle("POST /api/v1/login", query(s.login))
	mux.Handle("POST /api/v1/logout", view(query(s.logout)))
	mux.Handle("GET /api/v1/tokens", admin(query(s.listTokens)))
	mux.Handle("POST /api/v1/tokens", admin(query(s.createToken)))
	mux.Handle("DELETE /api/v1/tokens/{name}", admin(query(s.revokeToken)))
	mux.Handle("GET /api/v1/audit", admin(query(s.auditList, "user", "volume", "since", "limit")))
	mux.Handle("/api/", view(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: r.Method + " " + r.URL.Path + " is not an API endpoint"})
	}))
	if s.UI != nil {
		mux.Handle("/", s.UI)
	}
	return secureHeaders(mux)
}
