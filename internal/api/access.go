package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/kubeauth"
)

// Who may do what: every route names the least role it needs; a handler
// asks for more (admin) when the request's details need it (a raw device,
// a wipe, a forget). Changes and refusals are audited.

// note is what a handler learns about a mutating request that its audit
// entry should carry.
type note struct {
	volume, uuid, node string
	// refused marks a 403 the handler decided (an escalation).
	refused bool
}

type noteKey struct{}

func noteOf(ctx context.Context) *note {
	n, _ := ctx.Value(noteKey{}).(*note)
	if n == nil {
		return &note{}
	}
	return n
}

// need authenticates the request and lets it through if its principal's
// role includes role.
func (s *Server) need(role access.Role, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A watch ticket changes nothing (it is a read's credential): not
		// audited, so that asking for them cannot crowd anything out.
		audited := r.Method != http.MethodGet && r.Method != http.MethodHead && r.URL.Path != "/api/v1/watch/ticket"
		secret := bearer(r.Header.Get("Authorization"))
		p, err := s.checker().Check(r.Context(), secret)
		if errors.Is(err, access.ErrUnauthenticated) && s.Kube != nil && secret != "" &&
			!strings.HasPrefix(secret, "svt_") && !strings.HasPrefix(secret, "svs_") {
			// Not one of ours: perhaps the API server's (Kubernetes mode).
			p, err = s.Kube.Authenticate(r.Context(), secret, source(r))
		}
		if err == nil {
			// A person's role as it is now, not as it was at login.
			err = s.bound(r.Context(), p)
		}
		if err != nil {
			if s.kubeRefused(w, r, err) {
				return
			}
			if !errors.Is(err, access.ErrUnauthenticated) {
				storeErr(w, fmt.Errorf("checking the token: %w", err))
				return
			}
			s.refusedLogin(r)
			w.Header().Set("WWW-Authenticate", `Bearer realm="salt-volumes"`)
			writeErr(w, http.StatusUnauthorized, saltvolumes.Error{Code: saltvolumes.CodeUnauthorized, Message: "missing, wrong, revoked or expired API token: send Authorization: Bearer <token> (SALT_VOLUMES_TOKEN for the CLI)"})
			return
		}
		// What the route names; handlers add what the body names.
		n := &note{node: r.PathValue("node")}
		if strings.HasPrefix(r.URL.Path, "/api/v1/volumes/") {
			// Elsewhere the route's name is a snapshot's or a token's: the
			// handlers note the volume it belongs to, once they know it.
			n.volume = r.PathValue("name")
		}
		if n.volume != "" && s.Store != nil && strings.HasPrefix(r.URL.Path, "/api/v1/volumes/") {
			if cur, err := s.Store.Get(n.volume); err == nil {
				n.uuid, n.node = cur.Spec.UUID, cur.Spec.Node
			}
		}
		if r.Method == http.MethodPost && r.URL.Path == "/api/v1/volumes" {
			// What is asked for, for the audit of a refusal before the
			// handler reads the body (which it then reads as sent).
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var want struct{ Name, Node string }
			_ = json.Unmarshal(body, &want)
			n.volume, n.node = want.Name, want.Node
		}
		ctx := context.WithValue(access.With(r.Context(), p), noteKey{}, n)
		ctx = context.WithValue(ctx, recheckKey{}, s.recheck(p, secret))
		r = r.WithContext(ctx)
		if p.Kind == "kubernetes" {
			if !s.kubeAllowed(w, r, p, n, kubeAttributes(role, r), true) {
				return
			}
		} else if !p.Role.Allows(role) {
			msg := fmt.Sprintf("%s (role %s) may not %s %s: it needs role %s", p.User, p.Role, r.Method, r.URL.Path, role)
			writeErr(w, http.StatusForbidden, saltvolumes.Error{Code: saltvolumes.CodeForbidden, Message: msg})
			s.audit(r, p, n, "refused", http.StatusForbidden, msg)
			return
		}
		if !audited {
			h(w, r)
			return
		}
		cw := &captureWriter{ResponseWriter: w}
		h(cw, r)
		decision := "allowed"
		switch {
		case n.refused:
			decision = "refused"
		case cw.status >= 400:
			decision = "failed"
		}
		s.audit(r, p, n, decision, cw.status, cw.reason())
	})
}

