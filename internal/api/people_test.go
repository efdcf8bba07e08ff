package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/store"
)

// fakePeople stands in for the master's eauth in the error-path tests
// here; test/controlplane TestPeopleLogInWithSalt is the real one.
type fakePeople struct {
	mu       sync.Mutex
	password map[string]string   // user -> password
	groups   map[string][]string // user -> groups
	acl      map[string][]string // user -> minions their ACL grants
	slow     time.Duration
	checked  atomic.Int64
}

func (f *fakePeople) Authenticate(ctx context.Context, user, password, eauth string) (saltapi.Identity, error) {
	f.checked.Add(1)
	time.Sleep(f.slow)
	f.mu.Lock()
	defer f.mu.Unlock()
	if pw, ok := f.password[user]; !ok || pw != password {
		return saltapi.Identity{}, saltapi.ErrBadCredentials
	}
	return saltapi.Identity{User: user, Eauth: eauth}, nil
}

func (f *fakePeople) UserAccess(ctx context.Context, user, eauth string, minions []string) (saltapi.Access, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := saltapi.Access{User: user, Eauth: eauth, Groups: f.groups[user], Allowed: map[string]bool{}, Grants: f.acl[user]}
	for _, m := range minions {
		for _, g := range f.acl[user] {
			if g == "*" || g == m {
				a.Allowed[m] = true
			}
		}
	}
	return a, nil
}

func (f *fakePeople) setGroups(user string, groups ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups[user] = groups
}

func withPeople(st **store.Bolt, f *fakePeople, roles access.RoleMap) func(*Server) {
	return func(s *Server) {
		withAccess(st)(s)
		s.Logins = &Logins{People: f, Roles: roles, TTL: time.Hour}
		s.WatchRecheck = 50 * time.Millisecond
	}
}

func login(t *testing.T, ts *httptest.Server, user, pw, eauth string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", ts.URL+"/api/v1/login", strings.NewReader(`{"username":"`+user+`","password":"`+pw+`","eauth":"`+eauth+`"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	return doReq(t, req)
}

func doReq(t *testing.T, req *http.Request) (int, map[string]any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var m map[string]any
	_ = jsonDecode(resp, &m)
	return resp.StatusCode, m
}

func newPeople() *fakePeople {
	return &fakePeople{
		password: map[string]string{"alice": "alice-pw", "dave": "dave-pw", "admin": "ldap-admin-pw"},
		groups:   map[string][]string{"dave": {"storage"}},
		acl:      map[string][]string{"alice": {"node-1"}, "dave": {"node-1"}, "admin": {"*"}},
	}
}

