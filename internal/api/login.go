package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
)

// People log in with their Salt identity: the master checks the password
// (its eauth: pam, ldap, file, ...) and, for each change they ask for,
// whether their own Salt ACL grants our node function on the volume's
// minion.

// People is the master's side of that (saltapi.Client).
type People interface {
	Authenticate(ctx context.Context, user, password, eauth string) (saltapi.Identity, error)
	UserAccess(ctx context.Context, user, eauth string, minions []string) (saltapi.Access, error)
}

// Logins configures people's logins; nil People: no logins.
type Logins struct {
	People People
	Roles  access.RoleMap
	TTL    time.Duration
	// Eauth limits the backends people may name (empty: any the master has).
	Eauth []string
}

// aclTTL: how long the master's answer about a user and a minion is
// reused (an ACL change reaches serve within it).
const aclTTL = 10 * time.Second

type aclCache struct {
	mu      sync.Mutex
	answers map[string]aclAnswer
}

type aclAnswer struct {
	allowed bool
	grants  []string
	at      time.Time
}

// loginThrottle slows down guessing: after loginFree failures from one
// address within loginWindow, each further attempt from it waits a second
// more per failure (at most loginMaxDelay) before it is checked.
const (
	loginFree     = 3
	loginWindow   = 10 * time.Minute
	loginMaxDelay = 10 * time.Second
)

type loginFailures struct {
	mu   sync.Mutex
	byIP map[string][]time.Time
}

func (f *loginFailures) recent(src string, now time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := f.byIP[src][:0]
	for _, t := range f.byIP[src] {
		if now.Sub(t) < loginWindow {
			kept = append(kept, t)
		}
	}
	if len(kept) == 0 {
		delete(f.byIP, src)
	} else {
		f.byIP[src] = kept
	}
	return len(kept)
}

func (f *loginFailures) add(src string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byIP == nil {
		f.byIP = map[string][]time.Time{}
	}
	// Bounded memory under a flood from many addresses.
	if len(f.byIP) > 10000 {
		clear(f.byIP)
	}
	f.byIP[src] = append(f.byIP[src], now)
}

func (f *loginFailures) reset(src string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.byIP, src)
}

