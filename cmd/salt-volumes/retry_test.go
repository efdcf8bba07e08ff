package main

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
)

// quickResends makes the resends of a request that got no answer quick.
func quickResends(t *testing.T) {
	t.Helper()
	old := resendAfter
	resendAfter = []time.Duration{time.Millisecond, time.Millisecond}
	t.Cleanup(func() { resendAfter = old })
}

// volumes is the fake's store of created volumes: POST /api/v1/volumes
// records one (409 exists for a name taken, as serve answers), GET
// /api/v1/volumes/NAME reads it.
type volumes struct {
	mu    sync.Mutex
	byKey map[string]saltvolumes.View
	posts int
}

func (s *volumes) put(v saltvolumes.View) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey == nil {
		s.byKey = map[string]saltvolumes.View{}
	}
	s.byKey[v.Spec.Name] = v
}

// post records the volume asked; lostFirst: the answer of the first
// request that made one is lost.
func (s *volumes) post(lostFirst bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var sp struct{ Name, UUID, Node string }
		_ = json.NewDecoder(r.Body).Decode(&sp)
		s.mu.Lock()
		s.posts++
		_, taken := s.byKey[sp.Name]
		s.mu.Unlock()
		if taken {
			replyErr(409, "exists", `name: volume "`+sp.Name+`" already exists: pick another name or delete it first`, "")(w, r)
			return
		}
		v := vol(sp.Name, saltvolumes.Unknown, "")
		v.Spec.UUID, v.Spec.Node = sp.UUID, sp.Node
		s.put(v)
		if lostFirst && s.posts == 1 {
			lose(nil)(w, r)
			return
		}
		reply(201, v)(w, r)
	}
}

func (s *volumes) get(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	s.mu.Lock()
	v, ok := s.byKey[name]
	s.mu.Unlock()
	if !ok {
		replyErr(404, "not_found", `volume "`+name+`" not found`, "")(w, r)
		return
	}
	reply(200, v)(w, r)
}

// A create whose answer is lost is sent again, with the uuid made here:
// the name then taken by a volume of that uuid is its own (exit 0, and
// --wait follows it), where it was exit 7 and every retry exit 3. Run
// again with that --uuid, the command takes the volume for its own; a
// name taken by another uuid (or on another node) stays exit 3.
func TestCreateKnowsItsOwnVolume(t *testing.T) {
	quickResends(t)
	t.Run("the answer lost", func(t *testing.T) {
		var st volumes
		a := newFakeAPI(t, map[string]http.HandlerFunc{
			"POST /api/v1/volumes":  st.post(true),
			"GET /api/v1/volumes/*": st.get,
			"GET /api/v1/info":      reply(200, client.Info{JobTimeoutSeconds: 60}),
			"GET /api/v1/watch":     stream(true, ev("ADDED", vol("v", saltvolumes.Pending, "create")), synced, ev("MODIFIED", vol("v", saltvolumes.Available, ""))),
		})
		out, errs, code := sv(t, at(a, "create", "v", "--node", "node-1", "--size", "1Gi", "--wait", "-o", "name")...)
		require.Equal(t, exitOK, code, errs)
		assert.Equal(t, "volume/v\n", out)
		assert.Contains(t, errs, "an earlier try made it")
		reqs := a.requests()
		require.GreaterOrEqual(t, len(reqs), 3, "%v", reqs)
		assert.Equal(t, []string{"POST /api/v1/volumes Bearer t", "POST /api/v1/volumes Bearer t", "GET /api/v1/volumes/v Bearer t"}, reqs[:3])
		assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, st.byKey["v"].Spec.UUID, "a random (v4) uuid, made here")
	})
	t.Run("no answer at all", func(t *testing.T) {
		a := newFakeAPI(t, map[string]http.HandlerFunc{"POST /api/v1/volumes": lose(nil)})
		_, errs, code := sv(t, at(a, "create", "v", "--node", "node-1", "--size", "1Gi")...)
		assert.Equal(t, exitRetry, code, errs)
		assert.Len(t, a.requests(), 3, "sent three times")
		assert.Regexp(t, `no answer creating volume v \(uuid ([0-9a-f-]{36})\): it may have been made; salt-volumes get v says, and running this command again with --uuid ([0-9a-f-]{36}) takes that volume for its own`, errs)
	})
	const mine = "0f2504e0-4f89-41d3-9a0c-0305e82c3301"
	for _, tc := range []struct {
		name, uuid, node string
		code             int
	}{
		{"run again with its --uuid", mine, "node-1", exitOK},
		{"its --uuid, in upper case", strings.ToUpper(mine), "node-1", exitOK},
		{"another uuid", "1f2504e0-4f89-41d3-9a0c-0305e82c3301", "node-1", exitRefused},
		{"no uuid", "", "node-1", exitRefused},
		{"its uuid, another node", mine, "node-2", exitRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st volumes
			v := vol("v", saltvolumes.Available, "")
			v.Spec.UUID = mine
			st.put(v)
			a := newFakeAPI(t, map[string]http.HandlerFunc{"POST /api/v1/volumes": st.post(false), "GET /api/v1/volumes/*": st.get})
			args := []string{"create", "v", "--node", tc.node, "--size", "1Gi", "-o", "name"}
			if tc.uuid != "" {
				args = append(args, "--uuid", tc.uuid)
			}
			out, errs, code := sv(t, at(a, args...)...)
			assert.Equal(t, tc.code, code, errs)
			if tc.code == exitOK {
				assert.Equal(t, "volume/v\n", out)
			} else {
				assert.Contains(t, errs, `volume "v" already exists`)
			}
		})
	}
}