// recheck is a watch stream's check that the credential that opened it
// is still valid (not revoked, expired or logged out, its person still
// with a role).
func (s *Server) recheck(p *access.Principal, secret string) func(context.Context) error {
	if p.Kind == "kubernetes" {
		// The reviewer's answers are cached (kubeauth): a revoked token
		// ends its stream within that cache's life.
		return func(ctx context.Context) error {
			// No source: a token once valid is not throttled.
			_, err := s.Kube.Authenticate(ctx, secret, "")
			return err
		}
	}
	return func(ctx context.Context) error {
		q, err := s.checker().Check(ctx, secret)
		if err == nil {
			err = s.bound(ctx, q)
		}
		return err
	}
}

// escalate asks for a role beyond the route's: it answers 403 and returns
// false when the principal lacks it.
func (s *Server) escalate(w http.ResponseWriter, r *http.Request, role access.Role, what string) bool {
	return s.escalateOn(w, r, role, what, r.PathValue("name"))
}

// escalateOn is escalate for volume (a Kubernetes identity is asked for
// "admin" on that volume): on routes whose {name} is not a volume's (a
// snapshot's), the volume it acts on; "" asks for every volume.
func (s *Server) escalateOn(w http.ResponseWriter, r *http.Request, role access.Role, what, volume string) bool {
	p := access.From(r.Context())
	if p != nil && p.Kind == "kubernetes" {
		// The route's own audit entry records the refusal.
		return s.kubeAllowed(w, r, p, noteOf(r.Context()), kubeauth.Attributes{Verb: "admin", Resource: kubeauth.Resource, Name: volume}, false)
	}
	if p != nil && p.Role.Allows(role) {
		return true
	}
	user, has := "nobody", access.Role("")
	if p != nil {
		user, has = p.User, p.Role
	}
	noteOf(r.Context()).refused = true
	writeErr(w, http.StatusForbidden, saltvolumes.Error{Code: saltvolumes.CodeForbidden,
		Message: fmt.Sprintf("%s (role %s) may not %s: it needs role %s", user, has, what, role)})
	return false
}

func (s *Server) checker() *access.Tokens {
	s.tokensOnce.Do(func() {
		if s.Tokens == nil {
			s.Tokens = &access.Tokens{Bootstrap: s.Token}
		}
	})
	return s.Tokens
}

func (s *Server) audit(r *http.Request, p *access.Principal, n *note, decision string, status int, reason string) {
	if s.Audit == nil {
		return
	}
	route := r.URL.Path
	if r.Method != http.MethodGet {
		// ?wipe=true, ?forget=true: what the change was. Nothing else of
		// a query is kept (GET queries carry watch tickets; made-up
		// parameters would make each refusal an entry of its own).
		q := url.Values{}
		for _, k := range []string{"wipe", "forget"} {
			if v, ok := r.URL.Query()[k]; ok {
				q[k] = v
			}
		}
		if len(q) > 0 {
			route += "?" + q.Encode()
		}
	}
	e := access.Entry{Source: source(r), Method: r.Method, Route: route,
		Volume: n.volume, UUID: n.uuid, Node: n.node, Decision: decision, Status: status, Reason: reason,
		Session: r.URL.Path == "/api/v1/login" || r.URL.Path == "/api/v1/logout"}
	if p != nil {
		e.User, e.Role, e.Groups = p.User, p.Role, p.Groups
	}
	s.Audit.Record(r.Context(), e)
}