// login: POST /api/v1/login {"username", "password", "eauth"}.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.Logins == nil || s.Logins.People == nil {
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: "logins with a Salt identity are not enabled on this server: use a token"})
		return
	}
	var body struct {
		Username string `json:"username"`
		Password string `json:"password"`
		Eauth    string `json:"eauth"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 8192))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Message: `the body must be {"username": "alice", "password": "...", "eauth": "pam"}`})
		return
	}
	for _, f := range []struct{ name, v string }{{"username", body.Username}, {"password", body.Password}, {"eauth", body.Eauth}} {
		if f.v == "" {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: f.name, Message: f.name + ": missing"})
			return
		}
	}
	if len(s.Logins.Eauth) > 0 && !slices.Contains(s.Logins.Eauth, body.Eauth) {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "eauth",
			Message: fmt.Sprintf("eauth: %q is not one this server takes logins for: give %s", body.Eauth, strings.Join(s.Logins.Eauth, ", "))})
		return
	}
	src := source(r)
	now := time.Now()
	if n := s.loginFails.recent(src, now); n >= loginFree {
		delay := min(time.Duration(n-loginFree+1)*time.Second, loginMaxDelay)
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	who := &access.Principal{User: body.Username, Eauth: body.Eauth, Kind: "session"}
	refuse := func(status int, code, msg string) {
		s.loginFails.add(src, time.Now())
		s.loginsRefused.Add(1)
		s.Log.Warn("login refused", "user", body.Username, "eauth", body.Eauth, "source", src, "reason", msg)
		s.audit(r, who, &note{}, "refused", status, msg)
		writeErr(w, status, saltvolumes.Error{Code: code, Message: msg})
	}
	id, err := s.Logins.People.Authenticate(r.Context(), body.Username, body.Password, body.Eauth)
	if errors.Is(err, saltapi.ErrBadCredentials) {
		refuse(http.StatusUnauthorized, saltvolumes.CodeUnauthorized, "the salt master refused the user name, password or eauth")
		return
	}
	if err != nil {
		writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable, Message: "login: asking the salt master: " + err.Error()})
		return
	}
	var minions []string
	if s.Nodes != nil {
		minions, _ = s.Nodes(r.Context())
	}
	acc, err := s.Logins.People.UserAccess(r.Context(), id.User, id.Eauth, minions)
	if err != nil {
		writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable, Message: "login: asking the salt master for the user's groups and ACL: " + err.Error()})
		return
	}
	who.User, who.Groups = id.User, acc.Groups
	role := s.Logins.Roles.For(id.User, acc.Groups)
	if role == "" {
		refuse(http.StatusForbidden, saltvolumes.CodeForbidden, fmt.Sprintf("%s logged in to Salt, but has no salt-volumes role: name them (access.users) or one of their groups (access.groups) in serve's config, or set access.defaultRole", id.User))
		return
	}
	who.Role = role
	secret, tok, err := s.checker().CreateSession(r.Context(), who, s.Logins.TTL)
	if err != nil {
		storeErr(w, err)
		return
	}
	s.loginFails.reset(src)
	s.rememberACL(id.User, id.Eauth, acc)
	scopes := []string{}
	for m, ok := range acc.Allowed {
		if ok {
			scopes = append(scopes, m)
		}
	}
	slices.Sort(scopes)
	s.Log.Info("login", "user", id.User, "eauth", id.Eauth, "role", role, "groups", acc.Groups, "source", src)
	s.audit(r, who, &note{}, "allowed", http.StatusOK, "")
	writeJSON(w, http.StatusOK, map[string]any{"token": secret, "expire": tok.Expires, "user": id.User, "role": role,
		"groups": acc.Groups, "eauth": id.Eauth, "scopes": scopes, "grants": acc.Grants})
}

// logout ends the session the request carries.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	p := access.From(r.Context())
	if p == nil || p.Kind != "session" {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Message: "logout ends a login session; a service token is revoked with salt-volumes token revoke NAME"})
		return
	}
	if err := s.checker().RevokeSecret(r.Context(), bearer(r.Header.Get("Authorization"))); err != nil {
		storeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"user": p.User, "loggedOut": true})
}

func aclKey(user, eauth, minion string) string { return user + "\x00" + eauth + "\x00" + minion }

func (s *Server) rememberACL(user, eauth string, acc saltapi.Access) {
	s.acl.mu.Lock()
	defer s.acl.mu.Unlock()
	if s.acl.answers == nil || len(s.acl.answers) > 10000 {
		s.acl.answers = map[string]aclAnswer{}
	}
	now := time.Now()
	for m, ok := range acc.Allowed {
		s.acl.answers[aclKey(user, eauth, m)] = aclAnswer{allowed: ok, grants: acc.Grants, at: now}
	}
}

// inScope lets a person's change on node through only if their Salt ACL
// grants our node function there (tokens are bound by their role alone);
// otherwise it answers 403 naming the user, the minion and the grant.
func (s *Server) inScope(w http.ResponseWriter, r *http.Request, node string) bool {
	p := access.From(r.Context())
	if p == nil || p.Kind != "session" || s.Logins == nil || s.Logins.People == nil {
		return true
	}
	key := aclKey(p.User, p.Eauth, node)
	s.acl.mu.Lock()
	a, ok := s.acl.answers[key]
	s.acl.mu.Unlock()
	if !ok || time.Since(a.at) >= aclTTL {
		acc, err := s.Logins.People.UserAccess(r.Context(), p.User, p.Eauth, []string{node})
		if err != nil {
			writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable, Message: fmt.Sprintf("asking the salt master whether %s may act on %s: %v; nothing was changed", p.User, node, err)})
			noteOf(r.Context()).refused = true
			return false
		}
		s.rememberACL(p.User, p.Eauth, acc)
		a = aclAnswer{allowed: acc.Allowed[node], grants: acc.Grants}
	}
	if a.allowed {
		return true
	}
	has := "on no minion"
	if len(a.grants) > 0 {
		has = "on " + strings.Join(a.grants, ", ") + " only"
	}
	noteOf(r.Context()).refused = true
	writeErr(w, http.StatusForbidden, saltvolumes.Error{Code: saltvolumes.CodeForbidden,
		Message: fmt.Sprintf("%s may not change volumes on %s: their Salt ACL (eauth %s) grants salt_volumes.apply_volume %s; nothing was changed", p.User, node, p.Eauth, has)})
	return false
}
