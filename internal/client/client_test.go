package client

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
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