// source is the client's address (the proxy's, behind one: serve does not
// trust X-Forwarded-For, which any client can send).
func source(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// refusedLogin audits a request without a valid token, at most once per
// source per refusedEvery: anyone can send those, and the trail is
// bounded by count, so an unthrottled flood would push out the entries
// that matter. Every refusal is still counted (metrics) and logged.
func (s *Server) refusedLogin(r *http.Request) {
	s.refused.Add(1)
	src := source(r)
	if s.Audit == nil {
		return
	}
	now := time.Now()
	key := kubeauth.SourceKey(src)
	s.refusedMu.Lock()
	if s.refusedAt == nil || now.Sub(s.refusedSwept) >= refusedEvery {
		// A new map each period: no scan of the old one per request.
		s.refusedAt, s.refusedSwept = map[string]time.Time{}, now
	}
	last, seen := s.refusedAt[key]
	if (seen && now.Sub(last) < refusedEvery) || (!seen && len(s.refusedAt) >= refusedSources) {
		// Counted and logged; a flood from many addresses audits at most
		// refusedSources entries a period.
		s.refusedMu.Unlock()
		s.Log.Info("request without a valid token refused", "source", src, "method", r.Method, "route", r.URL.Path)
		return
	}
	s.refusedAt[key] = now
	s.refusedMu.Unlock()
	s.audit(r, &access.Principal{User: "unauthenticated"}, &note{}, "refused", http.StatusUnauthorized, "missing, wrong, revoked or expired token")
}

const (
	refusedEvery   = 10 * time.Second
	refusedSources = 1000
)

// captureWriter keeps a mutating request's status and error message for
// its audit entry.
type captureWriter struct {
	http.ResponseWriter
	status int
	body   []byte
}

func (c *captureWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.status >= 400 && len(c.body) < 4096 {
		c.body = append(c.body, b...)
	}
	return c.ResponseWriter.Write(b)
}

func (c *captureWriter) reason() string {
	if c.status < 400 {
		return ""
	}
	var e struct {
		Error saltvolumes.Error `json:"error"`
	}
	if json.Unmarshal(c.body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strconv.Itoa(c.status) + " " + strings.ToLower(http.StatusText(c.status))
}

// KubeAuth checks Kubernetes identities (kubeauth.Reviewer).
type KubeAuth interface {
	// Authenticate checks a bearer token; source is the client's address
	// (its TokenReviews of tokens not cached are bounded per source).
	Authenticate(ctx context.Context, token, source string) (*access.Principal, error)
	Allowed(ctx context.Context, p *access.Principal, a kubeauth.Attributes) (bool, string, error)
}

// kubeRoutes: what each route asks of RBAC, in our group salt-volumes.io
// (cluster-scoped, no namespace). name marks the routes whose object is
// the path's {name}. Snapshots are objects of volumesnapshots named as
// the control plane names them; taking one is a create on the volume's
// snapshots subresource (as a pod's eviction is on pods/eviction), which a
// Role can grant for some volumes by resourceNames.
var kubeRoutes = map[string]struct {
	verb, resource, sub string
	name                bool
}{
	"POST /api/v1/volumes":                  {"create", kubeauth.Resource, "", false},
	"GET /api/v1/volumes":                   {"list", kubeauth.Resource, "", false},
	"GET /api/v1/volumes/{name}":            {"get", kubeauth.Resource, "", true},
	"GET /api/v1/volumes/{name}/usage":      {"get", kubeauth.Resource, "", true},
	"GET /api/v1/volumes/{name}/jobs":       {"get", kubeauth.Resource, "", true},
	"GET /api/v1/volumes/{name}/history":    {"get", kubeauth.Resource, "", true},
	"DELETE /api/v1/volumes/{name}":         {"delete", kubeauth.Resource, "", true},
	"POST /api/v1/volumes/{name}/resize":    {"patch", kubeauth.Resource, "", true},
	"POST /api/v1/volumes/{name}/snapshots": {"create", kubeauth.Resource, kubeauth.SnapshotsSubresource, true},
	"GET /api/v1/volumes/{name}/snapshots":  {"list", kubeauth.SnapshotResource, "", false},
	"GET /api/v1/snapshots":                 {"list", kubeauth.SnapshotResource, "", false},
	"GET /api/v1/snapshots/{name}":          {"get", kubeauth.SnapshotResource, "", true},
	"DELETE /api/v1/snapshots/{name}":       {"delete", kubeauth.SnapshotResource, "", true},
	// Reading the snapshot here; the handler then asks delete on its
	// volume, by the volume's name: a restore loses what a deletion does.
	"POST /api/v1/snapshots/{name}/restore": {"get", kubeauth.SnapshotResource, "", true},
	// A schedule takes snapshots of the volume: setting or removing one
	// asks what taking one does; the listing is a read of snapshots.
	"PUT /api/v1/volumes/{name}/snapshot-schedule":    {"create", kubeauth.Resource, kubeauth.SnapshotsSubresource, true},
	"DELETE /api/v1/volumes/{name}/snapshot-schedule": {"create", kubeauth.Resource, kubeauth.SnapshotsSubresource, true},
	"GET /api/v1/snapshot-schedules":                  {"list", kubeauth.SnapshotResource, "", false},
	"GET /api/v1/watch":                               {"watch", kubeauth.Resource, "", false},
	"POST /api/v1/watch/ticket":                       {"watch", kubeauth.Resource, "", false},
	// The server's version and job timeout, nothing of any volume: for
	// whoever may list them (the CLI asks it before a --wait).
	"GET /api/v1/info": {"list", kubeauth.Resource, "", false},
}

// kubeAttributes is what a route asks of RBAC: kubeRoutes' entry; for
// the others (nodes, metrics, whoami, logout, an unknown /api/ path)
// list on volumes, and the custom verb admin on volumes for what needs
// the role admin here (tokens, the audit, forgetting a node).
func kubeAttributes(role access.Role, r *http.Request) kubeauth.Attributes {
	if role == access.Admin {
		// No name: these routes' {name} is a token's, never a volume's.
		return kubeauth.Attributes{Verb: "admin", Resource: kubeauth.Resource}
	}
	if k, ok := kubeRoutes[r.Pattern]; ok {
		a := kubeauth.Attributes{Verb: k.verb, Resource: k.resource, Subresource: k.sub}
		if k.name {
			a.Name = r.PathValue("name")
		}
		return a
	}
	return kubeauth.Attributes{Verb: "list", Resource: kubeauth.Resource}
}

// kubeAllowed asks the API server whether p may do what a says; a
// refusal is a 403 that names the verb and the resource, audited here
// when audit says so.
func (s *Server) kubeAllowed(w http.ResponseWriter, r *http.Request, p *access.Principal, n *note, a kubeauth.Attributes, audit bool) bool {
	ok, reason, err := s.Kube.Allowed(r.Context(), p, a)
	if errors.Is(err, kubeauth.ErrReviewsThrottled) {
		w.Header().Set("Retry-After", "1")
		writeErr(w, http.StatusTooManyRequests, saltvolumes.Error{Code: saltvolumes.CodeLimit, Message: err.Error() + "; nothing was changed"})
		return false
	}
	if err != nil {
		writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable, Message: "asking the Kubernetes API server: " + err.Error() + "; nothing was changed"})
		return false
	}
	if ok {
		return true
	}
	msg := fmt.Sprintf("%s may not %s %s: Kubernetes RBAC does not allow it", p.User, a.Verb, a.Target())
	if reason != "" {
		msg += " (" + reason + ")"
	}
	n.refused = true
	writeErr(w, http.StatusForbidden, saltvolumes.Error{Code: saltvolumes.CodeForbidden, Message: msg})
	if audit {
		s.audit(r, p, n, "refused", http.StatusForbidden, msg)
	}
	return false
}

// kubeRefused answers a Kubernetes token the reviewer would not check
// (too many new tokens from its source: 429, no TokenReview made) or the
// API server refused for serve's audience (401 saying how to make one).
func (s *Server) kubeRefused(w http.ResponseWriter, r *http.Request, err error) bool {
	var re *kubeauth.RefusedError
	switch {
	case errors.Is(err, kubeauth.ErrThrottled):
		s.refusedLogin(r)
		w.Header().Set("Retry-After", "1")
		writeErr(w, http.StatusTooManyRequests, saltvolumes.Error{Code: saltvolumes.CodeLimit,
			Message: "too many new Kubernetes tokens from this address: retry in a second (a token already checked is not limited)"})
	case errors.As(err, &re):
		s.refusedLogin(r)
		w.Header().Set("WWW-Authenticate", `Bearer realm="salt-volumes"`)
		writeErr(w, http.StatusUnauthorized, saltvolumes.Error{Code: saltvolumes.CodeUnauthorized, Message: re.Msg})
	default:
		return false
	}
	return true
}

// Resource names the Volume resource as kubectl does.
func Resource() string { return "volumes.salt-volumes.io" }
