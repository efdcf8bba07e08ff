package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
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
	"sigs.k8s.io/yaml"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Help is exit 0, for every command and through help CMD; a command
// there is not, or a group without its subcommand, exit 2 naming what
// there is.
func TestHelpAndGroups(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // on stdout
		errs string // on stderr
	}{
		{"--help", []string{"--help"}, exitOK, "Volumes:\n", ""},
		{"-h of a subcommand", []string{"snapshot", "create", "-h"}, exitOK, "Examples:\n  salt-volumes snapshot create", ""},
		{"help", []string{"help"}, exitOK, "People and tokens:\n", ""},
		{"help of a command", []string{"help", "ls"}, exitOK, "salt-volumes ls --phase Failed,Pending", ""},
		{"help of a subcommand", []string{"help", "snapshot", "schedule"}, exitOK, "--every", ""},
		{"help of help", []string{"help", "--help"}, exitOK, "salt-volumes help snapshot create", ""},
		{"help of no command", []string{"help", "nosuch"}, exitUsage, "", `help: no command "nosuch"`},
		{"help of no subcommand", []string{"help", "snapshot", "nosuch"}, exitUsage, "", `no command "snapshot nosuch"`},
		{"snapshot alone", []string{"snapshot"}, exitUsage, "", "snapshot: give a subcommand: create, get, ls, restore, rm, schedule, schedules or unschedule"},
		{"snapshot of no subcommand", []string{"snapshot", "frob"}, exitUsage, "", `snapshot: "frob" is not a subcommand`},
		{"token alone", []string{"token"}, exitUsage, "", "token: give a subcommand: create, list or revoke"},
		{"node alone", []string{"node"}, exitUsage, "", "node: give a subcommand: forget"},
		{"store alone", []string{"store"}, exitUsage, "", "store: give a subcommand: migrate"},
		{"completion alone", []string{"completion"}, exitUsage, "", "completion: give a subcommand: bash, fish or zsh"},
		{"a completion script", []string{"completion", "bash"}, exitOK, "bash completion V2 for salt-volumes", ""},
		{"nothing at all", nil, exitUsage, "Usage:", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := sv(t, tc.args...)
			assert.Equal(t, tc.code, code, errs)
			assert.Contains(t, out, tc.out)
			assert.Contains(t, errs, tc.errs)
		})
	}
}

// Each kind of answer has its exit code: 7 for what is safe to retry (a
// 503, a 429 with Retry-After, a 409 busy, no answer, a watch the server
// ended), the others as they always were.
func TestExitCodesOfAnswers(t *testing.T) {
	gone := newFakeAPI(t, nil)
	gone.Close() // no answer from it
	for _, tc := range []struct {
		name  string
		reply http.HandlerFunc
		code  int
		msg   string
	}{
		{"unavailable", replyErr(503, "unavailable", "etcd out of reach", "5"), exitRetry, "etcd out of reach (retry after 5s)"},
		{"unavailable without Retry-After", replyErr(503, "limit", "1000 watch streams are open", ""), exitRetry, "1000 watch streams are open"},
		{"a rate", replyErr(429, "limit", "more than 100 creates per second", "1"), exitRetry, "more than 100 creates per second (retry after 1s)"},
		{"limits.volumes", replyErr(429, "limit", "the control plane holds 5 volumes, its limit", ""), exitRefused, "its limit"},
		{"busy", replyErr(409, "busy", "the volume changed meanwhile", "1"), exitRetry, "changed meanwhile"},
		{"taken", replyErr(409, "exists", "volume v exists", ""), exitRefused, "volume v exists"},
		{"not found", replyErr(404, "not_found", `volume "v" not found`, ""), exitNotFound, `volume "v" not found`},
		{"not allowed", replyErr(403, "forbidden", "needs role operator", ""), exitDenied, "needs role operator"},
		{"invalid", replyErr(400, "invalid", "name: not a DNS-1123 label", ""), exitUsage, "not a DNS-1123 label"},
		{"server error", replyErr(500, "internal", "boom", ""), exitFailed, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/volumes/v": tc.reply})
			_, errs, code := sv(t, at(a, "get", "v")...)
			assert.Equal(t, tc.code, code, errs)
			assert.Contains(t, errs, tc.msg)
		})
	}
	t.Run("no answer", func(t *testing.T) {
		_, errs, code := sv(t, "get", "v", "--url", gone.URL, "--token", "t")
		assert.Equal(t, exitRetry, code, errs)
		assert.Contains(t, errs, "salt-volumes API at "+gone.URL)
	})
	t.Run("a certificate not trusted", func(t *testing.T) {
		untrusted := httptest.NewUnstartedServer(http.NotFoundHandler())
		untrusted.Config.ErrorLog = log.New(io.Discard, "", 0) // its handshake refused, as it should be
		untrusted.StartTLS()
		defer untrusted.Close()
		_, errs, code := sv(t, "get", "v", "--url", untrusted.URL, "--token", "t")
		assert.Equal(t, exitFailed, code, "no retry mends it: %s", errs)
		assert.Contains(t, errs, "certificate")
	})
	t.Run("a watch the server ended", func(t *testing.T) {
		a := newFakeAPI(t, map[string]http.HandlerFunc{
			"GET /api/v1/info":  reply(200, client.Info{JobTimeoutSeconds: 60}),
			"GET /api/v1/watch": stream(false, ev("ADDED", vol("v", saltvolumes.Pending, "create")), synced),
		})
		_, errs, code := sv(t, at(a, "wait", "v")...)
		assert.Equal(t, exitRetry, code, errs)
		assert.Contains(t, errs, "watch stream closed by the server before it was Available; keep following with: salt-volumes wait v --for Available")
	})
	t.Run("watch, its stream ended", func(t *testing.T) {
		a := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/watch": stream(false, synced)})
		_, errs, code := sv(t, at(a, "watch")...)
		assert.Equal(t, exitRetry, code, errs)
	})
}

