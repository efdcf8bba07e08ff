// Package api is the control plane's HTTP API: JSON over HTTP with a bearer
// token, server-sent events for watching, Prometheus metrics, health.
package api

import (
	"bytes"
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Requests records what users ask of volumes (internal/requests): the API
// only checks and forwards; the reconciler acts on what lands in the store.
type Requests interface {
	Create(s *spec.Spec) (*volume.Volume, error)
	Delete(name string, wipe bool) (*volume.Volume, error)
	Forget(name string) (*volume.Volume, error)
	ForgetNode(node string, names []string) ([]*volume.Volume, error)
	Resize(name, size string) (*volume.Volume, error)
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
	Role  func() Role
	Token string
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
	// Limits; zero means no limit.
	MaxWatchers      int
	CreatesPerSecond float64

	watchers atomic.Int64
	createMu sync.Mutex
	tokens   float64
	refilled time.Time
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
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", s.auth(query(s.metrics)))
	mux.Handle("POST /api/v1/volumes", s.auth(query(s.create)))
	mux.Handle("GET /api/v1/volumes", s.auth(query(s.list, "node")))
	mux.Handle("GET /api/v1/volumes/{name}", s.auth(query(s.get)))
	mux.Handle("GET /api/v1/volumes/{name}/usage", s.auth(query(s.fromLeader(s.usage), "since")))
	mux.Handle("GET /api/v1/volumes/{name}/jobs", s.auth(query(s.fromLeader(s.jobs))))
	mux.Handle("DELETE /api/v1/volumes/{name}", s.auth(query(s.delete, "wipe", "forget")))
	mux.Handle("POST /api/v1/volumes/{name}/resize", s.auth(query(s.resize)))
	mux.Handle("GET /api/v1/watch", s.authQuery(query(s.watch, "node", "name", "access_token")))
	mux.Handle("GET /api/v1/nodes", s.auth(query(s.fromLeader(s.nodes))))
	mux.Handle("POST /api/v1/nodes/{node}/forget", s.auth(query(s.forgetNode)))
	mux.Handle("/api/", s.auth(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: r.Method + " " + r.URL.Path + " is not an API endpoint"})
	}))
	if s.UI != nil {
		mux.Handle("/", s.UI)
	}
	return secureHeaders(mux)
}

// MaxBody bounds a request body: a volume spec is a few hundred bytes.
const MaxBody = 64 << 10

// secureHeaders: API answers carry tokens' results and must not be cached
// or framed; the UI must not be framed either (clickjacking a delete).
func secureHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/metrics" {
			w.Header().Set("Cache-Control", "no-store")
			w.Header().Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
		}
		h.ServeHTTP(w, r)
	})
}

// query refuses a request whose query string names a parameter the
// endpoint does not know, or names one twice: a misspelt option (?wpie=true)
// must not be ignored and the request carried out without it.
func query(h http.HandlerFunc, known ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Message: "the query string cannot be read: " + err.Error()})
			return
		}
		for name, vals := range q {
			switch {
			case !slices.Contains(known, name):
				msg := fmt.Sprintf("%s: %s %s takes no such query parameter", name, r.Method, r.URL.Path)
				if len(known) > 0 {
					msg += " (it knows " + strings.Join(known, ", ") + ")"
				}
				writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: name, Message: msg})
				return
			case len(vals) > 1:
				writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: name, Message: name + ": given more than once: give it once"})
				return
			}
		}
		h(w, r)
	}
}

// flag reads a boolean query parameter: true/false or 1/0, in any case;
// absent is false. Anything else is refused, never read as false: a client
// asking for forget=yes must not get its storage deleted instead.
func flag(r *http.Request, name string) (bool, *saltvolumes.Error) {
	vals, ok := r.URL.Query()[name]
	if !ok {
		return false, nil
	}
	switch strings.ToLower(vals[0]) {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, &saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: name,
		Message: fmt.Sprintf("%s: %q is not a boolean: give true or false (or 1 or 0)", name, vals[0])}
}

// bearer returns the token of an "Authorization: Bearer <token>" header
// ("" for none or another scheme); the scheme's case does not matter (RFC
// 6750 follows RFC 7235 there).
func bearer(h string) string {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimLeft(tok, " ")
}

