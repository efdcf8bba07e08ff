package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// An error answer carries its Retry-After (seconds or a date; none is 0),
// which tells a limit waiting lifts from one it does not.
func TestErrorsCarryRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name, header string
		want         time.Duration
	}{
		{"none", "", 0},
		{"seconds", "5", 5 * time.Second},
		{"zero is still a retry", "0", time.Second},
		{"a date", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), time.Hour},
		{"garbage", "soon", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tc.header != "" {
					w.Header().Set("Retry-After", tc.header)
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error": {"code": "unavailable", "message": "no leader"}}`))
			}))
			defer srv.Close()
			_, err := (&Client{URL: srv.URL, Token: "t"}).Get(context.Background(), "v")
			var ce *Error
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, 503, ce.Status)
			assert.Equal(t, "no leader", ce.Body.Message)
			assert.InDelta(t, tc.want.Seconds(), ce.RetryAfter.Seconds(), 2)
		})
	}
}

// No answer is a TransportError; a watch the server ends, ErrStreamEnded;
// one the caller ends, its context's error.
func TestNoAnswerAndEndedStreams(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	_, err := (&Client{URL: gone.URL, Token: "t"}).Get(context.Background(), "v")
	var te *TransportError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, gone.URL, te.URL)
	assert.True(t, te.Retryable(), "refused: it may be up again")
	// A certificate not trusted is refused again: no retry mends it.
	untrusted := httptest.NewUnstartedServer(http.NotFoundHandler())
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0) // its handshake refused, as it should be
	untrusted.StartTLS()
	defer untrusted.Close()
	_, err = (&Client{URL: untrusted.URL, Token: "t"}).Get(context.Background(), "v")
	require.ErrorAs(t, err, &te)
	assert.False(t, te.Retryable(), "%v", err)

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("event: SYNCED\ndata: {}\n\n"))
		if r.URL.Query().Get("name") == "held" {
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	defer srv.Close()
	cl := &Client{URL: srv.URL, Token: "t"}
	err = cl.Watch(context.Background(), "", "v", func(saltvolumes.Event) bool { return true })
	assert.True(t, errors.Is(err, ErrStreamEnded), "%v", err)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = cl.Watch(ctx, "", "held", func(saltvolumes.Event) bool { return true })
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// hijacked answers nothing: the connection is closed (with linger 0, a
// reset) once the request is read.
func hijacked(reset bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		if tc, ok := conn.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	}
}

// No redirect is followed: the token, and a login's password, never
// reach the server a redirect points to, whatever the code (a 307 or 308
// would send the body again), whichever request, whichever HTTP client;
// the error names where it points.
func TestRedirectsAreNotFollowed(t *testing.T) {
	var seen []string
	var mu sync.Mutex
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization")+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"token": "x", "items": []}`))
	}))
	defer other.Close()
	for _, code := range []int{301, 302, 303, 307, 308} {
		redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, code)
		}))
		hcs := map[string]*http.Client{"default": nil, "its own": {}}
		if hc, err := HTTPS("", "", ""); assert.NoError(t, err) {
			hcs["HTTPS"] = hc
		}
		for hname, hc := range hcs {
			t.Run(fmt.Sprintf("%d, %s client", code, hname), func(t *testing.T) {
				cl := &Client{URL: redirecting.URL, Token: "secret-token", HTTP: hc}
				_, err := cl.Login(context.Background(), "alice", "secret-password", "pam")
				var re *RedirectError
				require.ErrorAs(t, err, &re)
				assert.Equal(t, code, re.Status)
				assert.Equal(t, other.URL+"/api/v1/login", re.Location)
				assert.Contains(t, err.Error(), "does not follow redirects")
				assert.Contains(t, err.Error(), other.URL+"/api/v1/login")
				_, err = cl.List(context.Background(), "")
				require.ErrorAs(t, err, &re)
				err = cl.Watch(context.Background(), "", "", func(saltvolumes.Event) bool { return true })
				require.ErrorAs(t, err, &re)
				_, err = cl.Status(context.Background())
				require.ErrorAs(t, err, &re)
			})
		}
		redirecting.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, seen, "the server redirected to was asked")
}