// Flags beat the environment, read only when a flag is not given: a
// token file on the command line beats a token in the environment, a
// --url the environment's; the help shows no value from it.
func TestConnectionFlagsAndEnvironment(t *testing.T) {
	list := map[string]http.HandlerFunc{"GET /api/v1/volumes": reply(200, map[string]any{"items": []any{}})}
	a, b := newFakeAPI(t, list), newFakeAPI(t, list)
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("from-file\n"), 0o600))
	envFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(envFile, []byte("from-env-file\n"), 0o600))
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		server *fakeAPI
		auth   string
	}{
		{"the environment", map[string]string{"SALT_VOLUMES_URL": a.URL, "SALT_VOLUMES_TOKEN": "from-env"}, nil, a, "Bearer from-env"},
		{"--token beats it", map[string]string{"SALT_VOLUMES_URL": a.URL, "SALT_VOLUMES_TOKEN": "from-env"}, []string{"--token", "from-flag"}, a, "Bearer from-flag"},
		{"--token-file beats SALT_VOLUMES_TOKEN", map[string]string{"SALT_VOLUMES_URL": a.URL, "SALT_VOLUMES_TOKEN": "from-env"}, []string{"--token-file", file}, a, "Bearer from-file"},
		{"--token beats SALT_VOLUMES_TOKEN_FILE", map[string]string{"SALT_VOLUMES_URL": a.URL, "SALT_VOLUMES_TOKEN_FILE": envFile}, []string{"--token", "from-flag"}, a, "Bearer from-flag"},
		{"SALT_VOLUMES_TOKEN_FILE", map[string]string{"SALT_VOLUMES_URL": a.URL, "SALT_VOLUMES_TOKEN_FILE": envFile}, nil, a, "Bearer from-env-file"},
		{"SALT_VOLUMES_TOKEN beats SALT_VOLUMES_TOKEN_FILE", map[string]string{"SALT_VOLUMES_URL": a.URL, "SALT_VOLUMES_TOKEN": "from-env", "SALT_VOLUMES_TOKEN_FILE": envFile}, nil, a, "Bearer from-env"},
		{"--url beats SALT_VOLUMES_URL", map[string]string{"SALT_VOLUMES_URL": a.URL, "SALT_VOLUMES_TOKEN": "from-env"}, []string{"--url", b.URL}, b, "Bearer from-env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			before := map[*fakeAPI]int{a: len(a.requests()), b: len(b.requests())}
			_, errs, code := sv(t, append([]string{"ls"}, tc.args...)...)
			require.Equal(t, exitOK, code, errs)
			got := tc.server.requests()[before[tc.server]:]
			assert.Equal(t, []string{"GET /api/v1/volumes " + tc.auth}, got)
			for _, other := range []*fakeAPI{a, b} {
				if other != tc.server {
					assert.Len(t, other.requests(), before[other], "the other server was asked")
				}
			}
		})
	}
	t.Run("the help shows no value of the environment", func(t *testing.T) {
		t.Setenv("SALT_VOLUMES_URL", "https://secret.example:8443")
		t.Setenv("USER", "somebody-in-particular")
		for _, args := range [][]string{{"ls", "--help"}, {"login", "--help"}, {"--help"}} {
			out, _, code := sv(t, args...)
			require.Equal(t, exitOK, code)
			assert.NotContains(t, out, "secret.example")
			assert.NotContains(t, out, "somebody-in-particular")
		}
	})
}

