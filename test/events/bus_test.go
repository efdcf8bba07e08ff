// Package events tests the Go event-bus reader against a real salt-master.
package events

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type collector struct {
	mu     sync.Mutex
	events []events.Event
	conns  int
}

func (c *collector) wait(t *testing.T, limit time.Duration, match func(events.Event) bool) events.Event {
	t.Helper()
	e, ok := c.find(limit, match)
	if !ok {
		t.Fatalf("no matching event within %s", limit)
	}
	return e
}

func (c *collector) seen(limit time.Duration, match func(events.Event) bool) bool {
	_, ok := c.find(limit, match)
	return ok
}

func (c *collector) find(limit time.Duration, match func(events.Event) bool) (events.Event, bool) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, e := range c.events {
			if match(e) {
				c.mu.Unlock()
				return e, true
			}
		}
		c.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	return events.Event{}, false
}

func TestReadsTheRealMasterBusAndReconnects(t *testing.T) {
	s := saltstack.Start(t, "/bin/true", false)
	c := &collector{}
	bus := &events.Bus{Network: "unix", Addr: s.EventSocket(), MinBackoff: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	connected := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(done)
		_ = bus.Run(ctx, func() {
			c.mu.Lock()
			c.conns++
			c.mu.Unlock()
			once.Do(func() { close(connected) })
		}, func(e events.Event) {
			c.mu.Lock()
			c.events = append(c.events, e)
			c.mu.Unlock()
		})
	}()
	defer func() { cancel(); <-done }()
	<-connected // what is published from now on is read

	out, code := s.Salt(s.MinionID, "test.ping", "--out=json")
	require.Equal(t, 0, code, out)
	ret := c.wait(t, 30*time.Second, func(e events.Event) bool {
		r, ok := e.AsJobReturn()
		return ok && r.Fun == "test.ping" && r.Minion == s.MinionID
	})
	r, _ := ret.AsJobReturn()
	assert.True(t, r.Success)
	assert.Equal(t, true, r.Return)
	jobNew := c.wait(t, 5*time.Second, func(e events.Event) bool {
		return e.Kind() == events.KindJobNew && strings.Contains(e.Tag, r.JID)
	})
	assert.Equal(t, "test.ping", jobNew.Data["fun"])
	_, isTime := jobNew.Data["_stamp"].(string)
	assert.True(t, isTime, "_stamp decodes as a string")

	// Restart the master: the reader reconnects by itself and reads what
	// the new master publishes. (3008's minion fires salt/minion/<id>/start
	// when it re-authenticates; 3006's does not, so the test fires its own.)
	restarted := time.Now()
	s.Restart("master")
	after := func(e events.Event) bool { return e.Tag == "salt-volumes/after-restart/progress" }
	for seen := false; !seen; {
		out, code := s.SaltRun("event.send", "salt-volumes/after-restart/progress", "--out=json")
		require.Equal(t, 0, code, out)
		seen = c.seen(2*time.Second, after)
		if !seen && time.Since(restarted) > 90*time.Second {
			t.Fatal("no event read from the restarted master within 90 s")
		}
	}
	assert.GreaterOrEqual(t, bus.Stats.Reconnects.Load(), int64(1))
	c.mu.Lock()
	assert.GreaterOrEqual(t, c.conns, 2)
	c.mu.Unlock()
	assert.Equal(t, int64(0), bus.Stats.Skipped.Load(), "every real event decodes")

	// As serve reads it: only our events decoded, the rest passed over.
	served := &events.Bus{Network: "unix", Addr: s.EventSocket(), MinBackoff: 100 * time.Millisecond, Want: events.Relevant, Lazy: true}
	var mu sync.Mutex
	var kept []events.Event
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan struct{})
	connected2 := make(chan struct{})
	var once2 sync.Once
	go func() {
		defer close(done2)
		_ = served.Run(ctx2, func() { once2.Do(func() { close(connected2) }) }, func(e events.Event) { mu.Lock(); kept = append(kept, e); mu.Unlock() })
	}()
	defer func() { cancel2(); <-done2 }()
	<-connected2
	out, code = s.Salt(s.MinionID, "test.ping", "--out=json")
	require.Equal(t, 0, code, out)
	out, code = s.Salt(s.MinionID, "event.send", "salt-volumes/v-1/progress", `{"step": "x"}`, "--out=json")
	require.Equal(t, 0, code, out)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range kept {
			if p, ok := e.AsProgress(); ok && p.Step == "x" && p.Node == s.MinionID {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "our progress event is delivered")
	mu.Lock()
	for _, e := range kept {
		assert.NotEqual(t, events.KindJobReturn, e.Kind(), "test.ping's return is not ours: %s", e.Tag)
	}
	mu.Unlock()
	assert.Greater(t, served.Stats.Ignored.Load(), int64(2), "the job publication, its return, auth... passed over")
	assert.Equal(t, int64(0), served.Stats.Skipped.Load())
}