// A clone of a volume as it is now: its helper snapshot goes when the
// server refused the clone, never when no answer came (a clone recorded
// from a snapshot Deleting could never be made): then the message says
// what to check. A name taken is exit 3, as every create's (it was 2).
func TestCloneKeepsItsSnapshotWithoutAnAnswer(t *testing.T) {
	quickResends(t)
	const other = "1f2504e0-4f89-41d3-9a0c-0305e82c3301"
	snapshotRoutes := func(post http.HandlerFunc, get http.HandlerFunc) map[string]http.HandlerFunc {
		return map[string]http.HandlerFunc{
			"GET /api/v1/volumes/*": get,
			"POST /api/v1/volumes/src/snapshots": func(w http.ResponseWriter, r *http.Request) {
				var b struct{ Name, For string }
				_ = json.NewDecoder(r.Body).Decode(&b)
				reply(201, saltvolumes.Snapshot{Name: b.Name, Volume: "src", VolumeUUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301", Node: "node-1", Phase: "Ready", Size: 1 << 30, For: b.For})(w, r)
			},
			"GET /api/v1/snapshots/*": func(w http.ResponseWriter, r *http.Request) {
				reply(200, saltvolumes.Snapshot{Name: strings.TrimPrefix(r.URL.Path, "/api/v1/snapshots/"), Volume: "src", VolumeUUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301", Node: "node-1", Phase: "Ready", Size: 1 << 30})(w, r)
			},
			"DELETE /api/v1/snapshots/*": reply(202, saltvolumes.Snapshot{Phase: "Deleting"}),
			"POST /api/v1/volumes":       post,
		}
	}
	deletes := func(a *fakeAPI) (n int) {
		for _, r := range a.requests() {
			if strings.HasPrefix(r, "DELETE /api/v1/snapshots/clone-c-") {
				n++
			}
		}
		return n
	}
	t.Run("no answer", func(t *testing.T) {
		var st volumes
		st.put(vol("src", saltvolumes.Available, ""))
		a := newFakeAPI(t, snapshotRoutes(lose(nil), st.get))
		_, errs, code := sv(t, at(a, "create", "c", "--from", "volume/src")...)
		assert.Equal(t, exitRetry, code, errs)
		assert.Zero(t, deletes(a), "the helper snapshot was deleted without an answer: %v", a.requests())
		assert.Regexp(t, `the snapshot (clone-c-[0-9a-f]{8}) taken for the clone is kept: if salt-volumes get c finds no volume, salt-volumes snapshot rm clone-c-[0-9a-f]{8} removes it`, errs)
	})
	t.Run("refused", func(t *testing.T) {
		var st volumes
		st.put(vol("src", saltvolumes.Available, ""))
		gets := 0
		a := newFakeAPI(t, snapshotRoutes(replyErr(409, "exists", `name: volume "c" already exists`, ""), func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/c") {
				// Not there when asked first; someone else's then.
				if gets++; gets > 1 {
					v := vol("c", saltvolumes.Available, "")
					v.Spec.UUID = other
					reply(200, v)(w, r)
					return
				}
			}
			st.get(w, r)
		}))
		_, errs, code := sv(t, at(a, "create", "c", "--from", "volume/src")...)
		assert.Equal(t, exitRefused, code, errs)
		assert.Equal(t, 1, deletes(a), "the helper snapshot of a clone refused stays: %v", a.requests())
	})
	for _, tc := range []struct {
		name, uuid string
		code       int
	}{
		{"a name taken", "", exitRefused},
		{"a name taken by another uuid", "2f2504e0-4f89-41d3-9a0c-0305e82c3301", exitRefused},
		{"its own, made by an earlier try", other, exitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st volumes
			st.put(vol("src", saltvolumes.Available, ""))
			c := vol("c", saltvolumes.Available, "")
			c.Spec.UUID = other
			st.put(c)
			a := newFakeAPI(t, snapshotRoutes(st.post(false), st.get))
			args := []string{"create", "c", "--from", "volume/src"}
			if tc.uuid != "" {
				args = append(args, "--uuid", tc.uuid)
			}
			_, errs, code := sv(t, at(a, args...)...)
			assert.Equal(t, tc.code, code, errs)
			if tc.code == exitRefused {
				assert.Contains(t, errs, "volume c exists: pick another name for the clone (nothing was taken)")
			}
			for _, r := range a.requests() {
				assert.NotContains(t, r, "/snapshots", "a snapshot was taken")
			}
		})
	}
}

// rm asked again: a volume being deleted already is what rm asks (exit
// 0, --wait follows it), a volume gone after a request whose answer was
// lost was deleted by it (exit 0); rm of a name there never was is 4.
func TestRmAgainSucceeds(t *testing.T) {
	quickResends(t)
	terminating := vol("v", saltvolumes.Terminating, "")
	terminating.Deleting = true
	already := replyErr(409, "delete_forbidden", `volume "v": the volume is already being deleted`, "")
	notFound := replyErr(404, "not_found", `volume "v" not found`, "")
	deleteThen := func(first, then http.HandlerFunc) http.HandlerFunc {
		n := 0
		var mu sync.Mutex
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			n++
			h := then
			if n == 1 {
				h = first
			}
			mu.Unlock()
			h(w, r)
		}
	}
	for _, tc := range []struct {
		name   string
		delete http.HandlerFunc
		args   []string
		code   int
		out    string
	}{
		{"being deleted already", already, nil, exitOK, "volume v: already being deleted\n"},
		{"being deleted already, --wait", already, []string{"--wait"}, exitOK, "volume v: already being deleted\nvolume v deleted\n"},
		{"the answer lost, then not found", deleteThen(lose(nil), notFound), nil, exitOK, "volume v: gone already (a request whose answer was lost deleted it)\n"},
		{"the answer lost, then being deleted", deleteThen(lose(nil), already), nil, exitOK, "volume v: already being deleted\n"},
		{"never there", notFound, nil, exitNotFound, ""},
		{"never an answer", lose(nil), nil, exitRetry, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAPI(t, map[string]http.HandlerFunc{
				"DELETE /api/v1/volumes/v": tc.delete,
				"GET /api/v1/volumes/v":    reply(200, terminating),
				"GET /api/v1/info":         reply(200, client.Info{JobTimeoutSeconds: 60}),
				"GET /api/v1/watch":        stream(true, ev("ADDED", terminating), synced, ev("DELETED", terminating)),
			})
			out, errs, code := sv(t, at(a, append([]string{"rm", "v"}, tc.args...)...)...)
			assert.Equal(t, tc.code, code, errs)
			assert.Equal(t, tc.out, out)
			if tc.name == "never an answer" {
				assert.Contains(t, errs, "no answer: the deletion may have been recorded; salt-volumes get v says, and salt-volumes rm v again is safe")
			}
		})
	}
}