// saveTestSession writes a session made with url (and token "session").
func saveTestSession(t *testing.T, url string) string {
	t.Helper()
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	p, err := saveSession(savedSession{URL: url, Token: "session", User: "alice", Expire: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	return p
}

// A session's token goes to the server it was made with, never another:
// a command without a token uses it for that server only, and logout
// ends it there, whatever --url or SALT_VOLUMES_URL say now; another
// server's 401 is never taken for a logout.
func TestSessionGoesToItsServerOnly(t *testing.T) {
	routes := func(logout http.HandlerFunc) map[string]http.HandlerFunc {
		return map[string]http.HandlerFunc{
			"GET /api/v1/volumes": reply(200, map[string]any{"items": []any{}}),
			"POST /api/v1/logout": logout,
			"POST /api/v1/login": reply(200, client.Session{Token: "session", User: "alice", Role: access.Operator,
				Expire: time.Now().Add(time.Hour), Scopes: []string{"node-1"}}),
		}
	}
	ok := reply(200, map[string]any{})
	refused := replyErr(401, "unauthorized", "no such session", "")
	t.Run("login keeps the session, with its server", func(t *testing.T) {
		t.Setenv("XDG_CONFIG_HOME", t.TempDir())
		a := newFakeAPI(t, routes(ok))
		out, errs, code := svIn(t, "pw\n", "login", "--url", a.URL+"/", "--user", "alice", "--eauth", "file")
		require.Equal(t, exitOK, code, errs)
		assert.Contains(t, out, "logged in as alice (role operator)")
		s := loadSession()
		require.NotNil(t, s)
		assert.Equal(t, a.URL, s.URL)
		assert.Equal(t, []string{"POST /api/v1/login"}, a.requests(), "no token sent to log in")
	})
	t.Run("used for its server", func(t *testing.T) {
		a := newFakeAPI(t, routes(ok))
		saveTestSession(t, a.URL)
		_, errs, code := sv(t, "ls")
		require.Equal(t, exitOK, code, errs)
		_, errs, code = sv(t, "ls", "--url", a.URL+"/")
		require.Equal(t, exitOK, code, errs)
		assert.Equal(t, []string{"GET /api/v1/volumes Bearer session", "GET /api/v1/volumes Bearer session"}, a.requests())
	})
	t.Run("not for another", func(t *testing.T) {
		a, b := newFakeAPI(t, routes(ok)), newFakeAPI(t, routes(ok))
		saveTestSession(t, a.URL)
		t.Setenv("SALT_VOLUMES_URL", b.URL)
		_, errs, code := sv(t, "ls")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errs, "no token")
		assert.Empty(t, a.requests())
		assert.Empty(t, b.requests())
	})
	for _, tc := range []struct {
		name             string
		logout           http.HandlerFunc
		gone             bool // the session's server does not answer
		code             int
		kept             bool
		out, errs, other string
	}{
		{"logout, with another server in the environment", ok, false, exitOK, false, "logged out alice", "the session is with", ""},
		{"logout of a session its server knows no more", refused, false, exitOK, false, "logged out alice", "", ""},
		{"logout while its server does not answer", ok, true, exitRetry, true, "", "salt-volumes API at", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAPI(t, routes(tc.logout))
			// The other server refuses every token: were it asked, its
			// 401 must not end the session.
			b := newFakeAPI(t, routes(refused))
			p := saveTestSession(t, a.URL)
			if tc.gone {
				a.Close()
			}
			t.Setenv("SALT_VOLUMES_URL", b.URL)
			out, errs, code := sv(t, "logout")
			assert.Equal(t, tc.code, code, errs)
			assert.Contains(t, out, tc.out)
			assert.Contains(t, errs, tc.errs)
			assert.Empty(t, b.requests(), "the session's token went to another server")
			if !tc.gone {
				assert.Equal(t, []string{"POST /api/v1/logout Bearer session"}, a.requests())
			}
			_, err := os.Stat(p)
			assert.Equal(t, tc.kept, err == nil, "session file kept: %v", err)
		})
	}
}

