package events

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The reader recognises the framing of the Salt under test from the stream
// itself, and decodes a job's whole life on it. With
// SALT_VOLUMES_CAPTURE_DIR set, the raw bytes are written there as
// bus-<release>.bin: the golden captures of internal/events come from here.
func TestDetectsThisSaltsFraming(t *testing.T) {
	s := saltstack.Start(t, "/bin/true", false)
	release := saltstack.Version(t)

	conn, err := net.Dial("unix", s.EventSocket())
	require.NoError(t, err)
	defer conn.Close()
	rec := &testenv.SyncBuffer{} // every byte read from the socket
	dec := events.NewDecoder(io.TeeReader(conn, rec))
	evs := make(chan events.Event, 256)
	go func() {
		defer close(evs)
		for {
			ev, err := dec.Next()
			if err != nil {
				return
			}
			evs <- ev
		}
	}()
	// The master's publisher accepts the connection before it registers
	// it: fire until our own event comes back, so nothing is missed after.
	mine := func(ev events.Event) bool { return ev.Tag == "salt-volumes/capture/progress" }
	fired := false
	for i := 0; i < 60 && !fired; i++ {
		out, code := s.SaltRun("event.send", "salt-volumes/capture/progress", "--out=json")
		require.Equal(t, 0, code, out)
		_, fired = await(evs, time.Second, mine)
	}
	require.True(t, fired, "our own event came back on the bus of Salt %s (framing read as %s, %d skipped)", release, dec.Framing(), dec.Skipped)

	out, code := s.Salt(s.MinionID, "test.ping", "--out=json")
	require.Equal(t, 0, code, out)
	ev, ok := await(evs, 30*time.Second, func(ev events.Event) bool {
		r, ok := ev.AsJobReturn()
		return ok && r.Fun == "test.ping"
	})
	require.True(t, ok, "test.ping's return on the bus of Salt %s (framing read as %s, %d skipped)", release, dec.Framing(), dec.Skipped)
	ret, _ := ev.AsJobReturn()
	assert.Equal(t, true, ret.Return)
	want, err := saltstack.BusFraming(release)
	require.NoError(t, err)
	assert.Equal(t, want, dec.Framing(), "Salt %s", release)
	assert.Equal(t, 0, dec.Skipped, "every real frame decodes")
	t.Logf("Salt %s: %s framing, test.ping's return decoded", release, dec.Framing())

	if dir := os.Getenv("SALT_VOLUMES_CAPTURE_DIR"); dir != "" {
		conn.Close()
		for range evs {
		}
		path := filepath.Join(dir, "bus-"+release+".bin")
		require.NoError(t, os.WriteFile(path, rec.Bytes(), 0o644))
		t.Logf("wrote %s", path)
	}
}

// await reads events until one matches or the limit passes.
func await(evs <-chan events.Event, limit time.Duration, match func(events.Event) bool) (events.Event, bool) {
	deadline := time.After(limit)
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				return events.Event{}, false
			}
			if match(ev) {
				return ev, true
			}
		case <-deadline:
			return events.Event{}, false
		}
	}
}
