package api

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/store"
)

func withAccess(st **store.Bolt) func(*Server) {
	return func(s *Server) {
		b := s.Store.(*store.Bolt)
		*st = b
		s.Tokens = &access.Tokens{Records: b, Bootstrap: token}
		s.Audit = &access.Audit{Records: b}
	}
}

// What each role may do through the API, and what the audit shows of it.
func TestRolesAndAudit(t *testing.T) {
	var st *store.Bolt
	ts, _ := newServerWith(t, withAccess(&st))
	mk := func(name, role string) string {
		t.Helper()
		code, m := do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"`+name+`","role":"`+role+`","expires":"90d"}`)
		require.Equal(t, 201, code, m)
		assert.Equal(t, role, m["role"])
		assert.NotEmpty(t, m["expires"])
		sec, _ := m["token"].(string)
		require.Regexp(t, `^svt_[A-Za-z0-9_-]{43}$`, sec)
		return sec
	}
	viewer, operator := mk("dashboards", "viewer"), mk("ci", "operator")

	code, m := do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"ci","role":"viewer"}`)
	assert.Equal(t, 400, code)
	assert.Equal(t, "name", errField(m, "field"), "a second token of one name")
	code, m = do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"x","role":"root"}`)
	assert.Equal(t, 400, code)
	assert.Equal(t, "role", errField(m, "field"))
	assert.Contains(t, errField(m, "message"), "viewer, operator or admin")
	code, m = do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"x","role":"viewer","expires":"soon"}`)
	assert.Equal(t, 400, code)
	assert.Equal(t, "expires", errField(m, "field"))

	code, m = do(t, ts, "GET", "/api/v1/whoami", operator, "")
	require.Equal(t, 200, code)
	assert.Equal(t, "token:ci", m["user"])
	assert.Equal(t, "operator", m["role"])

	// A viewer reads and scrapes, and changes nothing.
	code, _ = do(t, ts, "GET", "/api/v1/volumes", viewer, "")
	assert.Equal(t, 200, code)
	code, _ = do(t, ts, "GET", "/metrics", viewer, "")
	assert.Equal(t, 200, code)
	code, _ = do(t, ts, "POST", "/api/v1/watch/ticket", viewer, "")
	assert.Equal(t, 200, code)
	code, m = do(t, ts, "POST", "/api/v1/volumes", viewer, `{"name":"v1","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	assert.Equal(t, 403, code)
	assert.Equal(t, "forbidden", errField(m, "code"))
	assert.Contains(t, errField(m, "message"), "token:dashboards (role viewer)")
	assert.Contains(t, errField(m, "message"), "needs role operator")
	assert.Equal(t, 0, st.Len(), "nothing created")
	code, _ = do(t, ts, "GET", "/api/v1/tokens", viewer, "")
	assert.Equal(t, 403, code)

	// An operator creates and deletes, but names no raw device, wipes
	// nothing, forgets nothing.
	code, m = do(t, ts, "POST", "/api/v1/volumes", operator, `{"name":"v1","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	require.Equal(t, 201, code, m)
	code, m = do(t, ts, "POST", "/api/v1/volumes", operator, `{"name":"raw","node":"node-1","rawBlockDevice":{"devicePath":"/dev/sdb"}}`)
	assert.Equal(t, 403, code)
	assert.Contains(t, errField(m, "message"), "raw device (/dev/sdb)")
	assert.Contains(t, errField(m, "message"), "needs role admin")
	_, err := st.Get("raw")
	assert.ErrorIs(t, err, store.ErrNotFound)
	code, _ = do(t, ts, "DELETE", "/api/v1/volumes/v1?wipe=true", operator, "")
	assert.Equal(t, 403, code)
	code, _ = do(t, ts, "DELETE", "/api/v1/volumes/v1?forget=true", operator, "")
	assert.Equal(t, 403, code)
	v, err := st.Get("v1")
	require.NoError(t, err)
	assert.False(t, v.DeleteRequested, "refused deletes changed nothing")
	code, _ = do(t, ts, "POST", "/api/v1/nodes/node-1/forget", operator, `{"volumes":["v1"]}`)
	assert.Equal(t, 403, code)
	code, _ = do(t, ts, "DELETE", "/api/v1/volumes/v1", operator, "")
	assert.Equal(t, 202, code)

	// Listing never shows a secret; a revoked token is refused at once.
	code, m = do(t, ts, "GET", "/api/v1/tokens", token, "")
	require.Equal(t, 200, code)
	items, _ := m["items"].([]any)
	require.Len(t, items, 2)
	for _, it := range items {
		assert.NotContains(t, it, "token")
	}
	code, _ = do(t, ts, "DELETE", "/api/v1/tokens/ci", token, "")
	assert.Equal(t, 200, code)
	code, _ = do(t, ts, "GET", "/api/v1/volumes", operator, "")
	assert.Equal(t, 401, code, "revoked")
	code, m = do(t, ts, "DELETE", "/api/v1/tokens/ci", token, "")
	assert.Equal(t, 404, code)
	assert.Contains(t, errField(m, "message"), "token list")

	// The audit: every change and refusal, by whom; readable by admins.
	code, _ = do(t, ts, "GET", "/api/v1/audit", viewer, "")
	assert.Equal(t, 403, code)
	code, m = do(t, ts, "GET", "/api/v1/audit?user=token:ci", token, "")
	require.Equal(t, 200, code, m)
	var got []string
	for _, it := range m["items"].([]any) {
		e := it.(map[string]any)
		vol, _ := e["volume"].(string)
		got = append(got, e["method"].(string)+" "+e["route"].(string)+" "+e["decision"].(string)+" "+vol)
		assert.Equal(t, "operator", e["role"])
		assert.Equal(t, "127.0.0.1", e["source"])
	}
	assert.Equal(t, []string{
		"POST /api/v1/volumes allowed v1",
		"POST /api/v1/volumes refused raw",
		"DELETE /api/v1/volumes/v1?wipe=true refused v1",
		"DELETE /api/v1/volumes/v1?forget=true refused v1",
		"POST /api/v1/nodes/node-1/forget refused ",
		"DELETE /api/v1/volumes/v1 allowed v1",
	}, got)
	// A volume's own history is for everyone who may read the volume.
	code, m = do(t, ts, "GET", "/api/v1/volumes/v1/history", viewer, "")
	require.Equal(t, 200, code, m)
	assert.Len(t, m["items"], 4, "the create, the two refused deletes, the delete (not the viewer's refused create of that name: #48's review)")
	code, m = do(t, ts, "GET", "/api/v1/audit?user=unauthenticated", token, "")
	require.Equal(t, 200, code)
	assert.Len(t, m["items"], 1, "the revoked token's refusal, once per source per 10 s")
	code, m = do(t, ts, "GET", "/api/v1/audit?since=1d&limit=1", token, "")
	require.Equal(t, 200, code)
	assert.Len(t, m["items"], 1)
	code, m = do(t, ts, "GET", "/api/v1/audit?since=yesterday", token, "")
	assert.Equal(t, 400, code)
	assert.Equal(t, "since", errField(m, "field"))
}

// Failed logins from one address are counted within the window, others'
// apart, and a success forgets none of them.
func TestLoginFailuresPerSource(t *testing.T) {
	var f loginFailures
	now := time.Now()
	for range loginFree {
		f.add("10.0.0.1", now)
	}
	f.add("10.0.0.2", now)
	assert.Equal(t, loginFree, f.recent("10.0.0.1", now), "slowed down from the next attempt")
	assert.Equal(t, 1, f.recent("10.0.0.2", now))
	assert.Equal(t, 0, f.recent("10.0.0.1", now.Add(loginWindow)), "forgotten after the window")
	// One's own good login between guesses forgets none of them.
	ok, _ := f.begin("10.0.0.2", now)
	require.True(t, ok)
	f.end("10.0.0.2", now, false)
	assert.Equal(t, 1, f.recent("10.0.0.2", now))
}

// add counts a failure from src outside an attempt (the tests' shortcut
// for begin and end).
func (f *loginFailures) add(src string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ls := f.source(src, now)
	ls.failures = append(ls.failures, now)
	ls.last = now
}