// #48 item 15: a login is JSON only, so that a cross-site form (which
// may post text/plain unasked) cannot make visitors' browsers guess
// passwords; a password typed as the user name is never written down.
func TestLoginTakesJSONOnly(t *testing.T) {
	var st *store.Bolt
	f := newPeople()
	ts, _ := newServerWith(t, withPeople(&st, f, access.RoleMap{Users: map[string]access.Role{"alice": access.Operator}, Eauth: []string{"file"}}))
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""} {
		req, _ := http.NewRequest("POST", ts.URL+"/api/v1/login", strings.NewReader(`{"username":"alice","password":"alice-pw","eauth":"file"}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		code, m := doReq(t, req)
		assert.Equal(t, http.StatusUnsupportedMediaType, code, ct)
		assert.Contains(t, errField(m, "message"), "application/json", ct)
	}
	assert.Zero(t, f.checked.Load(), "no password was checked")
	code, m := login(t, ts, "alice", "alice-pw", "file")
	require.Equal(t, 200, code, m)

	code, _ = login(t, ts, "Tr0ub4dor&3", "oops", "file")
	assert.Equal(t, 401, code)
	code, m = do(t, ts, "GET", "/api/v1/audit", token, "")
	require.Equal(t, 200, code)
	assert.NotContains(t, mustJSON(t, m), "Tr0ub4dor", "a password in the user field is not kept")
	assert.Contains(t, mustJSON(t, m), "unverified:")
}

// #48 item 9: roles are given per eauth backend; the default backend
// list is explicit (pam), so an LDAP or file user named like an admin is
// not that admin.
func TestRolesKeyedByEauth(t *testing.T) {
	var st *store.Bolt
	f := newPeople()
	ts, _ := newServerWith(t, withPeople(&st, f, access.RoleMap{Users: map[string]access.Role{"admin": access.Admin}}))
	code, m := login(t, ts, "admin", "ldap-admin-pw", "ldap")
	assert.Equal(t, 400, code)
	assert.Equal(t, "eauth", errField(m, "field"))
	assert.Contains(t, errField(m, "message"), "give pam")
	code, m = login(t, ts, "admin", "ldap-admin-pw", "pam")
	require.Equal(t, 200, code, m)
	assert.Equal(t, "admin", m["role"])
}

// #48 item 10: parallel guesses from one address are not all checked:
// past the free attempts, one at a time, the rest answered 429 unchecked.
func TestLoginThrottleHoldsUnderConcurrency(t *testing.T) {
	var st *store.Bolt
	f := newPeople()
	f.slow = 50 * time.Millisecond
	ts, _ := newServerWith(t, withPeople(&st, f, access.RoleMap{Users: map[string]access.Role{"alice": access.Operator}, Eauth: []string{"file"}}))
	var wg sync.WaitGroup
	var tooMany atomic.Int64
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, _ := login(t, ts, "alice", "wrong", "file"); code == http.StatusTooManyRequests {
				tooMany.Add(1)
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, f.checked.Load(), int64(loginFree+1), "at most the free attempts (and one more) reached the master")
	assert.GreaterOrEqual(t, tooMany.Load(), int64(200-loginFree-1))
	code, m := login(t, ts, "alice", "alice-pw", "file")
	assert.Equal(t, http.StatusTooManyRequests, code, "the right password waits its turn too")
	assert.Contains(t, errField(m, "message"), "try again in")
}

// The table of sources is bounded, and a flood from many addresses never
// frees the busiest guesser.
func TestLoginTableKeepsTheBusiest(t *testing.T) {
	var f loginFailures
	now := time.Now()
	for range 5 {
		f.add("10.0.0.1", now)
	}
	for i := range loginSources + 500 {
		f.add("192.0.2."+itoa(i), now)
	}
	assert.Equal(t, 5, f.recent("10.0.0.1", now))
	assert.LessOrEqual(t, len(f.byIP), loginSources)
	ok, wait := f.begin("10.0.0.1", now)
	assert.False(t, ok)
	assert.Greater(t, wait, time.Duration(0))
}

// #48 item 8: a token made by a person never exceeds them: at most their
// role, and their Salt ACL bounds its changes.
func TestTokensOfAPersonStayWithinTheirACL(t *testing.T) {
	var st *store.Bolt
	f := newPeople()
	ts, _ := newServerWith(t, withPeople(&st, f, access.RoleMap{Users: map[string]access.Role{"dave": access.Admin}, Eauth: []string{"file"}}))
	code, m := login(t, ts, "dave", "dave-pw", "file")
	require.Equal(t, 200, code, m)
	dave := m["token"].(string)
	code, m = do(t, ts, "POST", "/api/v1/tokens", dave, `{"name":"ci","role":"admin"}`)
	require.Equal(t, 201, code, m)
	ci := m["token"].(string)
	code, m = do(t, ts, "POST", "/api/v1/volumes", ci, `{"name":"v2","node":"node-2","sparseLoopDevice":{"size":"1Gi"}}`)
	assert.Equal(t, 403, code, "dave's ACL covers node-1 only, and so does his token's")
	assert.Contains(t, errField(m, "message"), "token:ci (made by dave) may not change volumes on node-2")
	code, m = do(t, ts, "POST", "/api/v1/volumes", ci, `{"name":"v1","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	assert.Equal(t, 201, code, m)
	code, _ = do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"fleet","role":"admin"}`)
	assert.Equal(t, 201, code, "the bootstrap token makes fleet-wide tokens")
}

// #48 item 12: a session's role follows serve's config and the person's
// Salt groups within personTTL, and a token a person made is lowered with
// them; a person with no role left is logged out everywhere.
func TestRolesAreDerivedAgain(t *testing.T) {
	var st *store.Bolt
	f := newPeople()
	var srv *Server
	ts, _ := newServerWith(t, func(s *Server) {
		srv = s
		withPeople(&st, f, access.RoleMap{Groups: map[string]access.Role{"storage": access.Admin}, Eauth: []string{"file"}})(s)
	})
	code, m := login(t, ts, "dave", "dave-pw", "file")
	require.Equal(t, 200, code, m)
	dave := m["token"].(string)
	code, m = do(t, ts, "POST", "/api/v1/tokens", dave, `{"name":"ops","role":"admin"}`)
	require.Equal(t, 201, code, m)
	ops := m["token"].(string)
	code, _ = do(t, ts, "GET", "/api/v1/tokens", dave, "")
	require.Equal(t, 200, code)

	f.setGroups("dave") // out of "storage" on the master
	expirePeople(srv)
	code, _ = do(t, ts, "GET", "/api/v1/tokens", dave, "")
	assert.Equal(t, 401, code, "no role left: the session ends")
	code, _ = do(t, ts, "GET", "/api/v1/volumes", ops, "")
	assert.Equal(t, 401, code, "and the token he made")

	f.setGroups("dave", "storage")
	expirePeople(srv)
	code, _ = do(t, ts, "GET", "/api/v1/tokens", dave, "")
	assert.Equal(t, 200, code, "back in the group")
	srv.Logins.Roles.Groups["storage"] = access.Viewer // serve's config, as a restart would
	expirePeople(srv)
	code, m = do(t, ts, "GET", "/api/v1/whoami", dave, "")
	require.Equal(t, 200, code)
	assert.Equal(t, "viewer", m["role"])
	code, _ = do(t, ts, "POST", "/api/v1/volumes", ops, `{"name":"v1","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	assert.Equal(t, 403, code, "the admin token of a person now a viewer reads only")
}

func expirePeople(s *Server) {
	s.people.mu.Lock()
	defer s.people.mu.Unlock()
	for k, a := range s.people.answers {
		a.at = time.Now().Add(-personTTL)
		s.people.answers[k] = a
	}
}

// #48 item 12: a watch stream ends once its token stops being valid:
// a logout, a revocation; by bearer or by ticket.
func TestWatchEndsWithItsToken(t *testing.T) {
	var st *store.Bolt
	f := newPeople()
	ts, _ := newServerWith(t, withPeople(&st, f, access.RoleMap{Users: map[string]access.Role{"alice": access.Operator}, Eauth: []string{"file"}}))
	open := func(query, tok string) *bufio.Reader {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		req, err := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/v1/watch?"+query, nil)
		require.NoError(t, err)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		require.Equal(t, 200, resp.StatusCode)
		return bufio.NewReader(resp.Body)
	}
	closed := func(r *bufio.Reader) string {
		t.Helper()
		for {
			line, err := r.ReadString('\n')
			if strings.HasPrefix(line, "event: CLOSED") {
				next, _ := r.ReadString('\n')
				return next
			}
			if err != nil {
				return "ended without CLOSED: " + err.Error()
			}
		}
	}
	for _, how := range []string{"bearer", "ticket"} {
		t.Run("logout ends a stream opened by "+how, func(t *testing.T) {
			code, m := login(t, ts, "alice", "alice-pw", "file")
			require.Equal(t, 200, code, m)
			sess := m["token"].(string)
			var r *bufio.Reader
			if how == "bearer" {
				r = open("", sess)
			} else {
				code, m = do(t, ts, "POST", "/api/v1/watch/ticket", sess, "")
				require.Equal(t, 200, code)
				r = open("ticket="+m["ticket"].(string), "")
			}
			code, _ = do(t, ts, "POST", "/api/v1/logout", sess, "")
			require.Equal(t, 200, code)
			assert.Contains(t, closed(r), "no longer valid")
		})
	}
	t.Run("revocation ends a service token's stream", func(t *testing.T) {
		code, m := do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"dash","role":"viewer"}`)
		require.Equal(t, 201, code)
		r := open("", m["token"].(string))
		code, _ = do(t, ts, "DELETE", "/api/v1/tokens/dash", token, "")
		require.Equal(t, 200, code)
		assert.Contains(t, closed(r), "no longer valid")
	})
}

func itoa(i int) string { return strconv.Itoa(i) }

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