// What -o name prints is taken back as arguments; another kind's name is
// refused before anything is asked.
func TestNamesAreTakenBack(t *testing.T) {
	snap := saltvolumes.Snapshot{Name: "s1", Volume: "a", Node: "node-1", Phase: "Ready"}
	a := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/volumes":      reply(200, map[string]any{"items": []saltvolumes.View{vol("a", saltvolumes.Available, ""), vol("b", saltvolumes.Failed, "")}}),
		"GET /api/v1/volumes/a":    reply(200, vol("a", saltvolumes.Available, "")),
		"DELETE /api/v1/volumes/b": reply(202, vol("b", saltvolumes.Terminating, "")),
		"GET /api/v1/snapshots":    reply(200, map[string]any{"items": []saltvolumes.Snapshot{snap}}),
		"GET /api/v1/snapshots/s1": reply(200, snap),
	})
	out, errs, code := sv(t, at(a, "ls", "-o", "name")...)
	require.Equal(t, exitOK, code, errs)
	assert.Equal(t, "volume/a\nvolume/b\n", out)
	out, errs, code = sv(t, at(a, "snapshot", "ls", "-o", "name")...)
	require.Equal(t, exitOK, code, errs)
	assert.Equal(t, "snapshot/s1\n", out)
	for _, tc := range []struct {
		args []string
		code int
		req  string
	}{
		{[]string{"get", "volume/a"}, exitOK, "GET /api/v1/volumes/a"},
		{[]string{"rm", "volume/b", "-o", "name"}, exitOK, "DELETE /api/v1/volumes/b"},
		{[]string{"snapshot", "get", "snapshot/s1"}, exitOK, "GET /api/v1/snapshots/s1"},
		{[]string{"snapshot", "ls", "volume/a"}, exitOK, "GET /api/v1/snapshots?volume=a"},
		{[]string{"get", "snapshot/s1"}, exitUsage, ""},
		{[]string{"snapshot", "get", "volume/a"}, exitUsage, ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			before := len(a.requests())
			out, errs, code := sv(t, at(a, tc.args...)...)
			require.Equal(t, tc.code, code, errs)
			got := a.requests()[before:]
			if tc.req == "" {
				assert.Empty(t, got)
				assert.Contains(t, errs, "is not a")
				return
			}
			require.Len(t, got, 1)
			assert.Equal(t, tc.req+" Bearer t", got[0])
			if tc.args[0] == "rm" {
				assert.Equal(t, "volume/b\n", out, "rm -o name names what it deleted")
			}
		})
	}
}

// Every list prints {"items": [...]} in JSON and YAML, one item or
// many; one object prints as itself.
func TestListsPrintItems(t *testing.T) {
	now := time.Now()
	a := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/volumes":            reply(200, map[string]any{"items": []saltvolumes.View{vol("a", saltvolumes.Available, "")}}),
		"GET /api/v1/volumes/a":          reply(200, vol("a", saltvolumes.Available, "")),
		"GET /api/v1/nodes":              reply(200, map[string]any{"items": []saltvolumes.Node{{Name: "node-1", Up: true}, {Name: "node-2"}}}),
		"GET /api/v1/snapshots":          reply(200, map[string]any{"items": []saltvolumes.Snapshot{{Name: "s1", Volume: "a", Phase: "Ready"}}}),
		"GET /api/v1/snapshots/s1":       reply(200, saltvolumes.Snapshot{Name: "s1", Volume: "a", Phase: "Ready"}),
		"GET /api/v1/snapshot-schedules": reply(200, map[string]any{"items": []saltvolumes.SnapshotSchedule{{Source: "api", Schedule: "a", Volume: "a", Every: "1h", Keep: 2}}}),
		"GET /api/v1/tokens":             reply(200, map[string]any{"items": []access.TokenView{{Name: "ci", Kind: "service", Role: access.Operator, Created: now}}}),
		"GET /api/v1/audit":              reply(200, map[string]any{"items": []access.Entry{{Time: now, User: "alice", Method: "POST", Route: "/api/v1/volumes", Decision: "allowed"}, {Time: now, User: "bob", Decision: "refused"}}}),
	})
	for _, tc := range []struct {
		args []string
		n    int
	}{
		{[]string{"ls"}, 1},
		{[]string{"nodes"}, 2},
		{[]string{"snapshot", "ls"}, 1},
		{[]string{"snapshot", "schedules", "a"}, 1},
		{[]string{"token", "list"}, 1},
		{[]string{"audit"}, 2},
	} {
		for _, format := range []string{"json", "yaml"} {
			t.Run(strings.Join(tc.args, " ")+" -o "+format, func(t *testing.T) {
				out, errs, code := sv(t, at(a, append(tc.args, "-o", format)...)...)
				require.Equal(t, exitOK, code, errs)
				var doc struct {
					Items []map[string]any `json:"items"`
				}
				if format == "yaml" {
					require.NoError(t, yaml.UnmarshalStrict([]byte(out), &doc), out)
				} else {
					dec := json.NewDecoder(strings.NewReader(out))
					dec.DisallowUnknownFields()
					require.NoError(t, dec.Decode(&doc), out)
				}
				assert.Len(t, doc.Items, tc.n, out)
			})
		}
	}
	for _, args := range [][]string{{"get", "a"}, {"snapshot", "get", "s1"}} {
		t.Run(strings.Join(args, " ")+": one object", func(t *testing.T) {
			out, errs, code := sv(t, at(a, append(args, "-o", "json")...)...)
			require.Equal(t, exitOK, code, errs)
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(out), &m), out)
			assert.NotContains(t, m, "items")
		})
	}
}