// auth accepts "Authorization: Bearer <token>" only.
func (s *Server) auth(h http.HandlerFunc) http.Handler { return s.checkToken(h, false) }

// authQuery also accepts access_token in the query, for the watch stream
// alone: EventSource cannot set headers, and a token in a URL is a token in
// logs and browser history, so no other endpoint takes it.
func (s *Server) authQuery(h http.HandlerFunc) http.Handler { return s.checkToken(h, true) }

func (s *Server) checkToken(h http.HandlerFunc, query bool) http.Handler {
	want := []byte(s.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := bearer(r.Header.Get("Authorization"))
		if got == "" && query {
			got = r.URL.Query().Get("access_token")
		}
		if len(want) == 0 || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="salt-volumes"`)
			writeErr(w, http.StatusUnauthorized, saltvolumes.Error{Code: saltvolumes.CodeUnauthorized, Message: "missing or wrong API token: send Authorization: Bearer <token> (SALT_VOLUMES_TOKEN for the CLI)"})
			return
		}
		h(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeErr(w http.ResponseWriter, status int, e saltvolumes.Error) {
	writeJSON(w, status, map[string]saltvolumes.Error{"error": e})
}

// Role is a replica's part.
type Role struct {
	Leader bool
	// LeaderID names the replica that leads ("" while none does), URL is
	// where its API answers.
	LeaderID, URL string
}

// forwardedHeader marks a request one replica passed to the leader: the
// leader answers it itself, whatever it believes about its role.
const forwardedHeader = "X-Salt-Volumes-Forwarded"

// fromLeader serves what only the leader holds in memory (node reports,
// usage history, job step logs): a follower passes the request on to the
// leader, token and all, and relays the answer.
func (s *Server) fromLeader(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.Role == nil || r.Header.Get(forwardedHeader) != "" {
			h(w, r)
			return
		}
		role := s.Role()
		target, err := url.Parse(role.URL)
		if role.Leader || role.URL == "" || err != nil {
			h(w, r)
			return
		}
		if !Forwardable(target) {
			// The caller's token goes with the request: never in clear
			// to another host.
			writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable,
				Message: fmt.Sprintf("this replica follows %s, which holds node reports, usage and job logs, but advertises %s: your token is not sent in clear to another host; ask the leader, or give the replicas https advertiseURLs", role.LeaderID, role.URL)})
			return
		}
		p := httputil.NewSingleHostReverseProxy(target)
		p.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
			writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable,
				Message: fmt.Sprintf("this replica follows %s, which holds node reports, usage and job logs, and could not be reached: %v", role.LeaderID, err)})
		}
		r.Header.Set(forwardedHeader, "1")
		p.ServeHTTP(w, r)
	}
}

// Forwardable says whether a follower may pass a request, with its
// caller's token, to the leader at u: over https, or on this host.
func Forwardable(u *url.URL) bool {
	if u.Scheme == "https" {
		return true
	}
	host := u.Hostname()
	ip := net.ParseIP(host)
	return u.Scheme == "http" && (host == "localhost" || ip != nil && ip.IsLoopback())
}

func (r Role) String() string {
	switch {
	case r.Leader:
		return "leader"
	case r.LeaderID != "" && r.URL != "":
		return "follower of " + r.LeaderID + " at " + r.URL
	case r.LeaderID != "":
		return "follower of " + r.LeaderID
	}
	return "follower (no leader elected)"
}

// readyz answers 200 on every replica that serves, leader or follower,
// and names the role.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.Ready != nil {
		if err := s.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	if s.Role != nil {
		fmt.Fprintf(w, "ok: %s\n", s.Role())
		return
	}
	io.WriteString(w, "ok\n")
}

// storeErr answers a write the store could not take: 503 when the backend
// is out of reach (etcd without quorum; the message says so), 500 else.
func storeErr(w http.ResponseWriter, err error) {
	var ce *store.ConflictError
	if errors.As(err, &ce) {
		w.Header().Set("Retry-After", "1")
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeBusy, Message: err.Error()})
		return
	}
	if errors.Is(err, store.ErrUnavailable) {
		w.Header().Set("Retry-After", "5")
		writeErr(w, http.StatusServiceUnavailable, saltvolumes.Error{Code: saltvolumes.CodeUnavailable,
			Message: err.Error() + ": nothing was changed (or the change is unknown: retrying is safe); reads go on from this replica's cache"})
		return
	}
	writeErr(w, http.StatusInternalServerError, saltvolumes.Error{Code: saltvolumes.CodeInternal, Message: err.Error()})
}

// ParseCreate reads a create request: the volume spec contract, with the
// uuid generated when absent and the node required.
func ParseCreate(body io.Reader) (*spec.Spec, error) {
	// Decoded strictly once (a key given twice is refused, as the node
	// binary refuses it); only then is a missing uuid filled in.
	sp, err := spec.ParseNew(body, uuid.NewString)
	if err != nil {
		return nil, err
	}
	if sp.Node == "" {
		return nil, &spec.FieldError{Field: "node", Msg: "missing: name the Salt minion that will hold the volume (salt-key -L lists them)"}
	}
	return sp, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	if !s.allowCreate() {
		w.Header().Set("Retry-After", "1")
		writeErr(w, http.StatusTooManyRequests, saltvolumes.Error{Code: saltvolumes.CodeLimit, Message: fmt.Sprintf("more than %g creates per second: slow down and retry", s.CreatesPerSecond)})
		return
	}
	sp, err := ParseCreate(r.Body)
	if err != nil {
		var fe *spec.FieldError
		if errors.As(err, &fe) {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: fe.Field, Message: fe.Error()})
			return
		}
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Message: err.Error()})
		return
	}
	v, err := s.Requests.Create(sp)
	var lerr *requests.LimitError
	if errors.As(err, &lerr) {
		writeErr(w, http.StatusTooManyRequests, saltvolumes.Error{Code: saltvolumes.CodeLimit, Message: lerr.Error()})
		return
	}
	var uerr *store.UUIDError
	if errors.As(err, &uerr) {
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeExists, Field: "uuid", Message: fmt.Sprintf("uuid: %s already belongs to volume %q: leave uuid out to get a new one", sp.UUID, uerr.Owner)})
		return
	}
	if errors.Is(err, store.ErrExists) {
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeExists, Field: "name", Message: fmt.Sprintf("name: volume %q already exists: pick another name or delete it first", sp.Name)})
		return
	}
	if err != nil {
		storeErr(w, err)
		return
	}
	s.Log.Info("volume created", "volume", sp.Name, "node", sp.Node)
	w.Header().Set("Location", "/api/v1/volumes/"+sp.Name)
	writeJSON(w, http.StatusCreated, v.View())
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	node := r.URL.Query().Get("node")
	items := []saltvolumes.View{}
	for _, v := range s.Store.List() {
		if node == "" || v.Spec.Node == node {
			items = append(items, s.view(v))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	v, err := s.Store.Get(r.PathValue("name"))
	if err != nil {
		notFound(w, r.PathValue("name"))
		return
	}
	writeJSON(w, http.StatusOK, s.view(v))
}

// healthMetrics writes what nodes report: per volume and per node gauges,
// restore counters.
func (s *Server) healthMetrics(mw *metrics.Writer) {
	g := s.Health
	var size, alloc, used, healthy []metrics.Sample
	for _, v := range s.Store.List() {
		l := []string{"volume", v.Spec.Name, "node", v.Spec.Node}
		n := v.Spec.Bytes()
		if v.Status.Size > 0 {
			n = v.Status.Size // what the node prepared: raw volumes have no size of their own
		}
		size = append(size, metrics.Sample{Labels: l, Value: float64(n)})
		h := 0.0
		if v.Status.Phase == volume.Available {
			h = 1
		}
		healthy = append(healthy, metrics.Sample{Labels: l, Value: h})
		if u := g.Usage(v.Spec.Node, v.Spec.UUID); u != nil && u.State != "absent" {
			if v.Spec.SparseLoopDevice != nil {
				alloc = append(alloc, metrics.Sample{Labels: l, Value: float64(u.Allocated)})
			}
			if len(u.Mountpoints) > 0 {
				used = append(used, metrics.Sample{Labels: l, Value: float64(u.FSUsed)})
			}
		}
	}
	mw.GaugeVec("salt_volumes_volume_size_bytes", "Size of each volume: its device as the node prepared it, else the size its spec asks for.", size)
	mw.GaugeVec("salt_volumes_volume_allocated_bytes", "Bytes a sparse volume's file really takes on its node, as the node last reported.", alloc)
	mw.GaugeVec("salt_volumes_volume_filesystem_used_bytes", "Used bytes of a volume's filesystem while it is mounted on its node, as the node last reported.", used)
	mw.GaugeVec("salt_volumes_volume_healthy", "1 if the volume is Available, 0 otherwise (Failed, Pending, Terminating).", healthy)
	var committed, fsSize, free, silent, ratio []metrics.Sample
	names := g.Names()
	sort.Strings(names)
	for _, n := range names {
		c, h := g.NodeView(n)
		l := []string{"node", n}
		if h != nil && !h.LastReport.IsZero() {
			v := 0.0
			if h.Silent {
				v = 1
			}
			silent = append(silent, metrics.Sample{Labels: l, Value: v})
		}
		if c != nil {
			committed = append(committed, metrics.Sample{Labels: l, Value: float64(c.Committed)})
			fsSize = append(fsSize, metrics.Sample{Labels: l, Value: float64(c.Size)})
			free = append(free, metrics.Sample{Labels: l, Value: float64(c.Free)})
			ratio = append(ratio, metrics.Sample{Labels: l, Value: c.OvercommitRatio})
		}
	}
	mw.GaugeVec("salt_volumes_node_committed_bytes", "Sum of the sizes of a node's sparse volumes (what they may grow to).", committed)
	mw.GaugeVec("salt_volumes_node_size_bytes", "Size of the filesystem holding a node's sparse files.", fsSize)
	mw.GaugeVec("salt_volumes_node_free_bytes", "Free bytes of the filesystem holding a node's sparse files.", free)
	mw.GaugeVec("salt_volumes_node_overcommit_ratio", "The node's overcommit limit: committed may not exceed this times its size.", ratio)
	mw.GaugeVec("salt_volumes_node_silent", "1 if a node's beacon has been silent for more than three heartbeats.", silent)
	mw.Counter("salt_volumes_node_reports_total", "Health reports received from node beacons.", g.Reports.Value())
	mw.CounterVec("salt_volumes_node_reports_refused_total", "Node reports dropped whole: listing more volumes than a node holds (too_many_volumes), or from a node with no volume here that Salt has not confirmed (unknown_node).", "reason",
		map[string]int64{health.RefusedTooMany: g.RefusedTooMany.Value(), health.RefusedUnknownNode: g.RefusedUnknownNode.Value()})
	mw.CounterVec("salt_volumes_restores_total", "Volumes that restore runs on the nodes rebuilt (reconstructed) or could not rebuild (failed).", "result",
		map[string]int64{"reconstructed": g.Reconstructed.Value(), "failed": g.RestoreFailed.Value()})
}

// view is the volume's API view with what its node last reported.
func (s *Server) view(v *volume.Volume) saltvolumes.View {
	out := v.View()
	out.Usage = s.Health.Usage(v.Spec.Node, v.Spec.UUID)
	return out
}

// jobs lists the volume's last state runs with their step timings.
func (s *Server) jobs(w http.ResponseWriter, r *http.Request) {
	v, err := s.Store.Get(r.PathValue("name"))
	if err != nil {
		notFound(w, r.PathValue("name"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": s.Jobs(v.Spec.Name)})
}

// usage is a volume's usage history: ?since=<duration> (default and at
// most 24h).
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	v, err := s.Store.Get(r.PathValue("name"))
	if err != nil {
		notFound(w, r.PathValue("name"))
		return
	}
	window := health.HistoryWindow
	if q := r.URL.Query().Get("since"); q != "" {
		d, err := time.ParseDuration(q)
		if err != nil || d <= 0 {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "since", Message: "since: " + strconv.Quote(q) + " is not a positive duration: use e.g. 1h or 30m"})
			return
		}
		window = min(d, window)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"volume": v.Spec.Name, "current": s.Health.Usage(v.Spec.Node, v.Spec.UUID),
		"samples": s.Health.History(v.Spec.UUID, time.Now().Add(-window)),
	})
}

func notFound(w http.ResponseWriter, name string) {
	writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: fmt.Sprintf("volume %q not found", name)})
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	wipe, werr := flag(r, "wipe")
	forget, ferr := flag(r, "forget")
	if e := cmp.Or(werr, ferr); e != nil {
		writeErr(w, http.StatusBadRequest, *e)
		return
	}
	var v *volume.Volume
	var err error
	switch {
	case wipe && forget:
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "forget", Message: "forget leaves the node untouched, so it cannot wipe: use one or the other"})
		return
	case forget:
		v, err = s.Requests.Forget(name)
	default:
		v, err = s.Requests.Delete(name, wipe)
	}
	var de *requests.DeleteError
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, name)
	case errors.As(err, &de):
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeDeleteForbidden, Message: fmt.Sprintf("volume %q: %s", name, de.Reason)})
	case err != nil:
		storeErr(w, err)
	default:
		s.Log.Info("volume deletion requested", "volume", name, "wipe", wipe, "forget", forget)
		writeJSON(w, http.StatusAccepted, v.View())
	}
}

// resize asks a volume to grow: a sparse one to {"size": "20Gi"}, a raw
// one to what its device has become, {"toDevice": true}.
func (s *Server) resize(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var body struct {
		Size     *spec.Size `json:"size"`
		ToDevice bool       `json:"toDevice"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() || (body.Size == nil) == !body.ToDevice || body.Size != nil && *body.Size == "" {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "size",
			Message: `the body must be {"size": "20Gi"} (a sparse volume: the size it grows to, a quantity or a number of bytes) or {"toDevice": true} (a raw volume: to what its device has become)`})
		return
	}
	size := ""
	if body.Size != nil {
		size = string(*body.Size)
	}
	v, err := s.Requests.Resize(name, size)
	var re *requests.ResizeError
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, name)
	case errors.As(err, &re) && re.Conflict:
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeResizeForbidden, Field: re.Field, Message: fmt.Sprintf("volume %q: %s", name, re.Reason)})
	case errors.As(err, &re):
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: re.Field, Message: fmt.Sprintf("volume %q: %s", name, re.Reason)})
	case err != nil:
		storeErr(w, err)
	default:
		s.Log.Info("volume growth requested", "volume", name, "size", size, "toDevice", body.ToDevice)
		writeJSON(w, http.StatusAccepted, v.View())
	}
}

