package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/kubeauth"
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

// Logins are throttled per source address: loginFree attempts may be
// under way or have failed within loginWindow; past that, one attempt at
// a time, each a second later per failure (at most loginMaxDelay) after
// the last one ended, and every other attempt meanwhile is answered 429
// at once, unchecked (parallel guesses queue nowhere).
const (
	loginFree     = 3
	loginWindow   = 10 * time.Minute
	loginMaxDelay = 10 * time.Second
	// loginSources bounds the table; when full, the source with the
	// fewest failures (and none under way) makes room: a flood from many
	// addresses never frees the busiest guessers.
	loginSources = 10000
)

type loginSource struct {
	failures []time.Time
	busy     int       // attempts under way
	last     time.Time // when the last attempt ended
}

type loginFailures struct {
	mu   sync.Mutex
	byIP map[string]*loginSource
}

func (ls *loginSource) recent(now time.Time) int {
	kept := ls.failures[:0]
	for _, t := range ls.failures {
		if now.Sub(t) < loginWindow {
			kept = append(kept, t)
		}
	}
	ls.failures = kept
	return len(kept)
}

// recent counts src's failures within the window.
func (f *loginFailures) recent(src string, now time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	ls := f.byIP[src]
	if ls == nil {
		return 0
	}
	return ls.recent(now)
}

// begin lets an attempt from src be checked now, or says how long to
// wait; a begun attempt is ended with end.
func (f *loginFailures) begin(src string, now time.Time) (bool, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ls := f.source(src, now)
	n := ls.recent(now)
	if ls.busy+n < loginFree {
		ls.busy++
		return true, 0
	}
	delay := min(time.Duration(n-loginFree+1)*time.Second, loginMaxDelay)
	if ls.busy > 0 {
		return false, max(delay, time.Second)
	}
	if wait := ls.last.Add(delay).Sub(now); wait > 0 {
		return false, wait
	}
	ls.busy++
	return true, 0
}

// end closes an attempt begun by begin: a failure counts.
func (f *loginFailures) end(src string, now time.Time, failed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ls := f.source(src, now)
	ls.busy = max(ls.busy-1, 0)
	ls.last = now
	// A success forgets nothing: one's own good login between guesses at
	// someone else's password must not reset the count.
	if failed {
		ls.failures = append(ls.failures, now)
	}
	if ls.busy == 0 && ls.recent(now) == 0 {
		delete(f.byIP, src)
	}
}

// source returns src's entry, making room for it when the table is full.
func (f *loginFailures) source(src string, now time.Time) *loginSource {
	if f.byIP == nil {
		f.byIP = map[string]*loginSource{}
	}
	if ls, ok := f.byIP[src]; ok {
		return ls
	}
	if len(f.byIP) >= loginSources {
		f.makeRoom(now)
	}
	ls := &loginSource{}
	f.byIP[src] = ls
	return ls
}

// makeRoom frees a quarter of the full table at once, the sources with
// the fewest failures first (none under way): one scan and sort for every
// loginSources/4 new sources, where making room for each by a scan of
// the whole table let a flood from new addresses cost 10,000 steps per
// attempt under the lock.
func (f *loginFailures) makeRoom(now time.Time) {
	type entry struct {
		src string
		n   int
	}
	idle := make([]entry, 0, len(f.byIP))
	for k, ls := range f.byIP {
		if ls.busy == 0 {
			idle = append(idle, entry{k, ls.recent(now)})
		}
	}
	slices.SortFunc(idle, func(a, b entry) int { return a.n - b.n })
	for _, e := range idle[:min(len(idle), loginSources/4)] {
		delete(f.byIP, e.src)
	}
}

// claimed is how a login's user name is logged and audited before the
// master vouched for it: marked unverified, and only when serve's config
// names that user; anything else may be a password typed into the wrong
// field, and is never written anywhere.
func (s *Server) claimed(name, eauth string) string {
	if s.Logins != nil {
		for _, k := range []string{name, eauth + ":" + name} {
			if _, ok := s.Logins.Roles.Users[k]; ok {
				return "unverified:" + name
			}
		}
	}
	return "unverified:(a name not in access.users)"
}