// ls filters by node on the server, by phase and labels here.
func TestLsFilters(t *testing.T) {
	db, web := vol("db", saltvolumes.Available, ""), vol("web", saltvolumes.Failed, "")
	a := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/volumes": func(w http.ResponseWriter, r *http.Request) {
		d, w2 := db, web
		d.Spec.Template = labelled(map[string]string{"tier": "db"})
		w2.Spec.Template = labelled(map[string]string{"tier": "web"})
		reply(200, map[string]any{"items": []saltvolumes.View{d, w2}})(w, r)
	}})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "volume/db\nvolume/web\n"},
		{[]string{"--phase", "failed"}, "volume/web\n"},
		{[]string{"--phase", "Available,Failed"}, "volume/db\nvolume/web\n"},
		{[]string{"-l", "tier=db"}, "volume/db\n"},
		{[]string{"--selector", "tier!=db"}, "volume/web\n"},
		{[]string{"--node", "node/node-9"}, "volume/db\nvolume/web\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errs, code := sv(t, at(a, append([]string{"ls", "-o", "name"}, tc.args...)...)...)
			require.Equal(t, exitOK, code, errs)
			assert.Equal(t, tc.want, out)
		})
	}
	assert.Contains(t, a.requests(), "GET /api/v1/volumes?node=node-9 Bearer t", "--node is the server's filter")
	_, errs, code := sv(t, at(a, "ls", "--phase", "Gone")...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "--phase Gone: use Unknown, Pending, Available, Failed, Terminating, Locked")
	_, _, code = sv(t, at(a, "ls", "-l", "tier in (")...)
	assert.Equal(t, exitUsage, code)
}

