package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	yaml "go.yaml.in/yaml/v3"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/client"
)

// hostile is what a hostile server (or minion) might put in any text: a
// terminal title and a bell (OSC), a screen clear, text reordered, a C1
// CSI, a line of its own.
const hostile = "evil\x1b]0;pwned\x07\x1b[2J\u202etxt.exe\u202c\u009b31m\nFAKE-LINE"

// assertNoControl: nothing of hostile's reaches a terminal raw.
func assertNoControl(t *testing.T, what, s string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\x07", "\u202e", "\u202c", "\u009b", "\nFAKE-LINE", "\r"} {
		assert.NotContains(t, s, bad, "%s holds %q: %q", what, bad, s)
	}
}

// -o name prints only names the API could have made, for xargs: a name
// with a newline (two arguments), an escape sequence (a terminal's
// command) is left out, said quoted on stderr, exit 1.
func TestNamesOutOfTheirCharacterSetAreRefused(t *testing.T) {
	evil := vol(hostile, saltvolumes.Available, "")
	upper := vol("Data", saltvolumes.Available, "")
	a := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/volumes":   reply(200, map[string]any{"items": []saltvolumes.View{vol("good", saltvolumes.Available, ""), evil, upper}}),
		"GET /api/v1/snapshots": reply(200, map[string]any{"items": []saltvolumes.Snapshot{{Name: "nightly.1"}, {Name: "x\ny"}, {Name: ".hidden"}}}),
		"GET /api/v1/nodes":     reply(200, map[string]any{"items": []saltvolumes.Node{{Name: "Node_1.example"}, {Name: "-n"}}}),
		"GET /api/v1/tokens":    reply(200, map[string]any{"items": []access.TokenView{{Name: "session-0123456789ab"}, {Name: "ci\x1b[2J"}}}),
		"GET /api/v1/watch":     stream(false, ev("ADDED", vol("good", saltvolumes.Available, "")), ev("ADDED", evil), synced),
	})
	for _, tc := range []struct {
		args []string
		out  string
		bad  string
	}{
		{[]string{"ls"}, "volume/good\n", `"volume/evil\x1b]0;pwned\a\x1b[2J\u202etxt.exe\u202c\u009b31m\nFAKE-LINE", "volume/Data"`},
		{[]string{"snapshot", "ls"}, "snapshot/nightly.1\n", `"snapshot/x\ny", "snapshot/.hidden"`},
		{[]string{"nodes"}, "node/Node_1.example\n", `"node/-n"`},
		{[]string{"token", "list"}, "token/session-0123456789ab\n", `"token/ci\x1b[2J"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errs, code := sv(t, at(a, append(tc.args, "-o", "name")...)...)
			assert.Equal(t, exitFailed, code, errs)
			assert.Equal(t, tc.out, out)
			assert.Contains(t, errs, "name(s) the server answered that are not names of their kind: "+tc.bad)
			assertNoControl(t, "stderr", errs)
		})
	}
	t.Run("watch", func(t *testing.T) {
		out, errs, code := sv(t, at(a, "watch", "-o", "name")...)
		assert.Equal(t, exitRetry, code, errs)
		assert.Equal(t, "volume/good\n", out)
		assert.Contains(t, errs, "left out a volume name the server sent that is not a volume name")
		assertNoControl(t, "stderr", errs)
	})
}

// Every piece of the server's text printed for people is cleaned: the
// lines of logout, token create and revoke, snapshot unschedule, rm
// --wait and restore --wait; an error's lines but its first are
// indented, so that none passes for a message of ours.
func TestServerTextIsCleaned(t *testing.T) {
	snap := saltvolumes.Snapshot{Name: "s", Volume: hostile, Node: hostile, Phase: "Ready",
		Restore: &saltvolumes.SnapshotRestore{Phase: "Restored", Message: hostile, Warnings: []string{hostile}}}
	a := newFakeAPI(t, map[string]http.HandlerFunc{
		"POST /api/v1/tokens":                        reply(201, access.TokenView{Name: hostile, Role: access.Role(hostile), Token: "svt_abc"}),
		"DELETE /api/v1/tokens/ci":                   reply(200, access.TokenView{Name: hostile}),
		"DELETE /api/v1/volumes/v/snapshot-schedule": reply(200, saltvolumes.SnapshotSchedule{Volume: hostile, Source: "api"}),
		"GET /api/v1/snapshots/s":                    reply(200, snap),
		"POST /api/v1/snapshots/s/restore":           reply(200, snap),
		"GET /api/v1/info":                           reply(200, client.Info{JobTimeoutSeconds: 60}),
		"POST /api/v1/volumes":                       replyErr(409, "exists", "name: volume \"x\" already exists\nsalt-volumes: (but all your volumes were wiped)"+hostile, ""),
		"POST /api/v1/logout":                        reply(200, map[string]any{}),
	})
	for _, args := range [][]string{
		{"token", "create", "ci", "--role", "viewer"},
		{"token", "revoke", "ci"},
		{"snapshot", "unschedule", "v"},
		{"snapshot", "restore", "s", "--wait"},
		{"snapshot", "get", "s"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, errs, code := sv(t, at(a, args...)...)
			require.Equal(t, exitOK, code, errs)
			assertNoControl(t, "stdout", out)
			assertNoControl(t, "stderr", errs)
		})
	}
	t.Run("snapshot rm --wait", func(t *testing.T) {
		gone := newFakeAPI(t, map[string]http.HandlerFunc{
			"DELETE /api/v1/snapshots/s": reply(202, saltvolumes.Snapshot{Name: "s", Node: hostile, Phase: "Deleting"}),
			"GET /api/v1/snapshots/s":    replyErr(404, "not_found", "gone", ""),
		})
		out, errs, code := sv(t, at(gone, "snapshot", "rm", "s", "--wait", "--timeout", "5s")...)
		require.Equal(t, exitOK, code, errs)
		assertNoControl(t, "stdout", out)
		assertNoControl(t, "stderr", errs)
		assert.Contains(t, errs, "snapshot s deleted from evil]0;pwned[2Jtxt.exe31m FAKE-LINE")
	})
	t.Run("a secret no request can carry is not printed", func(t *testing.T) {
		b := newFakeAPI(t, map[string]http.HandlerFunc{"POST /api/v1/tokens": reply(201, access.TokenView{Name: "ci", Role: access.Viewer, Token: "svt_" + hostile})})
		out, errs, code := sv(t, at(b, "token", "create", "ci", "--role", "viewer")...)
		assert.Equal(t, exitFailed, code, errs)
		assert.Empty(t, out)
		assert.Contains(t, errs, "revoke the token: salt-volumes token revoke ci")
	})
	t.Run("an error's lines", func(t *testing.T) {
		_, errs, code := sv(t, at(a, "create", "x", "--node", "node-1", "--size", "1Gi")...)
		assert.Equal(t, exitRefused, code, errs)
		assertNoControl(t, "stderr", errs)
		lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
		assert.Len(t, lines, 3, errs)
		for i, l := range lines {
			assert.Equal(t, i == 0, strings.HasPrefix(l, "salt-volumes: "), "line %d: %q", i, l)
		}
	})
	t.Run("logout", func(t *testing.T) {
		t.Setenv("XDG_CONFIG_HOME", t.TempDir())
		_, err := saveSession(savedSession{URL: a.URL, Token: "session", User: hostile, Expire: time.Now().Add(time.Hour)})
		require.NoError(t, err)
		out, errs, code := sv(t, "logout")
		require.Equal(t, exitOK, code, errs)
		assert.Contains(t, out, "logged out evil")
		assertNoControl(t, "stdout", out)
	})
}

// JSON and YAML print what reorders text, DEL and the C1 controls as
// escapes, which read back as the same text.
func TestJSONAndYAMLEscapeInvisibleCharacters(t *testing.T) {
	v := vol("v", saltvolumes.Failed, "")
	v.Status.Message = "a\u202eb\u2066c\u2069 \x7f\u0085\u009b\uffff plain é ✓ 😀"
	v.Spec.Template = labelled(map[string]string{"k\u202e": "v\u202e"})
	a := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/volumes/v": reply(200, v),
		"GET /api/v1/volumes":   reply(200, map[string]any{"items": []saltvolumes.View{v}}),
		"GET /api/v1/watch":     stream(false, ev("ADDED", v), synced),
	})
	for _, args := range [][]string{{"get", "v", "-o", "json"}, {"get", "v", "-o", "yaml"}, {"ls", "-o", "yaml"}, {"watch", "-o", "json"}, {"watch", "-o", "yaml"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, errs, _ := sv(t, at(a, args...)...)
			assert.NotContains(t, out, "\u202e", errs)
			assert.NotContains(t, out, "\u2066")
			assert.NotContains(t, out, "\x7f")
			assert.NotContains(t, out, "\u009b")
			assert.Contains(t, out, "é ✓", "other characters stay as they are")
			var got saltvolumes.View
			switch {
			case args[0] == "watch" && args[2] == "json":
				var e saltvolumes.Event
				require.NoError(t, json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &e), out)
				got = e.Volume
			case args[0] == "watch":
				var e map[string]any
				require.NoError(t, yaml.Unmarshal([]byte(strings.TrimPrefix(out, "---\n")), &e), out)
				b, _ := json.Marshal(e["volume"])
				require.NoError(t, json.Unmarshal(b, &got))
			case args[0] == "ls":
				var l struct{ Items []map[string]any }
				require.NoError(t, yaml.Unmarshal([]byte(out), &l), out)
				require.Len(t, l.Items, 1)
				b, _ := json.Marshal(l.Items[0])
				require.NoError(t, json.Unmarshal(b, &got))
			case args[2] == "json":
				require.NoError(t, json.Unmarshal([]byte(out), &got), out)
			default:
				var m map[string]any
				require.NoError(t, yaml.Unmarshal([]byte(out), &m), out)
				b, _ := json.Marshal(m)
				require.NoError(t, json.Unmarshal(b, &got))
			}
			assert.Equal(t, v.Status.Message, got.Status.Message, "the text read back")
			assert.Equal(t, v.Spec.Template.Metadata.Labels, got.Spec.Template.Metadata.Labels)
		})
	}
}

// snapshot schedules -o name names the API's schedules alone, as
// unschedule takes them: schedule/VOLUME; a node's Salt schedule has no
// name it takes.
func TestScheduleNamesAreUnschedules(t *testing.T) {
	a := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/snapshot-schedules": reply(200, map[string]any{"items": []saltvolumes.SnapshotSchedule{
			{Source: "salt", Schedule: "salt_volumes_snap_v0", Volume: "v0", Node: "node-1"},
			{Source: "api", Schedule: "v0", Volume: "v0", Node: "node-1", Every: "1h", Keep: 3},
		}}),
	})
	out, errs, code := sv(t, at(a, "snapshot", "schedules", "-o", "name")...)
	require.Equal(t, exitOK, code, errs)
	assert.Equal(t, "schedule/v0\n", out)
}

// status: a 503 without a body says so; a password in --url is never
// printed.
func TestStatusAndURLsWithAPassword(t *testing.T) {
	a := newFakeAPI(t, map[string]http.HandlerFunc{"GET /readyz": func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) }})
	_, errs, code := sv(t, at(a, "status")...)
	assert.Equal(t, exitRetry, code)
	assert.Equal(t, "salt-volumes: not ready (HTTP 503)\n", errs)

	ok := newFakeAPI(t, map[string]http.HandlerFunc{"GET /readyz": func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok: leader")) }})
	withPassword := strings.Replace(ok.URL, "http://", "http://alice:hunter2@", 1)
	out, errs, code := sv(t, "status", "--url", withPassword, "--token", "t")
	require.Equal(t, exitOK, code, errs)
	assert.NotContains(t, out, "hunter2")
	assert.Contains(t, out, "alice:xxxxx@")
	ok.Close()
	_, errs, code = sv(t, "get", "v", "--url", withPassword, "--token", "t")
	assert.Equal(t, exitRetry, code, errs)
	assert.NotContains(t, errs, "hunter2")
}
