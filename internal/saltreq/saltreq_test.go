package saltreq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
)

// reply is what the master's request server sends: msgpack, decoded the
// way the client decodes it.
func reply(t testing.TB, v any) any {
	b, err := msgpack.Marshal(v)
	require.NoError(t, err)
	d, err := events.DecodeMsgpack(b)
	require.NoError(t, err)
	return d
}

func TestParsePublish(t *testing.T) {
	job, err := ParsePublish(reply(t, map[string]any{"enc": "clear", "load": map[string]any{"jid": "20261125101010123456", "minions": []string{"node-1"}, "missing": []string{}}}))
	require.NoError(t, err)
	assert.Equal(t, saltapi.Job{JID: "20261125101010123456", Minions: []string{"node-1"}}, job)

	_, err = ParsePublish(reply(t, map[string]any{"error": map[string]any{"name": "AuthorizationError", "message": "Authorization error occurred."}}))
	var me *Error
	require.ErrorAs(t, err, &me)
	assert.Equal(t, "AuthorizationError", me.Name)
	assert.Contains(t, err.Error(), "external_auth ACL")

	_, err = ParsePublish(reply(t, map[string]any{"enc": "clear", "load": map[string]any{"jid": nil, "minions": []string{}, "error": "Master could not resolve minions for target node-9"}}))
	assert.ErrorIs(t, err, saltapi.ErrNoMinions)

	for _, bad := range []any{"bad load", nil, []any{1}, map[string]any{"load": "x"}, map[string]any{"load": map[string]any{"minions": []any{1}}}} {
		_, err := ParsePublish(reply(t, bad))
		assert.Error(t, err, "%v", bad)
	}
}

func TestParseToken(t *testing.T) {
	exp := float64(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC).Unix()) + 0.5
	tok, err := ParseToken(reply(t, map[string]any{"token": "abc", "expire": exp, "start": exp - 43200, "name": "salt-volumes", "eauth": "file"}))
	require.NoError(t, err)
	assert.Equal(t, "abc", tok.Token)
	assert.Equal(t, time.Date(2026, 11, 25, 12, 0, 0, 5e8, time.UTC), tok.Expire.UTC())

	_, err = ParseToken(reply(t, ""))
	var me *Error
	require.ErrorAs(t, err, &me, "an empty answer is the master refusing the credentials")
	assert.Equal(t, "AuthenticationError", me.Name)

	for _, bad := range []any{map[string]any{"token": "abc"}, map[string]any{"expire": exp}, 3, "x"} {
		_, err := ParseToken(reply(t, bad))
		assert.Error(t, err, "%v", bad)
	}
}

func TestConfigErrorsNameTheSetting(t *testing.T) {
	for _, u := range []string{"127.0.0.1:4506", "tcp://127.0.0.1", "http://127.0.0.1:4506", "tcp://h:1/x"} {
		_, err := New(Config{URL: u, Username: "u", Password: "p", Eauth: "file"})
		require.Error(t, err, u)
		assert.Contains(t, err.Error(), "salt.master")
	}
	_, err := New(Config{Username: "u", Eauth: "file"})
	assert.ErrorContains(t, err, "salt.password")
}

// A reply never echoes a secret back into an error message: only the
// shape of what came.
func TestErrorsShowNoSecrets(t *testing.T) {
	_, err := ParsePublish(reply(t, map[string]any{"load": map[string]any{"token": "s3cret-token", "minions": []string{}}}))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cret-token")
	_, err = ParseToken(reply(t, map[string]any{"token": "s3cret-token", "expire": "soon"}))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cret-token")
}

// FuzzReply: whatever the request server (or something in its place)
// answers, decoding and reading it returns a value or an error, never a
// panic.
func FuzzReply(f *testing.F) {
	for _, v := range []any{
		map[string]any{"enc": "clear", "load": map[string]any{"jid": "20261125101010123456", "minions": []string{"node-1"}}},
		map[string]any{"error": map[string]any{"name": "AuthenticationError", "message": "x"}},
		map[string]any{"token": "abc", "expire": 1.5e9},
		"bad load", "",
	} {
		b, err := msgpack.Marshal(v)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := events.DecodeMsgpack(b)
		if err != nil {
			return
		}
		_, _ = ParsePublish(v)
		_, _ = ParseToken(v)
	})
}

// Arguments reach the master as salt-api would pass them: JSON's view of
// Go values (json tags, integers kept integral).
func TestArgumentsAsJSONSeesThem(t *testing.T) {
	type vol struct {
		Name string `json:"name"`
		Size int64  `json:"size"`
		Skip string `json:"skip,omitempty"`
	}
	got, err := plain([]any{"salt_volumes.prepared", map[string]any{"__kwarg__": true, "pillar": map[string]any{"v": vol{Name: "a", Size: 1 << 40}, "r": 0.5}}})
	require.NoError(t, err)
	assert.Equal(t, []any{"salt_volumes.prepared", map[string]any{"__kwarg__": true, "pillar": map[string]any{
		"v": map[string]any{"name": "a", "size": int64(1 << 40)}, "r": 0.5}}}, got)
	_, err = plain([]any{make(chan int)})
	assert.Error(t, err)
}