// --wait prints each step on stderr; stdout is the volume, in the -o
// format, as it ended. Its default timeout is the server's jobTimeout and
// a minute; a timeout says how to keep following.
func TestWaitPrintsStepsOnStderr(t *testing.T) {
	a := newFakeAPI(t, map[string]http.HandlerFunc{
		"POST /api/v1/volumes": reply(201, vol("v", saltvolumes.Unknown, "")),
		"GET /api/v1/info":     reply(200, client.Info{Version: "v0.4.0", JobTimeout: "2m0s", JobTimeoutSeconds: 120}),
		"GET /api/v1/watch": stream(true, ev("ADDED", vol("v", saltvolumes.Pending, "create")), synced,
			ev("MODIFIED", vol("v", saltvolumes.Pending, "create")), ev("MODIFIED", vol("v", saltvolumes.Pending, "mkfs")),
			ev("MODIFIED", vol("v", saltvolumes.Available, ""))),
	})
	out, errs, code := sv(t, at(a, "create", "v", "--node", "node-1", "--size", "1Gi", "--wait", "-o", "json")...)
	require.Equal(t, exitOK, code, errs)
	var v saltvolumes.View
	require.NoError(t, json.Unmarshal([]byte(out), &v), "stdout is the volume alone: %s", out)
	assert.Equal(t, saltvolumes.Available, v.Status.Phase)
	assert.Equal(t, "volume v: Pending, step create\nvolume v: Pending, step mkfs\nvolume v: Available\n", errs, "each step once")
	assert.Contains(t, a.requests(), "GET /api/v1/info Bearer t")

	t.Run("a long step's bytes: a line each, a bar on a terminal", func(t *testing.T) {
		copying := func(done int64) saltvolumes.View {
			v := vol("v", saltvolumes.Pending, "copying")
			v.Status.Progress = &saltvolumes.Progress{Done: done, Total: 4 << 30}
			return v
		}
		long := newFakeAPI(t, map[string]http.HandlerFunc{
			"GET /api/v1/watch": stream(true, ev("ADDED", vol("v", saltvolumes.Pending, "create")), synced,
				ev("MODIFIED", copying(0)), ev("MODIFIED", copying(1<<30)), ev("MODIFIED", copying(1<<30)), ev("MODIFIED", copying(4<<30)),
				ev("MODIFIED", vol("v", saltvolumes.Pending, "formatted")), ev("MODIFIED", vol("v", saltvolumes.Available, ""))),
		})
		_, errs, code := sv(t, at(long, "wait", "v", "--timeout", "10s")...)
		require.Equal(t, exitOK, code, errs)
		assert.Equal(t, "volume v: Pending, step create\n"+
			"volume v: Pending, step copying 0B of 4.0GiB (0 %)\n"+
			"volume v: Pending, step copying 1.0GiB of 4.0GiB (25 %)\n"+
			"volume v: Pending, step copying 4.0GiB of 4.0GiB (100 %)\n"+
			"volume v: Pending, step formatted\nvolume v: Available\n", errs, "plain lines, each report once")

		var tty ttyBuffer
		code = runIO(at(long, "wait", "v", "--timeout", "10s"), strings.NewReader(""), io.Discard, &tty)
		require.Equal(t, exitOK, code, tty.String())
		assert.Equal(t, "volume v: Pending, step create\n"+
			"\r\033[Kvolume v: copying [..............................]   0 %  0B of 4.0GiB"+
			"\r\033[Kvolume v: copying [#######.......................]  25 %  1.0GiB of 4.0GiB"+
			"\r\033[Kvolume v: copying [##############################] 100 %  4.0GiB of 4.0GiB\n"+
			"volume v: Pending, step formatted\nvolume v: Available\n", tty.String(), "one bar drawn in place, then lines again")
	})

	t.Run("the default timeout", func(t *testing.T) {
		noInfo := newFakeAPI(t, nil)
		for _, tc := range []struct {
			name   string
			server *fakeAPI
			args   []string
			want   time.Duration
		}{
			{"the server's jobTimeout and a minute", a, nil, 3 * time.Minute},
			{"a server without /api/v1/info", noInfo, nil, 11 * time.Minute},
			{"--timeout", a, []string{"--timeout", "90s"}, 90 * time.Second},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := &cli{}
				cmd := c.waitCmd()
				require.NoError(t, cmd.ParseFlags(tc.args))
				cmd.SetContext(t.Context())
				given, err := cmd.Flags().GetDuration("timeout")
				require.NoError(t, err)
				d, err := c.waitTimeout(cmd, &client.Client{URL: tc.server.URL, Token: "t"}, given)
				require.NoError(t, err)
				assert.Equal(t, tc.want, d)
			})
		}
	})
	t.Run("timed out", func(t *testing.T) {
		slow := newFakeAPI(t, map[string]http.HandlerFunc{
			"GET /api/v1/watch": stream(true, ev("ADDED", vol("v", saltvolumes.Pending, "mkfs")), synced),
		})
		_, errs, code := sv(t, at(slow, "wait", "v", "--timeout", "300ms")...)
		assert.Equal(t, exitTimeout, code, errs)
		assert.Contains(t, errs, "volume v: not Available after 300ms; last seen Pending, step mkfs; keep following with: salt-volumes wait v --for Available")
	})
	t.Run("failed", func(t *testing.T) {
		bad := vol("v", saltvolumes.Failed, "")
		bad.Status.Reason, bad.Status.Message = "PrepareFailed", "no space left on node-1"
		failing := newFakeAPI(t, map[string]http.HandlerFunc{
			"GET /api/v1/watch": stream(true, ev("ADDED", vol("v", saltvolumes.Pending, "create")), synced, ev("MODIFIED", bad)),
		})
		out, errs, code := sv(t, at(failing, "wait", "v", "--timeout", "10s")...)
		assert.Equal(t, exitFailed, code, errs)
		assert.Contains(t, out, "no space left on node-1", "the volume as it ended, on stdout")
		assert.Contains(t, errs, "volume v: Failed, PrepareFailed: no space left on node-1\n")
	})
}

func labelled(l map[string]string) *spec.Template {
	return &spec.Template{Metadata: spec.TemplateMetadata{Labels: l}}
}