// Retryable is the network's failures alone: what a retry meets again
// (https to an http port, a scheme not http, a certificate refused) is
// not; no answer within HeaderTimeout is.
func TestRetryableIsTheNetworksOnly(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	reset := httptest.NewServer(hijacked(true))
	defer reset.Close()
	cut := httptest.NewServer(hijacked(false))
	defer cut.Close()
	hang := make(chan struct{})
	defer close(hang)
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer silent.Close()
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	for _, tc := range []struct {
		name, url string
		retry     bool
		msg       string
	}{
		{"refused", gone.URL, true, "refused"},
		{"reset", reset.URL, true, ""},
		{"cut", cut.URL, true, "EOF"},
		{"no answer in time", silent.URL, true, "no answer within 200ms"},
		{"https to an http port", strings.Replace(plain.URL, "http:", "https:", 1), false, ""},
		{"not http", "ftp://127.0.0.1:21", false, "unsupported protocol scheme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := (&Client{URL: tc.url, Token: "t", HeaderTimeout: 200 * time.Millisecond}).Get(context.Background(), "v")
			var te *TransportError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, tc.retry, te.Retryable(), "%v", err)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Less(t, time.Since(start), 10*time.Second)
		})
	}
	t.Run("a token no header can carry is not sent", func(t *testing.T) {
		var asked bool
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { asked = true }))
		defer srv.Close()
		_, err := (&Client{URL: srv.URL, Token: "t\nX-Evil: 1"}).Get(context.Background(), "v")
		require.Error(t, err)
		var te *TransportError
		assert.False(t, errors.As(err, &te), "not a failure of the network: %v", err)
		assert.Contains(t, err.Error(), "control character")
		assert.False(t, asked)
	})
	t.Run("a watch waits for its events without the header timeout", func(t *testing.T) {
		slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(300 * time.Millisecond)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("event: SYNCED\ndata: {}\n\n"))
		}))
		defer slow.Close()
		err := (&Client{URL: slow.URL, Token: "t", HeaderTimeout: 100 * time.Millisecond}).Watch(context.Background(), "", "", func(saltvolumes.Event) bool { return false })
		assert.NoError(t, err)
	})
}

// A 200 on /api/v1/watch that is not an event stream is not the API: an
// error, not a stream that "ended" (safe to retry).
func TestWatchWantsAnEventStream(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html>a login page</html>"))
	}))
	defer srv.Close()
	err := (&Client{URL: srv.URL, Token: "t"}).Watch(context.Background(), "", "", func(saltvolumes.Event) bool { return true })
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrStreamEnded)
	var te *TransportError
	assert.False(t, errors.As(err, &te))
	assert.Contains(t, err.Error(), `answered "text/html", not an event stream`)
}

// What a server says is bounded: an error page that is not the API's is
// cut, an answer past the cap is refused naming the cap, /readyz's 503
// without a body says so; a password in the URL is never printed.
func TestAnswersAreBounded(t *testing.T) {
	page := "<html>" + strings.Repeat("x", 10000) + "</html>"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/api/v1/volumes":
			_, _ = w.Write([]byte(`{"items": [` + strings.Repeat(`{},`, 1000) + `{}]}`))
		default:
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte(page))
		}
	}))
	defer srv.Close()
	cl := &Client{URL: srv.URL, Token: "t"}
	_, err := cl.Get(context.Background(), "v")
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.Less(t, len(ce.Body.Message), 400, ce.Body.Message)
	assert.Contains(t, ce.Body.Message, "HTTP 502: <html>xxx")
	assert.Contains(t, ce.Body.Message, "(10013 bytes in all)")

	defer func(n int) { maxAnswer = n }(maxAnswer)
	maxAnswer = 1000
	_, err = cl.List(context.Background(), "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the answer is larger than 1000 bytes, the most salt-volumes reads")
	maxAnswer = MaxAnswer
	_, err = cl.List(context.Background(), "")
	assert.NoError(t, err)
	assert.Contains(t, fmt.Sprint(MaxAnswer>>20), "256")

	_, err = cl.Status(context.Background())
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "not ready (HTTP 503)", ce.Body.Message)

	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	withPassword := strings.Replace(gone.URL, "http://", "http://alice:hunter2@", 1)
	_, err = (&Client{URL: withPassword, Token: "t"}).Get(context.Background(), "v")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2")
	assert.Contains(t, err.Error(), "alice:xxxxx@")
}