// login: POST /api/v1/login {"username", "password", "eauth"}.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.Logins == nil || s.Logins.People == nil {
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: "logins with a Salt identity are not enabled on this server: use a token"})
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		// A cross-site form can post text/plain without asking the
		// browser's permission; JSON it cannot.
		writeErr(w, http.StatusUnsupportedMediaType, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "Content-Type",
			Message: "Content-Type: a login is JSON: send Content-Type: application/json"})
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
	if backends := s.Logins.Roles.Backends(); !slices.Contains(backends, body.Eauth) {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "eauth",
			Message: fmt.Sprintf("eauth: %q is not one this server takes logins for: give %s (serve's access.eauth lists them)", body.Eauth, strings.Join(backends, ", "))})
		return
	}
	src := source(r)
	// One client, one count: an IPv6 host holds its whole /64.
	key := kubeauth.SourceKey(src)
	ok, wait := s.loginFails.begin(key, time.Now())
	if !ok {
		s.loginsRefused.Add(1)
		w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
		writeErr(w, http.StatusTooManyRequests, saltvolumes.Error{Code: saltvolumes.CodeLimit,
			Message: fmt.Sprintf("too many failed logins from %s: try again in %s", src, wait.Round(time.Second))})
		return
	}
	failed := true
	defer func() { s.loginFails.end(key, time.Now(), failed) }()
	who := &access.Principal{User: s.claimed(body.Username, body.Eauth), Eauth: body.Eauth, Kind: "session"}
	refuse := func(status int, code, msg string) {
		s.loginsRefused.Add(1)
		s.Log.Warn("login refused", "user", who.User, "eauth", body.Eauth, "source", src, "reason", msg)
		s.audit(r, who, &note{}, "refused", status, msg)
		writeErr(w, status, saltvolumes.Error{Code: code, Message: msg})
	}
	id, err := s.Logins.People.Authenticate(r.Context(), body.Username, body.Password, body.Eauth)
	if errors.Is(err, saltapi.ErrBadCredentials) {
		refuse(http.StatusUnauthorized, saltvolumes.CodeUnauthorized, "the salt master refused the user name, password or eauth")
		return
	}
	if err != nil {
		failed = false // the master's trouble, not a guess
		writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable, Message: "login: asking the salt master: " + err.Error()})
		return
	}
	var minions []string
	if s.Nodes != nil {
		minions, _ = s.Nodes(r.Context())
	}
	acc, err := s.Logins.People.UserAccess(r.Context(), id.User, id.Eauth, minions)
	if err != nil {
		failed = false
		writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable, Message: "login: asking the salt master for the user's groups and ACL: " + err.Error()})
		return
	}
	who.User, who.Groups = id.User, acc.Groups
	role := s.Logins.Roles.For(id.Eauth, id.User, acc.Groups)
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
	failed = false
	s.rememberACL(id.User, id.Eauth, acc)
	s.rememberPerson(id.User, id.Eauth, role, acc.Groups)
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
	person := p.Person()
	if person == "" {
		return true
	}
	if s.Logins == nil || s.Logins.People == nil {
		// Logins switched off (no access: section) while a person's
		// session or token lives on: nothing says what they may do.
		noteOf(r.Context()).refused = true
		writeErr(w, http.StatusForbidden, saltvolumes.Error{Code: saltvolumes.CodeForbidden,
			Message: fmt.Sprintf("%s: logins with a Salt identity are off on this server, so nothing bounds %s's changes; nothing was changed", p.User, person)})
		return false
	}
	key := aclKey(person, p.Eauth, node)
	s.acl.mu.Lock()
	a, ok := s.acl.answers[key]
	s.acl.mu.Unlock()
	if !ok || time.Since(a.at) >= aclTTL {
		acc, err := s.Logins.People.UserAccess(r.Context(), person, p.Eauth, []string{node})
		if err != nil {
			writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable, Message: fmt.Sprintf("asking the salt master whether %s may act on %s: %v; nothing was changed", person, node, err)})
			noteOf(r.Context()).refused = true
			return false
		}
		s.rememberACL(person, p.Eauth, acc)
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
	who := p.User
	if person != p.User {
		who += " (made by " + person + ")"
	}
	writeErr(w, http.StatusForbidden, saltvolumes.Error{Code: saltvolumes.CodeForbidden,
		Message: fmt.Sprintf("%s may not change volumes on %s: the Salt ACL of %s (eauth %s) grants salt_volumes.apply_volume %s; nothing was changed", who, node, person, p.Eauth, has)})
	return false
}