// Tables: --no-headers drops the heading line; the server's text is
// cleaned of control characters.
func TestTables(t *testing.T) {
	v := vol("v", saltvolumes.Failed, "")
	v.Status.Message = "bad\x1b[31m red\x1b[0m\rfake line\nsecond\u202e"
	a := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/volumes": reply(200, map[string]any{"items": []saltvolumes.View{v}})})
	out, errs, code := sv(t, at(a, "ls")...)
	require.Equal(t, exitOK, code, errs)
	assert.True(t, strings.HasPrefix(out, "NAME "), out)
	assert.Contains(t, out, "bad[31m red[0mfake line second\n")
	assert.NotContains(t, out, "\x1b")
	assert.NotContains(t, out, "\u202e")
	out, _, _ = sv(t, at(a, "ls", "--no-headers")...)
	assert.True(t, strings.HasPrefix(out, "v "), out)
	out, _, _ = sv(t, at(a, "ls", "-o", "wide")...)
	assert.Contains(t, out, "UUID")
	assert.Contains(t, out, v.Spec.UUID)
}

// Completion offers the server's names, for the arguments a command
// takes and no more, and the values of flags.
func TestCompletion(t *testing.T) {
	a := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/volumes":   reply(200, map[string]any{"items": []saltvolumes.View{vol("data-1", saltvolumes.Available, ""), vol("logs-1", saltvolumes.Available, "")}}),
		"GET /api/v1/snapshots": reply(200, map[string]any{"items": []saltvolumes.Snapshot{{Name: "nightly"}}}),
		"GET /api/v1/nodes":     reply(200, map[string]any{"items": []saltvolumes.Node{{Name: "node-1"}}}),
	})
	t.Setenv("SALT_VOLUMES_URL", a.URL)
	t.Setenv("SALT_VOLUMES_TOKEN", "t")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"get", ""}, []string{"data-1", "logs-1"}},
		{[]string{"get", "d"}, []string{"data-1"}},
		{[]string{"get", "volume/"}, []string{"volume/data-1", "volume/logs-1"}},
		{[]string{"get", "data-1", ""}, nil},
		{[]string{"snapshot", "create", ""}, []string{"data-1", "logs-1"}},
		{[]string{"snapshot", "create", "data-1", ""}, nil},
		{[]string{"snapshot", "restore", ""}, []string{"nightly"}},
		{[]string{"node", "forget", ""}, []string{"node-1"}},
		{[]string{"create", "x", "--node", ""}, []string{"node-1"}},
		{[]string{"create", "x", "--from", ""}, []string{"snapshot/nightly", "volume/data-1", "volume/logs-1"}},
		{[]string{"create", "x", "--fs", ""}, []string{"ext4", "xfs"}},
		{[]string{"ls", "--phase", ""}, phases},
		{[]string{"ls", "-o", ""}, allFormats},
		{[]string{"wait", "x", "--for", ""}, []string{"Available", "Deleted"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			before := len(a.requests())
			out, errs, code := sv(t, append([]string{"__completeNoDesc"}, tc.args...)...)
			require.Equal(t, exitOK, code, errs)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			got := lines[:len(lines)-1] // the last line is the directive
			if len(tc.want) == 0 {
				assert.Empty(t, got)
				assert.Len(t, a.requests(), before, "the server was asked for an argument the command does not take")
				return
			}
			assert.Equal(t, tc.want, got)
		})
	}
	t.Run("a slow server costs 2 seconds at most", func(t *testing.T) {
		slow := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/volumes": func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}})
		t.Setenv("SALT_VOLUMES_URL", slow.URL)
		start := time.Now()
		out, _, code := sv(t, "__completeNoDesc", "get", "")
		require.Equal(t, exitOK, code)
		assert.Less(t, time.Since(start), 5*time.Second)
		assert.True(t, strings.HasPrefix(out, ":"), "nothing offered: %q", out)
	})
}

