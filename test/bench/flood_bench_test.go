package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// BenchmarkCreateUnderHintFlood measures create -> Available through a
// serve on the master (jobs published through the request server, returns
// confirmed from the job cache), first on a quiet bus, then while job
// returns under made-up jids, each naming ten made-up volumes, are fired
// onto the master's bus at 1,000 a second: what a compromised minion can
// make the master publish. Goal: p99 under the flood at most 1.5 times
// the quiet p99 of the same run.
func BenchmarkCreateUnderHintFlood(b *testing.B) {
	needRoot(b)
	line := pinned(b)
	s := saltstack.Start(b, binary, true)
	b.Cleanup(func() { testenv.Cleanup(s.StateDir, nil, b.Logf) })
	if out, code := s.SyncAll(s.MinionID); code != 0 {
		b.Fatalf("sync_all: %s", out)
	}
	c, stop := controlPlaneAt(b, s, s.APIURL(), 0, true, "master")
	defer stop()
	n := sized(60, 5)
	creates := func(prefix string) []time.Duration {
		var took []time.Duration
		var names []string
		for i := range n {
			name := fmt.Sprintf("%s-%d", prefix, i)
			names = append(names, name)
			_, d, _ := createAndWatch(b, c, s.MinionID, name)
			took = append(took, d)
		}
		deleteAll(b, c, names)
		return took
	}
	quiet := creates("quiet")

	// Count the forged returns that really crossed the bus.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var crossed atomic.Int64
	bus := &events.Bus{Network: "unix", Addr: s.EventSocket()}
	connected := make(chan struct{})
	var once sync.Once
	go bus.Run(ctx, func() { once.Do(func() { close(connected) }) }, func(ev events.Event) {
		if ev.Kind() == events.KindJobReturn && strings.HasSuffix(ev.Tag, "/ret/flood-minion") {
			crossed.Add(1)
		}
	})
	<-connected
	repo, err := saltstack.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	fctx, stopFlood := context.WithCancel(ctx)
	flood := exec.CommandContext(fctx, line.py, filepath.Join(repo, "test", "bench", "eventstream.py"), "flood", s.Conf, "1000", "3600", "10", "flood-minion")
	if err := flood.Start(); err != nil {
		b.Fatal(err)
	}
	floodDone := make(chan struct{})
	go func() { _ = flood.Wait(); close(floodDone) }()
	defer func() { stopFlood(); <-floodDone }()
	// Let the flood reach its rate before measuring.
	deadline := time.Now().Add(30 * time.Second)
	for crossed.Load() < 500 {
		if time.Now().After(deadline) {
			b.Fatalf("the flood did not start: %d forged returns on the bus after 30 s", crossed.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	start, before := time.Now(), crossed.Load()
	under := creates("flood")
	rate := float64(crossed.Load()-before) / time.Since(start).Seconds()
	stopFlood()
	<-floodDone

	dropped := serveMetric(b, c, `salt_volumes_events_rejected_total{reason="flood"}`)
	lookups := serveMetric(b, c, `salt_volumes_job_lookups_total`)
	qp99, fp99 := percentile(quiet, 0.99), percentile(under, 0.99)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	fmt.Printf("create -> Available, %d creates each: quiet p50 %s p99 %s; under %.0f forged returns/s of 10 names each p50 %s p99 %s (ratio %.2f); serve dropped %.0f of them as a flood, %.0f job lookups in all\n",
		n, percentile(quiet, 0.5).Round(100*time.Microsecond), qp99.Round(100*time.Microsecond), rate,
		percentile(under, 0.5).Round(100*time.Microsecond), fp99.Round(100*time.Microsecond), float64(fp99)/float64(qp99), dropped, lookups)
	metric(b, "create_p99_ms", ms(qp99), "ms")
	metric(b, "create_p99_ms_under_hint_flood", ms(fp99), "ms")
	metric(b, "create_p99_under_hint_flood_ratio", float64(fp99)/float64(qp99), "ratio")
	metric(b, "hint_flood_rate", rate, "returns/s")
}

// serveMetric reads one sample of serve's /metrics.
func serveMetric(b *testing.B, c *client.Client, series string) float64 {
	req, err := http.NewRequest("GET", c.URL+"/metrics", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		b.Fatalf("%s not in /metrics", series)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}
