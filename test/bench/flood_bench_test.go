package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
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
	cpu0 := cpuByRole()
	t0 := time.Now()
	quiet := creates("quiet")
	quietCPU, quietTook := cpuByRole().minus(cpu0), time.Since(t0)

	// Count the forged events that really crossed the bus.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var crossed, noise atomic.Int64
	bus := &events.Bus{Network: "unix", Addr: s.EventSocket()}
	connected := make(chan struct{})
	var once sync.Once
	go bus.Run(ctx, func() { once.Do(func() { close(connected) }) }, func(ev events.Event) {
		switch {
		case !strings.HasSuffix(ev.Tag, "/flood-minion"):
		case ev.Kind() == events.KindJobReturn:
			crossed.Add(1)
		case strings.HasPrefix(ev.Tag, "bench/noise/"):
			noise.Add(1)
		}
	})
	<-connected
	repo, err := saltstack.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	// underFlood runs the creates while the flooder fires events of kind
	// at 1,000 a second, and says how many a second crossed the bus and
	// what each process spent meanwhile.
	underFlood := func(kind, prefix string, seen *atomic.Int64) ([]time.Duration, float64, cpuUse, time.Duration) {
		fctx, stopFlood := context.WithCancel(ctx)
		flood := exec.CommandContext(fctx, line.py, filepath.Join(repo, "test", "bench", "eventstream.py"), "flood", s.Conf, "1000", "3600", "10", "flood-minion", kind)
		if err := flood.Start(); err != nil {
			b.Fatal(err)
		}
		floodDone := make(chan struct{})
		go func() { _ = flood.Wait(); close(floodDone) }()
		defer func() { stopFlood(); <-floodDone }()
		// Let the flood reach its rate before measuring.
		deadline := time.Now().Add(30 * time.Second)
		for first := seen.Load(); seen.Load()-first < 500; {
			if time.Now().After(deadline) {
				b.Fatalf("the %s flood did not start: %d events on the bus after 30 s", kind, seen.Load()-first)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c0, start, before := cpuByRole(), time.Now(), seen.Load()
		took := creates(prefix)
		return took, float64(seen.Load()-before) / time.Since(start).Seconds(), cpuByRole().minus(c0), time.Since(start)
	}
	// The same flood under a tag serve never looks at: what the bus and
	// the flooder cost every process on the machine, serve or no serve.
	control, noiseRate, noiseCPU, noiseTook := underFlood("noise", "noise", &noise)
	under, rate, floodCPU, floodTook := underFlood("returns", "flood", &crossed)

	dropped := serveMetric(b, c, `salt_volumes_events_rejected_total{reason="flood"}`)
	lookups := serveMetric(b, c, `salt_volumes_job_lookups_total`)
	qp99, np99, fp99 := percentile(quiet, 0.99), percentile(control, 0.99), percentile(under, 0.99)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	fmt.Printf("create -> Available, %d creates each: quiet p50 %s p99 %s; under %.0f noise events/s p50 %s p99 %s; under %.0f forged returns/s of 10 names each p50 %s p99 %s (ratio to quiet %.2f, to noise %.2f); serve dropped %.0f of them as a flood, %.0f job lookups in all\n",
		n, r(percentile(quiet, 0.5)), r(qp99), noiseRate, r(percentile(control, 0.5)), r(np99), rate,
		r(percentile(under, 0.5)), r(fp99), float64(fp99)/float64(qp99), float64(fp99)/float64(np99), dropped, lookups)
	// Where the time goes: CPU seconds per wall second of each phase, by
	// process (serve runs inside this test process).
	for _, p := range []struct {
		name string
		use  cpuUse
		took time.Duration
	}{{"quiet", quietCPU, quietTook}, {"noise", noiseCPU, noiseTook}, {"flood", floodCPU, floodTook}} {
		fmt.Printf("CPU (cores busy) during the %s creates:%s\n", p.name, p.use.per(p.took))
		metric(b, "hint_flood_cpu_serve_"+p.name, p.use["serve (this process)"]/p.took.Seconds(), "cores")
	}
	metric(b, "create_p99_ms", ms(qp99), "ms")
	metric(b, "create_p99_ms_under_noise_flood", ms(np99), "ms")
	metric(b, "create_p99_ms_under_hint_flood", ms(fp99), "ms")
	metric(b, "create_p99_under_hint_flood_ratio", float64(fp99)/float64(qp99), "ratio")
	metric(b, "create_p99_hint_to_noise_flood_ratio", float64(fp99)/float64(np99), "ratio")
	metric(b, "hint_flood_rate", rate, "returns/s")
	metric(b, "noise_flood_rate", noiseRate, "events/s")
}

// cpuUse is CPU seconds by process role.
type cpuUse map[string]float64

func (u cpuUse) minus(o cpuUse) cpuUse {
	out := cpuUse{}
	for k, v := range u {
		out[k] = v - o[k]
	}
	return out
}

// per formats the roles' CPU seconds per wall second, busiest first.
func (u cpuUse) per(d time.Duration) string {
	keys := make([]string, 0, len(u))
	for k := range u {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return u[keys[i]] > u[keys[j]] })
	var sb strings.Builder
	for _, k := range keys {
		if v := u[k] / d.Seconds(); v >= 0.005 {
			fmt.Fprintf(&sb, " %s %.2f", k, v)
		}
	}
	return sb.String()
}

// cpuByRole sums the CPU time of every process on the machine, with that
// of its reaped children, by what it is: a Salt daemon's job processes and
// the salt-volume-exec runs they reap count towards that daemon.
func cpuByRole() cpuUse {
	tick := 100.0 // USER_HZ on Linux
	self := os.Getpid()
	u := cpuUse{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: utime is the
		// 14th field of the line, the 12th after it.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 15 {
			continue
		}
		var sum float64
		for _, i := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseFloat(f[i], 64)
			sum += v / tick
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		role := "other"
		switch line := string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})); {
		case pid == self:
			role = "serve (this process)"
		case strings.Contains(line, "eventstream.py"):
			role = "flooder"
		case strings.Contains(line, "salt-master"):
			role = "salt-master"
		case strings.Contains(line, "salt-minion"):
			role = "salt-minion"
		case strings.Contains(line, "salt-api"):
			role = "salt-api"
		}
		u[role] += sum
	}
	return u
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