// snapshot create --wait and snapshot restore --wait show their job's
// copy as volume --wait does: a line per report, a bar on a terminal.
func TestSnapshotWaitShowsTheCopy(t *testing.T) {
	polls := func(seq ...saltvolumes.Snapshot) http.HandlerFunc {
		var mu sync.Mutex
		i := 0
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			s := seq[min(i, len(seq)-1)]
			i++
			mu.Unlock()
			reply(200, s)(w, r)
		}
	}
	pending := func(p *saltvolumes.Progress) saltvolumes.Snapshot {
		return saltvolumes.Snapshot{Name: "s", Volume: "v", Node: "node-1", Phase: "Pending", Progress: p}
	}
	ready := saltvolumes.Snapshot{Name: "s", Volume: "v", Node: "node-1", Phase: "Ready"}
	taking := func() map[string]http.HandlerFunc {
		return map[string]http.HandlerFunc{
			"POST /api/v1/volumes/v/snapshots": reply(201, pending(nil)),
			"GET /api/v1/info":                 reply(200, client.Info{Version: "v0.4.0", JobTimeout: "2m0s", JobTimeoutSeconds: 120}),
			"GET /api/v1/snapshots/s": polls(pending(nil), pending(&saltvolumes.Progress{Step: "copying", Done: 1 << 30, Total: 4 << 30}),
				pending(&saltvolumes.Progress{Step: "copying", Done: 4 << 30, Total: 4 << 30}), ready),
		}
	}
	_, errs, code := sv(t, at(newFakeAPI(t, taking()), "snapshot", "create", "v", "s", "--wait")...)
	require.Equal(t, exitOK, code, errs)
	assert.Equal(t, "snapshot s: Pending\n"+
		"snapshot s: Pending, copying 1.0GiB of 4.0GiB (25 %)\n"+
		"snapshot s: Pending, copying 4.0GiB of 4.0GiB (100 %)\n"+
		"snapshot s: Ready\n", errs)

	var tty ttyBuffer
	code = runIO(at(newFakeAPI(t, taking()), "snapshot", "create", "v", "s", "--wait"), strings.NewReader(""), io.Discard, &tty)
	require.Equal(t, exitOK, code, tty.String())
	assert.Equal(t, "snapshot s: Pending\n"+
		"\r\033[Ksnapshot s: copying [#######.......................]  25 %  1.0GiB of 4.0GiB"+
		"\r\033[Ksnapshot s: copying [##############################] 100 %  4.0GiB of 4.0GiB\n"+
		"snapshot s: Ready\n", tty.String())

	restoring := func(phase string, p *saltvolumes.Progress) saltvolumes.Snapshot {
		s := ready
		s.Restore = &saltvolumes.SnapshotRestore{Phase: phase, Progress: p}
		return s
	}
	rs := newFakeAPI(t, map[string]http.HandlerFunc{
		"POST /api/v1/snapshots/s/restore": reply(202, restoring("Restoring", nil)),
		"GET /api/v1/info":                 reply(200, client.Info{Version: "v0.4.0", JobTimeout: "2m0s", JobTimeoutSeconds: 120}),
		"GET /api/v1/snapshots/s": polls(restoring("Restoring", &saltvolumes.Progress{Step: "copying", Done: 1 << 20, Total: 2 << 20}),
			restoring("Restored", nil)),
	})
	_, errs, code = sv(t, at(rs, "snapshot", "restore", "s", "--wait")...)
	require.Equal(t, exitOK, code, errs)
	assert.Equal(t, "snapshot s: restore Restoring, copying 1.0MiB of 2.0MiB (50 %)\nsnapshot s: restore Restored\n"+
		"volume v restored from snapshot s on node-1\n", errs)
	out, _, code := sv(t, at(newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/snapshots": reply(200, map[string]any{"items": []saltvolumes.Snapshot{
		pending(&saltvolumes.Progress{Step: "copying", Done: 1 << 30, Total: 4 << 30})}})}), "snapshot", "ls")...)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "Pending (copying 25 %)", "ls shows how far the copy is")
}

// A progress the server should never pass (past int64 arithmetic, done
// past total, negative) still draws a bar between 0 and 100 %, and a line
// too wide for the terminal is cut to it.
func TestProgressBarBounds(t *testing.T) {
	for _, p := range []saltvolumes.Progress{
		{Done: 1 << 61, Total: 1 << 61}, {Done: 1 << 62, Total: 1}, {Done: -5, Total: 10}, {Done: 5, Total: 0},
	} {
		pct := percent(p)
		assert.True(t, pct >= 0 && pct <= 100, "%+v: %d", p, pct)
		assert.NotPanics(t, func() { _ = progressBar("volume v", "copying", p) }, "%+v", p)
	}
	assert.Equal(t, int64(100), percent(saltvolumes.Progress{Done: 1 << 61, Total: 1 << 61}))
	long := progressBar("volume "+strings.Repeat("n", 53), "copying", saltvolumes.Progress{Done: 1, Total: 2})
	assert.Equal(t, 79, len([]rune(fitLine(long, 80))))
	assert.Equal(t, "short", fitLine("short", 80))
}

// ttyBuffer is a stderr that says it is a terminal.
type ttyBuffer struct{ bytes.Buffer }

func (*ttyBuffer) IsTerminal() bool { return true }
