package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/config"
	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/server"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// controlPlane runs salt-volumes serve in-process against the stack.
func controlPlane(b *testing.B, s *saltstack.Stack, poll time.Duration) (*client.Client, func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	token := "bench-token-" + uuid.NewString()
	text := fmt.Sprintf("listen: %s\ntoken: %s\nstore: %s\nsalt:\n  url: %s\n  username: %s\n  password: %s\nevents:\n  socket: %s\n",
		addr, token, filepath.Join(b.TempDir(), "volumes.db"), s.APIURL(), s.APIUser, s.APIPass, s.EventSocket())
	if poll > 0 {
		text += fmt.Sprintf("pollInterval: %s\n", poll)
	}
	cfg, err := config.Parse([]byte(text))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := server.Run(ctx, cfg, slog.New(slog.DiscardHandler), nil, func(string) { close(ready) }); err != nil {
			b.Error(err)
		}
	}()
	<-ready
	return &client.Client{URL: "http://" + addr, Token: token}, func() { cancel(); <-done }
}

// returns records when each job return crosses the master bus.
type returns struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (r *returns) get(jid string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at[jid]
}

// createAndWatch creates a volume and returns when the watch stream shows it
// Available, with the time it showed.
func createAndWatch(b *testing.B, c *client.Client, node, name string) (time.Time, time.Duration, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var start, seen time.Time
	var jid string
	err := c.Watch(ctx, "", name, func(ev saltvolumes.Event) bool {
		if ev.Type == client.Synced {
			start = time.Now()
			if _, err := c.Create(ctx, map[string]any{"name": name, "node": node, "sparseLoopDevice": map[string]any{"size": "16Mi"}}); err != nil {
				b.Fatal(err)
			}
			return true
		}
		switch ev.Volume.Status.Phase.String() {
		case "Available":
			seen, jid = time.Now(), ev.Volume.Status.JobID
			return false
		case "Failed":
			b.Fatalf("%s failed: %s", name, ev.Volume.Status.Message)
		}
		return true
	})
	if seen.IsZero() {
		b.Fatalf("%s never Available: %v", name, err)
	}
	return seen, seen.Sub(start), jid
}

func deleteAll(b *testing.B, c *client.Client, names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, n := range names {
		if _, err := c.Delete(ctx, n, false); err != nil {
			b.Errorf("delete %s: %v", n, err)
			continue
		}
		_ = c.Watch(ctx, "", n, func(ev saltvolumes.Event) bool { return ev.Type != "DELETED" })
	}
}

// BenchmarkWithSalt measures the control plane on a real salt-master,
// salt-minion and salt-api:
//   - status latency: a job return on the bus to the change on the watch
//     stream, event mode against the same reconciler polling every 10 s
//     (MetalK8s's interval);
//   - create-to-Available through the API against `salt <minion>
//     state.apply salt_volumes.prepared` typed by hand (the floor).
func BenchmarkWithSalt(b *testing.B) {
	needRoot(b)
	saltOnce.Do(func() { measureWithSalt(b) })
}

var saltOnce sync.Once

func measureWithSalt(b *testing.B) {
	s := saltstack.Start(b, binary, true)
	b.Cleanup(func() { testenv.Cleanup(s.StateDir, nil, b.Logf) })
	if out, code := s.Salt(s.MinionID, "saltutil.sync_all", "--out=json"); code != 0 {
		b.Fatalf("sync_all: %s", out)
	}
	rets := &returns{at: map[string]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bus := &events.Bus{Network: "unix", Addr: s.EventSocket()}
	connected := make(chan struct{})
	var once sync.Once
	go bus.Run(ctx, func() { once.Do(func() { close(connected) }) }, func(ev events.Event) {
		if jr, ok := ev.AsJobReturn(); ok {
			rets.mu.Lock()
			rets.at[jr.JID] = time.Now()
			rets.mu.Unlock()
		}
	})
	<-connected

	latency := func(mode string, poll time.Duration, n int) (time.Duration, []time.Duration) {
		c, stop := controlPlane(b, s, poll)
		defer stop()
		var lat, wall []time.Duration
		var names []string
		for i := range n {
			if poll > 0 {
				// Sequential creates would land just after a tick, the worst
				// case; a random arrival gives the typical wait.
				time.Sleep(time.Duration(rand.Int64N(int64(poll))))
			}
			name := fmt.Sprintf("%s-%d", mode, i)
			names = append(names, name)
			seen, took, jid := createAndWatch(b, c, s.MinionID, name)
			at := rets.get(jid)
			if at.IsZero() {
				b.Fatalf("job %s's return was not seen on the bus", jid)
			}
			lat = append(lat, seen.Sub(at))
			wall = append(wall, took)
		}
		deleteAll(b, c, names)
		return median(lat), wall
	}
	evLat, evWall := latency("event", 0, 5)
	pollLat, _ := latency("poll", 10*time.Second, 3)
	fmt.Printf("status latency (job return on the bus -> watch stream), median: events %s, polling every 10s %s: events are %.0fx faster\n",
		evLat.Round(10*time.Microsecond), pollLat.Round(time.Millisecond), float64(pollLat)/float64(evLat))
	b.ReportMetric(float64(evLat.Microseconds())/1000, "ms-latency-events")
	b.ReportMetric(float64(pollLat.Milliseconds()), "ms-latency-polling")

	// The floor: the same state, one volume, run by hand with the salt CLI.
	var floors []time.Duration
	for i := range 5 {
		id := uuid.NewString()
		vol := map[string]any{"name": fmt.Sprintf("floor-%d", i), "uuid": id, "node": s.MinionID, "sparseLoopDevice": map[string]any{"size": "16Mi"}}
		start := time.Now()
		out, code := s.Salt(s.MinionID, "state.apply", "salt_volumes.prepared", "--out=json", saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volume": vol}}))
		floors = append(floors, time.Since(start))
		if code != 0 {
			b.Fatalf("floor run: %s", out)
		}
		if out, code := s.Salt(s.MinionID, "state.apply", "salt_volumes.unprepared", "--out=json", saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volume": vol}})); code != 0 {
			b.Fatalf("floor cleanup: %s", out)
		}
	}
	ours, floor := median(evWall), median(floors)
	fmt.Printf("create -> Available through the API (median of %d): %s; salt %s state.apply salt_volumes.prepared by hand: %s; ratio %.2fx\n",
		len(evWall), ours.Round(time.Millisecond), s.MinionID, floor.Round(time.Millisecond), float64(ours)/float64(floor))
	b.ReportMetric(float64(ours.Milliseconds()), "ms-create-to-available")
	b.ReportMetric(float64(floor.Milliseconds()), "ms-salt-cli-floor")
}