// forgetNode drains a node that is gone for good: the volumes the body
// names ({"volumes": [...]}, as listed to the user) are forgotten
// whatever their phase, nothing runs on any node.
func (s *Server) forgetNode(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	var body struct {
		Volumes []string `json:"volumes"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "volumes",
			Message: `the body must be {"volumes": ["NAME", ...]}: the node's volumes to forget, as GET /api/v1/volumes?node=` + node + ` lists them`})
		return
	}
	if len(body.Volumes) == 0 {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "volumes", Message: "volumes: empty: name the volumes of node " + node + " to forget"})
		return
	}
	got, err := s.Requests.ForgetNode(node, body.Volumes)
	var ne *requests.NodeForgetError
	switch {
	case errors.As(err, &ne):
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Field: "volumes",
			Message: ne.Error() + ": list the node's volumes again; nothing was forgotten"})
		return
	case err != nil:
		storeErr(w, err)
		return
	}
	items := make([]saltvolumes.View, 0, len(got))
	for _, v := range got {
		items = append(items, v.View())
	}
	s.Log.Warn("node drained: its volumes are forgotten without touching any disk", "node", node, "volumes", body.Volumes)
	writeJSON(w, http.StatusAccepted, map[string]any{"items": items})
}

// watch streams volume changes as server-sent events: first every current
// volume as ADDED, then each change. ?node= and ?name= filter.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	if _, ok := w.(http.Flusher); !ok {
		writeErr(w, http.StatusInternalServerError, saltvolumes.Error{Code: saltvolumes.CodeInternal, Message: "streaming unsupported"})
		return
	}
	if n := s.watchers.Add(1); s.MaxWatchers > 0 && n > int64(s.MaxWatchers) {
		s.watchers.Add(-1)
		w.Header().Set("Retry-After", "5")
		writeErr(w, http.StatusServiceUnavailable, saltvolumes.Error{Code: saltvolumes.CodeLimit, Message: fmt.Sprintf("%d watch streams are open, the limit (limits.watchers): close some or raise the limit", s.MaxWatchers)})
		return
	}
	defer s.watchers.Add(-1)
	node, name := r.URL.Query().Get("node"), r.URL.Query().Get("name")
	match := func(v *volume.Volume) bool {
		return (node == "" || v.Spec.Node == node) && (name == "" || v.Spec.Name == name)
	}
	// A small buffer: an idle watcher costs its queue, and one that falls
	// behind is dropped and reconnects for the full list.
	ch, stop := s.Watch.Subscribe(256)
	defer stop()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// Every write gets a deadline: one that a client does not take in
	// time ends the stream (and frees its slot); the client reconnects
	// and gets the list again.
	rc := http.NewResponseController(w)
	deadline := func() error {
		err := rc.SetWriteDeadline(time.Now().Add(s.WatchWriteTimeout))
		if errors.Is(err, http.ErrNotSupported) {
			return nil // not a network connection (a test recorder)
		}
		return err
	}
	send := func(typ string, v *volume.Volume) error {
		b, err := json.Marshal(saltvolumes.Event{Type: typ, Volume: v.View()})
		if err != nil {
			return err
		}
		if err := deadline(); err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		return err
	}
	flush := func() error {
		if err := deadline(); err != nil {
			return err
		}
		return rc.Flush()
	}
	// The initial list one volume at a time: a copy of the whole store
	// per watcher would make watchers cost O(store) each.
	for _, n := range s.Store.Names() {
		v, err := s.Store.Get(n)
		if err != nil || !match(v) {
			continue
		}
		if send(saltvolumes.Added, v) != nil {
			return
		}
	}
	// Tells clients the initial list is complete (wait uses it).
	if deadline() != nil {
		return
	}
	if _, err := io.WriteString(w, "event: SYNCED\ndata: {}\n\n"); err != nil || flush() != nil {
		return
	}
	hb := time.NewTicker(s.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-hb.C:
			if deadline() != nil {
				return
			}
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil || flush() != nil {
				return
			}
		case ev, ok := <-ch:
			if !ok {
				return // fell behind: the client reconnects and gets the list again
			}
			if !match(ev.Volume) {
				continue
			}
			if send(ev.Type, ev.Volume) != nil || flush() != nil {
				return
			}
		}
	}
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request) {
	byName := map[string]*saltvolumes.Node{}
	get := func(n string) *saltvolumes.Node {
		if byName[n] == nil {
			byName[n] = &saltvolumes.Node{Name: n, Phases: map[string]int{}}
		}
		return byName[n]
	}
	var warn string
	if s.Nodes != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
		up, err := s.Nodes(ctx)
		cancel()
		if err != nil {
			warn = "Salt could not list its minions: " + err.Error()
		}
		for _, n := range up {
			get(n).Up = true
		}
	}
	for _, v := range s.Store.List() {
		n := get(v.Spec.Node)
		n.Volumes++
		n.Phases[v.Status.Phase.String()]++
	}
	for _, name := range s.Health.Names() {
		get(name)
	}
	for name, n := range byName {
		n.Capacity, n.Health = s.Health.NodeView(name)
	}
	items := make([]saltvolumes.Node, 0, len(byName))
	for _, n := range byName {
		items = append(items, *n)
	}
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	out := map[string]any{"items": items}
	if warn != "" {
		out["warning"] = warn
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	mw := metrics.NewWriter(&buf)
	phases := map[string]float64{}
	for _, p := range []volume.Phase{volume.Unknown, volume.Pending, volume.Available, volume.Failed, volume.Terminating} {
		phases[p.String()] = 0
	}
	for _, v := range s.Store.List() {
		phases[v.Status.Phase.String()]++
	}
	mw.Gauge("salt_volumes_volumes", "Volumes by phase.", "phase", phases)
	s.healthMetrics(mw)
	mw.Gauge("salt_volumes_watchers", "Open watch streams.", "", map[string]float64{"": float64(s.Watch.Watchers())})
	leader := 1.0
	if s.Role != nil && !s.Role().Leader {
		leader = 0
	}
	mw.Gauge("salt_volumes_leader", "1 on the replica that reconciles (the elected leader, or the only control plane), 0 on followers.", "", map[string]float64{"": leader})
	if s.ExtraMetrics != nil {
		s.ExtraMetrics(mw)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write(buf.Bytes())
}
