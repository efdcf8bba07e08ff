package saltapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const secret = "s3cr3t-password"

// fakeAPI mimics rest_cherrypy's login and POST / shapes; script decides
// each POST / answer.
func fakeAPI(t *testing.T, script func(n int64, w http.ResponseWriter, token string)) (*httptest.Server, *atomic.Int64) {
	var posts atomic.Int64
	var tokens atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/login":
			var body map[string]string
			_ = json.NewDecoder(r.Body).Decode(&body)
			if body["password"] != secret || body["eauth"] != "file" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			tok := "tok-" + string(rune('a'+tokens.Add(1)))
			_ = json.NewEncoder(w).Encode(map[string]any{"return": []map[string]any{{"token": tok, "expire": float64(time.Now().Add(time.Hour).Unix())}}})
		case "/":
			script(posts.Add(1), w, r.Header.Get("X-Auth-Token"))
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &posts
}

func client(t *testing.T, url string, logs *bytes.Buffer) *Client {
	c, err := New(Config{URL: url, Username: "svc", Password: secret, Timeout: 500 * time.Millisecond, RetryMax: 2,
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	return c
}

func ok(w http.ResponseWriter, v any) {
	_ = json.NewEncoder(w).Encode(map[string]any{"return": []any{v}})
}

func TestTokenReuseAndOneReloginOn401(t *testing.T) {
	srv, posts := fakeAPI(t, func(n int64, w http.ResponseWriter, _ string) {
		if n == 3 { // salt-api "restarted": the session is gone
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		ok(w, map[string]any{"jid": "1", "minions": []string{"node-1"}})
	})
	var logs bytes.Buffer
	c := client(t, srv.URL, &logs)
	for i := 0; i < 2; i++ {
		job, err := c.LocalAsync(context.Background(), "node-1", "state.apply", []any{"salt_volumes.prepared"}, nil)
		require.NoError(t, err)
		assert.Equal(t, "1", job.JID)
	}
	assert.Equal(t, 1, c.Logins, "the token is reused")
	_, err := c.LocalAsync(context.Background(), "node-1", "state.apply", nil, nil)
	require.NoError(t, err, "a 401 is answered by one re-login and a retry")
	assert.Equal(t, 2, c.Logins)
	assert.Equal(t, int64(4), posts.Load())
	assert.NotContains(t, logs.String(), secret)
	assert.NotContains(t, logs.String(), "tok-")
}

func TestPersistent401StopsAfterOneRelogin(t *testing.T) {
	srv, posts := fakeAPI(t, func(n int64, w http.ResponseWriter, _ string) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"status": 401, "return": "Please log in"}`))
	})
	c := client(t, srv.URL, &bytes.Buffer{})
	_, err := c.LocalAsync(context.Background(), "*", "cmd.run", []any{"id"}, nil)
	var apiErr *Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusUnauthorized, apiErr.Status)
	assert.Contains(t, err.Error(), "eauth ACL")
	assert.Equal(t, 2, c.Logins, "exactly one re-login")
	assert.Equal(t, int64(2), posts.Load())
}

func TestBadCredentials(t *testing.T) {
	srv, _ := fakeAPI(t, func(int64, http.ResponseWriter, string) {})
	c, err := New(Config{URL: srv.URL, Username: "svc", Password: "wrong"})
	require.NoError(t, err)
	err = c.Login(context.Background())
	var apiErr *Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 401, apiErr.Status)
	assert.NotContains(t, err.Error(), "wrong")
}

func TestRetriesOn5xxThenGivesUp(t *testing.T) {
	srv, posts := fakeAPI(t, func(n int64, w http.ResponseWriter, _ string) {
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		ok(w, map[string]any{"jid": "7"})
	})
	c := client(t, srv.URL, &bytes.Buffer{})
	job, err := c.LocalAsync(context.Background(), "n", "test.ping", nil, nil)
	require.NoError(t, err)
	assert.Equal(t, "7", job.JID)
	assert.Equal(t, int64(2), posts.Load())

	srv2, posts2 := fakeAPI(t, func(n int64, w http.ResponseWriter, _ string) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("master down"))
	})
	c2 := client(t, srv2.URL, &bytes.Buffer{})
	_, err = c2.LocalAsync(context.Background(), "n", "test.ping", nil, nil)
	var apiErr *Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 503, apiErr.Status)
	assert.Contains(t, err.Error(), "salt-master running")
	assert.Equal(t, int64(3), posts2.Load(), "RetryMax 2 = 3 attempts, bounded")
}

func TestTimeoutAndCancel(t *testing.T) {
	srv, _ := fakeAPI(t, func(n int64, w http.ResponseWriter, _ string) {
		time.Sleep(2 * time.Second)
	})
	c := client(t, srv.URL, &bytes.Buffer{})
	ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.LocalAsync(ctx, "n", "test.ping", nil, nil)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 1900*time.Millisecond, "the context bounds the whole call")
}

func TestOddShapes(t *testing.T) {
	srv, _ := fakeAPI(t, func(n int64, w http.ResponseWriter, _ string) {
		switch n {
		case 1:
			ok(w, map[string]any{}) // nothing matched the target
		case 2:
			_, _ = w.Write([]byte(`{"return": []}`))
		default:
			_, _ = w.Write([]byte(`<html>proxy error</html>`))
		}
	})
	c := client(t, srv.URL, &bytes.Buffer{})
	_, err := c.LocalAsync(context.Background(), "ghost", "test.ping", nil, nil)
	assert.True(t, errors.Is(err, ErrNoMinions))
	_, err = c.LocalAsync(context.Background(), "n", "test.ping", nil, nil)
	assert.ErrorContains(t, err, "empty answer")
	_, err = c.LocalAsync(context.Background(), "n", "test.ping", nil, nil)
	assert.ErrorContains(t, err, "unexpected answer")
}

func TestParseLookupShapes(t *testing.T) {
	m, found, err := ParseLookup(json.RawMessage(`{"node-1": true}`))
	require.NoError(t, err)
	assert.True(t, found)
	assert.JSONEq(t, `true`, string(m["node-1"]))

	m, found, err = ParseLookup(json.RawMessage(`{"outputter": "highstate", "data": {"node-1": {"s": {"result": true}}}}`))
	require.NoError(t, err)
	assert.True(t, found)
	assert.JSONEq(t, `{"s": {"result": true}}`, string(m["node-1"]))

	_, found, err = ParseLookup(json.RawMessage(`{}`))
	require.NoError(t, err)
	assert.False(t, found, "an unknown or expired job")

	// A minion literally named "data" is not mistaken for the wrapped shape.
	m, found, _ = ParseLookup(json.RawMessage(`{"data": 1}`))
	assert.True(t, found)
	assert.Contains(t, m, "data")

	_, _, err = ParseLookup(json.RawMessage(`[1]`))
	assert.Error(t, err)
}

func TestCAFileErrors(t *testing.T) {
	_, err := New(Config{URL: "https://x", CAFile: "/nonexistent"})
	assert.ErrorContains(t, err, "reading salt-api CA")
	_, err = New(Config{})
	assert.Error(t, err)
}