// No redirect is followed, by any command: the token and a login's
// password never reach the server it points to; exit 2, naming it.
func TestRedirectsAreRefused(t *testing.T) {
	other := newFakeAPI(t, map[string]http.HandlerFunc{
		"POST /api/v1/login":  reply(200, client.Session{Token: "stolen", User: "alice", Expire: time.Now().Add(time.Hour)}),
		"GET /api/v1/volumes": reply(200, map[string]any{"items": []any{}}),
	})
	for _, code := range []int{302, 307, 308} {
		redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, code)
		}))
		t.Cleanup(redirecting.Close)
		t.Setenv("XDG_CONFIG_HOME", t.TempDir())
		_, errs, c := svIn(t, "password\n", "login", "--url", redirecting.URL, "--user", "alice")
		assert.Equal(t, exitUsage, c, errs)
		assert.Contains(t, errs, "a redirect to "+other.URL+"/api/v1/login: salt-volumes does not follow redirects")
		assert.Nil(t, loadSession())
		_, errs, c = sv(t, "ls", "--url", redirecting.URL, "--token", "secret")
		assert.Equal(t, exitUsage, c, errs)
	}
	assert.Empty(t, other.requests(), "the server redirected to was asked")
}

// Exit 7 is for what a retry may mend: a token no request can carry, an
// address that is not http(s), https to an http port, a watch that is
// not an event stream are not (2, 2, 1, 1); a server that stops answering
// is 7 within the header timeout, not a hang.
func TestWhatARetryDoesNotMend(t *testing.T) {
	plain := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/watch": reply(200, map[string]any{"a": "login page"})})
	twoLines := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(twoLines, []byte("first\nsecond\n"), 0o600))
	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"a token with a newline", []string{"ls", "--url", plain.URL, "--token", "a\nb"}, exitUsage, "the token of --token (or SALT_VOLUMES_TOKEN): it holds a control character ('\\n') at byte 1: not sent"},
		{"a token file of two lines", []string{"ls", "--url", plain.URL, "--token-file", twoLines}, exitUsage, "the token of --token-file (or SALT_VOLUMES_TOKEN_FILE) " + twoLines},
		{"not http", []string{"ls", "--url", "ftp://127.0.0.1:21", "--token", "t"}, exitUsage, `--url (or SALT_VOLUMES_URL) "ftp://127.0.0.1:21": not an http or https address`},
		{"no scheme", []string{"ls", "--url", "127.0.0.1:8080", "--token", "t"}, exitUsage, "write http://HOST:PORT or https://HOST:PORT"},
		{"no scheme, a host name", []string{"ls", "--url", "salt-master", "--token", "t"}, exitUsage, "write http://HOST:PORT or https://HOST:PORT"},
		{"https to an http port", []string{"ls", "--url", strings.Replace(plain.URL, "http:", "https:", 1), "--token", "t"}, exitFailed, "server gave HTTP response to HTTPS client"},
		{"a watch that is not an event stream", []string{"watch", "--url", plain.URL, "--token", "t"}, exitFailed, "not an event stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(plain.requests())
			_, errs, code := sv(t, tc.args...)
			assert.Equal(t, tc.code, code, errs)
			assert.Contains(t, errs, tc.msg)
			if tc.code == exitUsage {
				assert.Len(t, plain.requests(), before, "asked anyway")
			}
		})
	}
	t.Run("a server that stops answering", func(t *testing.T) {
		old := headerTimeout
		headerTimeout = 200 * time.Millisecond
		t.Cleanup(func() { headerTimeout = old })
		silent := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/volumes": func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }})
		start := time.Now()
		_, errs, code := sv(t, at(silent, "ls")...)
		assert.Equal(t, exitRetry, code, errs)
		assert.Contains(t, errs, "no answer within 200ms")
		assert.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("snapshot --wait, a poll that hangs", func(t *testing.T) {
		hanging := newFakeAPI(t, map[string]http.HandlerFunc{
			"POST /api/v1/volumes/v/snapshots": reply(201, saltvolumes.Snapshot{Name: "s", Volume: "v", Phase: "Pending"}),
			"GET /api/v1/snapshots/s":          func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
		})
		start := time.Now()
		_, errs, code := sv(t, at(hanging, "snapshot", "create", "v", "s", "--wait", "--timeout", "300ms")...)
		assert.Equal(t, exitTimeout, code, errs)
		assert.Contains(t, errs, "snapshot s: still not seen after 300ms")
		assert.Less(t, time.Since(start), 5*time.Second, "the timeout bounds the requests")
	})
	t.Run("a 502 of a leader out of reach", func(t *testing.T) {
		a := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/nodes": replyErr(502, "unavailable", "this replica follows b, which could not be reached", "")})
		_, errs, code := sv(t, at(a, "nodes")...)
		assert.Equal(t, exitRetry, code, errs)
	})
}

// The default --timeout takes the server's jobTimeoutSeconds between 1 s
// and 24 h; out of it (a number that would wrap), serve's default.
func TestWaitTimeoutIsBounded(t *testing.T) {
	for _, tc := range []struct {
		seconds int64
		want    time.Duration
	}{
		{120, 3 * time.Minute},
		{86400, 24*time.Hour + time.Minute},
		{86401, 11 * time.Minute},
		{math.MaxInt64, 11 * time.Minute},
		{math.MaxInt64 / 1000, 11 * time.Minute},
		{0, 11 * time.Minute},
		{-5, 11 * time.Minute},
	} {
		a := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/info": reply(200, client.Info{JobTimeoutSeconds: tc.seconds})})
		c := &cli{}
		cmd := c.waitCmd()
		require.NoError(t, cmd.ParseFlags(nil))
		cmd.SetContext(t.Context())
		d, err := c.waitTimeout(cmd, &client.Client{URL: a.URL, Token: "t"}, 0)
		require.NoError(t, err)
		assert.Equal(t, tc.want, d, "jobTimeoutSeconds %d", tc.seconds)
	}
}

// logout --local drops a session whose server is gone, asking nothing;
// logout without it says so when the server does not answer.
func TestLogoutLocal(t *testing.T) {
	a := newFakeAPI(t, nil)
	p := saveTestSession(t, a.URL)
	a.Close()
	_, errs, code := sv(t, "logout")
	assert.Equal(t, exitRetry, code)
	assert.Contains(t, errs, "the session is kept, to end it later; salt-volumes logout --local drops it here without asking the server")
	_, err := os.Stat(p)
	require.NoError(t, err)
	out, errs, code := sv(t, "logout", "--local")
	require.Equal(t, exitOK, code, errs)
	assert.Contains(t, out, "session of alice dropped here; "+a.URL+" was not asked")
	_, err = os.Stat(p)
	assert.True(t, os.IsNotExist(err), "%v", err)
	assert.Empty(t, a.requests())
}
