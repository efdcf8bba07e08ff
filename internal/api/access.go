package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
		ctx := context.WithValue(access.With(r.Context(), p), noteKey{}, n)
		r = r.WithContext(ctx)
		if !p.Role.Allows(role) {
			if r.Method == http.MethodPost && r.URL.Path == "/api/v1/volumes" {
				// What was asked for, for the audit: the body is not
				// otherwise read when the role already refuses it.
				var want struct{ Name, Node string }
				_ = json.NewDecoder(r.Body).Decode(&want)
				n.volume, n.node = want.Name, want.Node
			}
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
