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
	"strconv"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
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
		audited := r.Method != http.MethodGet && r.Method != http.MethodHead
		secret := bearer(r.Header.Get("Authorization"))
		p, err := s.checker().Check(r.Context(), secret)
		if errors.Is(err, access.ErrUnauthenticated) && s.Kube != nil && secret != "" &&
			!strings.HasPrefix(secret, "svt_") && !strings.HasPrefix(secret, "svs_") {
			// Not one of ours: perhaps the API server's (Kubernetes mode).
			p, err = s.Kube.Authenticate(r.Context(), secret)
		}
		if err != nil {
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
		n := &note{volume: r.PathValue("name"), node: r.PathValue("node")}
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
		r = r.WithContext(ctx)
		if p.Kind == "kubernetes" {
			if !s.kubeAllowed(w, r, p, n, kubeVerb(role, r), r.PathValue("name"), true) {
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

// escalate asks for a role beyond the route's: it answers 403 and returns
// false when the principal lacks it.
func (s *Server) escalate(w http.ResponseWriter, r *http.Request, role access.Role, what string) bool {
	p := access.From(r.Context())
	if p != nil && p.Kind == "kubernetes" {
		// The route's own audit entry records the refusal.
		return s.kubeAllowed(w, r, p, noteOf(r.Context()), "admin", r.PathValue("name"), false)
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
	if r.Method != http.MethodGet && r.URL.RawQuery != "" {
		// ?wipe=true, ?forget=true: what the change was. GET queries (a
		// watch ticket) are never kept.
		route += "?" + r.URL.RawQuery
	}
	e := access.Entry{Source: source(r), Method: r.Method, Route: route,
		Volume: n.volume, UUID: n.uuid, Node: n.node, Decision: decision, Status: status, Reason: reason}
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
	s.refusedMu.Lock()
	if s.refusedAt == nil {
		s.refusedAt = map[string]time.Time{}
	}
	last, seen := s.refusedAt[src]
	if seen && now.Sub(last) < refusedEvery {
		s.refusedMu.Unlock()
		s.Log.Info("request without a valid token refused", "source", src, "method", r.Method, "route", r.URL.Path)
		return
	}
	for k, t := range s.refusedAt {
		if now.Sub(t) >= refusedEvery {
			delete(s.refusedAt, k)
		}
	}
	s.refusedAt[src] = now
	s.refusedMu.Unlock()
	s.audit(r, &access.Principal{User: "unauthenticated"}, &note{}, "refused", http.StatusUnauthorized, "missing, wrong, revoked or expired token")
}

const refusedEvery = 10 * time.Second

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
	Authenticate(ctx context.Context, token string) (*access.Principal, error)
	Allowed(ctx context.Context, p *access.Principal, verb, name string) (bool, string, error)
}

// kubeVerb is the Volume resource's verb a route stands for: reads are
// get, list or watch; changes create, delete or patch (a growth); what
// needs admin here needs the custom verb "admin" on volumes there.
func kubeVerb(role access.Role, r *http.Request) string {
	switch {
	case role == access.Admin:
		return "admin"
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/volumes":
		return "create"
	case r.Method == http.MethodDelete:
		return "delete"
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/resize"):
		return "patch"
	case r.URL.Path == "/api/v1/watch":
		return "watch"
	case r.PathValue("name") != "":
		return "get"
	}
	return "list"
}

// kubeAllowed asks the API server whether p may do verb on the Volume
// name; a refusal is a 403 that names the verb and the resource, audited
// here when audit says so.
func (s *Server) kubeAllowed(w http.ResponseWriter, r *http.Request, p *access.Principal, n *note, verb, name string, audit bool) bool {
	ok, reason, err := s.Kube.Allowed(r.Context(), p, verb, name)
	if err != nil {
		writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable, Message: "asking the Kubernetes API server: " + err.Error() + "; nothing was changed"})
		return false
	}
	if ok {
		return true
	}
	target := Resource()
	if name != "" {
		target += " " + name
	}
	msg := fmt.Sprintf("%s may not %s %s: Kubernetes RBAC does not allow it", p.User, verb, target)
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

// Resource names the Volume resource as kubectl does.
func Resource() string { return "volumes.salt-volumes.io" }
