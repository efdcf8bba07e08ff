package events

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shape salt-api's GET /events writes (reference notes, section 4).
const sseBody = "retry: 400\n" +
	"tag: salt/job/20261122000000000001/ret/node-1\n" +
	`data: {"tag": "salt/job/20261122000000000001/ret/node-1", "data": {"fun": "state.apply", "retcode": 0, "return": {"a": 1}, "_stamp": "2026-11-22T00:00:00.000000"}}` + "\n\n" +
	"tag: garbage\ndata: {not json\n\n" +
	"tag: salt-volumes/data-1/progress\n" +
	`data: {"tag": "salt-volumes/data-1/progress", "data": {"cmd": "_minion_event", "id": "node-1", "data": {"step": "attached", "uuid": "u"}}}` + "\n\n"

func TestSSEReadsSaltAPIStreamAndLogsInAgainOn401(t *testing.T) {
	var tokens atomic.Int32
	var requests atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.URL.Path != "/events" || r.Header.Get("X-Auth-Token") != fmt.Sprintf("tok-%d", 2) {
			w.WriteHeader(401) // the first token was forgotten (salt-api restarted)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, sseBody)
	}))
	defer ts.Close()
	tokens.Store(1)
	s := &SSE{URL: ts.URL, MinBackoff: time.Millisecond,
		Token:   func(context.Context) (string, error) { return fmt.Sprintf("tok-%d", tokens.Load()), nil },
		Relogin: func(context.Context) error { tokens.Add(1); return nil },
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []Event
	connects := 0
	_ = s.Run(ctx, func() { connects++ }, func(e Event) {
		got = append(got, e)
		if len(got) == 2 {
			cancel()
		}
	})
	require.Len(t, got, 2)
	assert.Equal(t, 1, connects)
	jr, ok := got[0].AsJobReturn()
	require.True(t, ok)
	assert.Equal(t, "20261122000000000001", jr.JID)
	assert.Equal(t, "node-1", jr.Minion)
	assert.True(t, jr.Success)
	p, ok := got[1].AsProgress()
	require.True(t, ok)
	assert.Equal(t, "attached", p.Step)
	assert.Equal(t, "node-1", p.Node)
	assert.EqualValues(t, 1, s.Stats.Skipped.Load(), "the garbage record was skipped, not fatal")
	assert.EqualValues(t, 2, s.Stats.Decoded.Load())
}
