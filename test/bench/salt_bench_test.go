package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	return controlPlaneAt(b, s, s.APIURL(), poll, false, "salt-api")
}

// controlPlaneAt is controlPlane with salt-api at apiURL (a proxy), with
// jobCache, job returns confirmed from the master's job cache on disk
// (salt.jobCache) instead of salt-api, and jobs published through the
// door publish names (salt.publish: master or salt-api).
func controlPlaneAt(b *testing.B, s *saltstack.Stack, apiURL string, poll time.Duration, jobCache bool, publish string) (*client.Client, func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	token := "bench-token-" + uuid.NewString()
	_, ret := s.Ports()
	text := fmt.Sprintf("listen: %s\ntoken: %s\nstore: %s\nsalt:\n  url: %s\n  username: %s\n  password: %s\n  publish: %s\n  master: tcp://127.0.0.1:%d\nevents:\n  socket: %s\n",
		addr, token, filepath.Join(b.TempDir(), "volumes.db"), apiURL, s.APIUser, s.APIPass, publish, ret, s.EventSocket())
	if poll > 0 {
		text += fmt.Sprintf("pollInterval: %s\n", poll)
	}
	if jobCache {
		text = strings.Replace(text, "events:\n", fmt.Sprintf("  jobCache: %s\nevents:\n", filepath.Join(s.Root, "var", "cache", "salt", "master", "jobs")), 1)
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

// countingProxy sits in front of salt-api and counts the requests made
// through it (logins apart). It also notes when the request that started
// each job reached salt-api, by the jid in salt-api's answer.
type countingProxy struct {
	srv  *httptest.Server
	n    atomic.Int64
	mu   sync.Mutex
	sent map[string]time.Time // jid -> when its local_async request came in
}

func (p *countingProxy) sentAt(jid string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent[jid]
}

// recorder keeps a copy of the answer for the proxy to read the jid.
type recorder struct {
	http.ResponseWriter
	body bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.body.Write(b)
	return r.ResponseWriter.Write(b)
}

func newCountingProxy(b *testing.B, target string) *countingProxy {
	u, err := url.Parse(target)
	if err != nil {
		b.Fatal(err)
	}
	p := &countingProxy{sent: map[string]time.Time{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/login" {
			p.n.Add(1)
		}
		start := time.Now()
		rec := &recorder{ResponseWriter: w}
		rp.ServeHTTP(rec, r)
		var ans struct {
			Return []struct {
				JID string `json:"jid"`
			} `json:"return"`
		}
		if json.Unmarshal(rec.body.Bytes(), &ans) == nil {
			p.mu.Lock()
			for _, r := range ans.Return {
				// The first answer naming a jid is local_async's;
				// later ones are lookups of the same job.
				if _, seen := p.sent[r.JID]; r.JID != "" && !seen {
					p.sent[r.JID] = start
				}
			}
			p.mu.Unlock()
		}
	}))
	b.Cleanup(p.srv.Close)
	return p
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0 // nothing measured (no salt-api request through the master's door)
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// deleteAndWatch deletes a volume and returns when the watch stream shows
// it gone, with the unprepare job's id.
func deleteAndWatch(b *testing.B, c *client.Client, name string) (time.Time, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var seen time.Time
	var jid string
	err := c.Watch(ctx, "", name, func(ev saltvolumes.Event) bool {
		if ev.Type == client.Synced {
			if _, err := c.Delete(ctx, name, false); err != nil {
				b.Fatal(err)
			}
			return true
		}
		if ev.Type == "DELETED" {
			seen = time.Now()
			return false
		}
		if ev.Volume.Status.Phase.String() == "Terminating" && ev.Volume.Status.JobID != "" {
			jid = ev.Volume.Status.JobID
		}
		return true
	})
	if seen.IsZero() {
		b.Fatalf("%s never deleted: %v", name, err)
	}
	return seen, jid
}

// BenchmarkWithSalt measures the control plane on a real salt-master,
// salt-minion and salt-api:
//   - status latency: a job return on the bus to the change on the watch
//     stream, job-cache confirmation included, over 100 creates and 100
//     deletes (p50, p99), against the same reconciler polling every 10 s
//     (MetalK8s's interval);
//   - salt-api requests per create and per delete, counted by a proxy;
//   - create-to-Available against the Salt job's own duration as the master
//     sees it (its new and ret events) and against `salt <minion>
//     state.apply salt_volumes.prepared` typed by hand.
func BenchmarkWithSalt(b *testing.B) {
	needRoot(b)
	saltOnce.Do(func() { measureWithSalt(b) })
}

var saltOnce sync.Once

// busTimes records when each job's new and ret events cross the master bus.
type busTimes struct {
	mu       sync.Mutex
	news, at map[string]time.Time
}

// watchJobTimes reads the master's bus until ctx ends and notes when each
// job's new and ret events cross it; it returns once connected.
func watchJobTimes(ctx context.Context, s *saltstack.Stack) *busTimes {
	times := &busTimes{news: map[string]time.Time{}, at: map[string]time.Time{}}
	bus := &events.Bus{Network: "unix", Addr: s.EventSocket()}
	connected := make(chan struct{})
	var once sync.Once
	go bus.Run(ctx, func() { once.Do(func() { close(connected) }) }, func(ev events.Event) {
		now := time.Now()
		p := strings.Split(ev.Tag, "/")
		times.mu.Lock()
		switch ev.Kind() {
		case events.KindJobReturn:
			times.at[p[2]] = now
		case events.KindJobNew:
			times.news[p[2]] = now
		}
		times.mu.Unlock()
	})
	<-connected
	return times
}

func (r *busTimes) get(jid string) (time.Time, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.news[jid], r.at[jid]
}

func measureWithSalt(b *testing.B) {
	s := saltstack.Start(b, binary, true)
	b.Cleanup(func() { testenv.Cleanup(s.StateDir, nil, b.Logf) })
	if out, code := s.SyncAll(s.MinionID); code != 0 {
		b.Fatalf("sync_all: %s", out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	times := watchJobTimes(ctx, s)
	proxy := newCountingProxy(b, s.APIURL())

	// Event mode, through the counting proxy: returns confirmed through
	// salt-api (jobs.list_job), then from the master's job cache on disk.
	n := sized(100, 3)
	measure := func(jobCache bool, prefix, publish string) createRun {
		return measureCreates(b, s, proxy, times, n, jobCache, prefix, publish)
	}
	report := func(what string, r createRun) {
		fmt.Printf("%s: status latency (job return on the bus -> watch stream, confirmation included), %d samples: p50 %s, p99 %s; "+
			"salt-api requests %.2f per create, %.2f per delete (counting proxy, logins apart); "+
			"create -> Available minus the job's own duration (new -> ret on the bus): p50 %s, p99 %s, "+
			"of which salt-api's local_async (request in -> new event) p50 %s and ours (create -> request, ret -> watch) p50 %s, p99 %s\n",
			what, len(r.lat), percentile(r.lat, 0.5).Round(100*time.Microsecond), percentile(r.lat, 0.99).Round(100*time.Microsecond),
			float64(r.createReqs)/float64(n), float64(r.deleteReqs)/float64(n),
			percentile(r.over, 0.5).Round(100*time.Microsecond), percentile(r.over, 0.99).Round(100*time.Microsecond),
			percentile(r.apiToNew, 0.5).Round(100*time.Microsecond),
			percentile(r.ours, 0.5).Round(100*time.Microsecond), percentile(r.ours, 0.99).Round(100*time.Microsecond))
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	viaAPI := measure(false, "api", "salt-api")
	report("published through salt-api, confirmed through salt-api", viaAPI)
	viaCache := measure(true, "cache", "salt-api")
	report("published through salt-api, confirmed from the job cache", viaCache)
	viaMaster := measure(true, "master", "master")
	report("published through the master's request server, confirmed from the job cache", viaMaster)
	p50 := percentile(viaMaster.lat, 0.5)
	metric(b, "status_latency_p50_ms", ms(p50), "ms")
	metric(b, "status_latency_p99_ms", ms(percentile(viaMaster.lat, 0.99)), "ms")
	metric(b, "salt_api_requests_per_create", float64(viaMaster.createReqs)/float64(n), "requests")
	metric(b, "salt_api_requests_per_delete", float64(viaMaster.deleteReqs)/float64(n), "requests")
	metric(b, "create_to_available_over_job_ms_p50", ms(percentile(viaMaster.over, 0.5)), "ms")
	metric(b, "salt_api_requests_per_create_saltapi", float64(viaCache.createReqs)/float64(n), "requests")
	metric(b, "create_to_available_over_job_ms_p50_saltapi", ms(percentile(viaCache.over, 0.5)), "ms")
	metric(b, "salt_api_local_async_to_new_ms_p50", ms(percentile(viaCache.apiToNew, 0.5)), "ms")
	metric(b, "create_to_available_ours_ms_p50", ms(percentile(viaCache.ours, 0.5)), "ms")
	walls := viaMaster.walls

	// The polling baseline: the same reconciler looking jobs up every 10 s
	// (every 2 s in the smoke pass, which only shows the path still works).
	pollEvery := time.Duration(sized(10, 2)) * time.Second
	cp, stopP := controlPlane(b, s, pollEvery)
	var pollLat []time.Duration
	var pollNames []string
	for i := range sized(3, 1) {
		// Sequential creates would land just after a tick, the worst
		// case; a random arrival gives the typical wait.
		time.Sleep(time.Duration(rand.Int64N(int64(pollEvery))))
		name := fmt.Sprintf("poll-%d", i)
		pollNames = append(pollNames, name)
		seen, _, jid := createAndWatch(b, cp, s.MinionID, name)
		_, retAt := times.get(jid)
		pollLat = append(pollLat, seen.Sub(retAt))
	}
	deleteAll(b, cp, pollNames)
	stopP()
	fmt.Printf("status latency, polling every %s (median of %d): %s: events are %.0fx faster at p50\n",
		pollEvery, len(pollLat), median(pollLat).Round(time.Millisecond), float64(median(pollLat))/float64(p50))

	// The floor: the same state, one volume, run by hand with the salt CLI.
	var floors []time.Duration
	for i := range sized(5, 1) {
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
	ours, floor := median(walls), median(floors)
	fmt.Printf("create -> Available through the API (median of %d): %s; salt %s state.apply salt_volumes.prepared by hand: %s; ratio %.2fx\n",
		len(walls), ours.Round(time.Millisecond), s.MinionID, floor.Round(time.Millisecond), float64(ours)/float64(floor))
}

// createRun is what measureCreates saw.
type createRun struct {
	lat, over, walls       []time.Duration
	apiToNew, ours         []time.Duration
	createReqs, deleteReqs int64
}

// measureCreates creates n volumes one after the other through a serve
// (confirming returns from the job cache or through salt-api, publishing
// through the master or salt-api), then deletes them, timing each against
// the job's own new and ret events on the bus.
func measureCreates(b *testing.B, s *saltstack.Stack, proxy *countingProxy, times *busTimes, n int, jobCache bool, prefix, publish string) createRun {
	var r createRun
	c, stop := controlPlaneAt(b, s, proxy.srv.URL, 0, jobCache, publish)
	defer stop()
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		names = append(names, name)
		before := proxy.n.Load()
		seen, took, jid := createAndWatch(b, c, s.MinionID, name)
		r.createReqs += proxy.n.Load() - before
		newAt, retAt := times.get(jid)
		if retAt.IsZero() || newAt.IsZero() {
			b.Fatalf("job %s's new or ret event was not seen on the bus", jid)
		}
		r.lat = append(r.lat, seen.Sub(retAt))
		r.over = append(r.over, took-retAt.Sub(newAt))
		r.walls = append(r.walls, took)
		// The time over the job splits into salt-api's own (its
		// local_async request in, to the job's new event) and ours
		// (create to that request, and the return to the watch).
		if sent := proxy.sentAt(jid); !sent.IsZero() {
			r.apiToNew = append(r.apiToNew, newAt.Sub(sent))
			r.ours = append(r.ours, took-retAt.Sub(sent))
		}
	}
	for _, name := range names {
		before := proxy.n.Load()
		seen, jid := deleteAndWatch(b, c, name)
		r.deleteReqs += proxy.n.Load() - before
		if _, retAt := times.get(jid); !retAt.IsZero() {
			r.lat = append(r.lat, seen.Sub(retAt))
		}
	}
	return r
}

// BenchmarkCreateOverJobPerLine measures create -> Available minus the
// Salt job's own duration on a master of each supported Salt line in one
// run (published through the master's request server, confirmed from its
// job cache, as serve runs on the master).
func BenchmarkCreateOverJobPerLine(b *testing.B) {
	needRoot(b)
	lines := saltstack.Lines
	if smoke {
		// The pinned line shows the path still works; make test-salt
		// runs the others' suites, make bench measures all three.
		lines = lines[len(lines)-1:]
	}
	for _, line := range lines {
		venv := saltstack.LineVenv(b, line)
		s := saltstack.StartOpts(b, binary, saltstack.Options{API: true, Venv: venv})
		if out, code := s.SyncAll(s.MinionID); code != 0 {
			b.Fatalf("sync_all on Salt %s: %s", s.Version(), out)
		}
		ctx, cancel := context.WithCancel(context.Background())
		times := watchJobTimes(ctx, s)
		proxy := newCountingProxy(b, s.APIURL())
		r := measureCreates(b, s, proxy, times, sized(30, 2), true, "line"+line, "master")
		cancel()
		p50 := percentile(r.over, 0.5)
		fmt.Printf("Salt %s: create -> Available minus the job's own duration, %d creates through the request server: p50 %s, p99 %s\n",
			s.Version(), len(r.over), p50.Round(100*time.Microsecond), percentile(r.over, 0.99).Round(100*time.Microsecond))
		metric(b, "create_to_available_over_job_ms_p50_"+line, float64(p50.Microseconds())/1000, "ms")
		testenv.Cleanup(s.StateDir, nil, b.Logf)
		s.Stop()
	}
}

// BenchmarkManyMinions runs as many salt-minion processes as this machine
// holds (10, each with its own id, keys and state dir, on loopback) and
// creates 10 volumes on each at once through the API: the time until all
// 100 are Available, against the slowest job's own duration (new -> ret).
func BenchmarkManyMinions(b *testing.B) {
	needRoot(b)
	manyOnce.Do(func() { measureManyMinions(b) })
}

var manyOnce sync.Once

func measureManyMinions(b *testing.B) {
	minions, perMinion := sized(10, 2), sized(10, 2)
	s := saltstack.Start(b, binary, true)
	stateDirs := map[string]string{s.MinionID: s.StateDir}
	nodes := []string{s.MinionID}
	for i := 2; i <= minions; i++ {
		id := fmt.Sprintf("node-%d", i)
		stateDirs[id] = s.AddMinion(id)
		nodes = append(nodes, id)
	}
	b.Cleanup(func() {
		for _, d := range stateDirs {
			testenv.Cleanup(d, nil, b.Logf)
		}
	})
	if out, code := s.SyncAll("*"); code != 0 {
		b.Fatalf("sync_all: %s", out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	times := watchJobTimes(ctx, s)
	c, stop := controlPlaneAt(b, s, s.APIURL(), 0, true, "salt-api")
	defer stop()

	var names []string
	for _, n := range nodes {
		for i := range perMinion {
			names = append(names, fmt.Sprintf("%s-v%d", n, i))
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
	defer wcancel()
	available := map[string]string{} // name -> the job that made it Available
	var mu sync.Mutex
	done := make(chan struct{})
	start := time.Now()
	var end time.Time
	go func() {
		_ = c.Watch(wctx, "", "", func(ev saltvolumes.Event) bool {
			if ev.Type == client.Synced {
				for _, name := range names {
					node := name[:strings.LastIndex(name, "-v")]
					go func() {
						if _, err := c.Create(wctx, map[string]any{"name": name, "node": node, "sparseLoopDevice": map[string]any{"size": "16Mi"}}); err != nil {
							b.Error(err)
						}
					}()
				}
				return true
			}
			if ev.Volume.Status.Phase.String() == "Failed" {
				b.Errorf("%s failed: %s", ev.Volume.Spec.Name, ev.Volume.Status.Message)
			}
			if ev.Volume.Status.Phase.String() == "Available" {
				mu.Lock()
				available[ev.Volume.Spec.Name] = ev.Volume.Status.JobID
				if len(available) == len(names) {
					end = time.Now()
					mu.Unlock()
					close(done)
					return false
				}
				mu.Unlock()
			}
			return true
		})
	}()
	select {
	case <-done:
	case <-wctx.Done():
		b.Fatalf("only %d of %d volumes Available after 10 minutes", len(available), len(names))
	}
	settle := end.Sub(start)
	var slowest time.Duration
	runs := map[string]bool{}
	for _, jid := range available {
		runs[jid] = true
		newAt, retAt := times.get(jid)
		if !newAt.IsZero() && !retAt.IsZero() && retAt.Sub(newAt) > slowest {
			slowest = retAt.Sub(newAt)
		}
	}
	// A minion runs one state run at a time: the volumes that queued for
	// a node while its first run lasted are prepared together by the next.
	fmt.Printf("real Salt: %d minions x %d volumes created at once: all %d Available in %s, by %d state runs; the slowest job's own duration (new -> ret) %s\n",
		minions, perMinion, len(names), settle.Round(time.Millisecond), len(runs), slowest.Round(time.Millisecond))
	metric(b, "real_salt_minions", float64(minions), "minions")
	metric(b, "real_salt_volumes_settle_s", settle.Seconds(), "s")
	metric(b, "real_salt_state_runs", float64(len(runs)), "runs")
	deleteAll(b, c, names)
}
