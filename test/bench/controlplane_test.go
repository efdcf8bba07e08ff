package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
)

// saltLine is one Salt line's tested release, as the benchmarks run it.
type saltLine struct {
	name, release, py string
	framing           events.Framing
}

func lineOf(b *testing.B, name, venv string) saltLine {
	py := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(py); err != nil {
		b.Skip("Salt is not installed in .venv: run make setup")
	}
	release := saltstack.ReleaseOf(b, venv)
	framing, err := saltstack.BusFraming(release)
	if err != nil {
		b.Fatal(err)
	}
	return saltLine{name: name, release: release, py: py, framing: framing}
}

// pinned is the release make test runs (.venv).
func pinned(b *testing.B) saltLine {
	repo, err := saltstack.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	return lineOf(b, "pinned", filepath.Join(repo, ".venv"))
}

// lines are every supported Salt line's tested release.
func lines(b *testing.B) []saltLine {
	var ls []saltLine
	for _, name := range saltstack.Lines {
		ls = append(ls, lineOf(b, name, saltstack.LineVenv(b, name)))
	}
	return ls
}

// python runs test/bench/eventstream.py with the line's Salt, in its framing.
func (l saltLine) python(b *testing.B, args ...string) []byte {
	repo, err := saltstack.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(l.py, append([]string{filepath.Join(repo, "test", "bench", "eventstream.py")}, args...)...)
	cmd.Env = append(os.Environ(), "FRAMING=plain")
	if l.framing == events.FramingLengthPrefixed {
		cmd.Env = append(os.Environ(), "FRAMING=prefixed")
	}
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("eventstream.py %s with Salt %s: %v", strings.Join(args, " "), l.release, err)
	}
	return out
}

// recorded writes n events with the line's own packer and framing
// (eventstream.py); mix is ours, returns or mixed.
func (l saltLine) recorded(b *testing.B, n int, mix ...string) []byte {
	path := filepath.Join(b.TempDir(), "stream.bin")
	l.python(b, append([]string{"write", strconv.Itoa(n), path}, mix...)...)
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func recorded(b *testing.B, n int, mix ...string) []byte { return pinned(b).recorded(b, n, mix...) }

// pythonRead is how long the line's own subscriber code takes to decode
// the stream at path (every event, as Salt's PubClient and SaltEvent do).
func (l saltLine) pythonRead(b *testing.B, path string, n int) float64 {
	f := strings.Fields(string(l.python(b, "read", path)))
	if len(f) != 2 || f[0] != strconv.Itoa(n) {
		b.Fatalf("python (Salt %s) decoded %q", l.release, f)
	}
	sec, _ := strconv.ParseFloat(f[1], 64)
	return sec
}

// decodeOurs decodes a stream the way serve reads the bus.
type decoded struct {
	secs             float64
	allocs           uint64
	ours, passedOver int
	framing          events.Framing
}

func decodeOurs(b *testing.B, data []byte, n int) decoded {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	start := time.Now()
	dec := events.NewDecoder(bytes.NewReader(data))
	dec.Want, dec.Lazy = events.Relevant, true
	got := 0
	for {
		ev, err := dec.Next()
		if err != nil {
			break
		}
		if ev.Kind() == events.KindJobReturn {
			if _, ok := ev.AsJobReturn(); !ok {
				b.Fatal("job return not typed")
			}
		}
		got++
	}
	secs := time.Since(start).Seconds()
	runtime.ReadMemStats(&m1)
	if got+dec.Ignored != n || dec.Skipped != 0 {
		b.Fatalf("decoded %d + ignored %d of %d (skipped %d)", got, dec.Ignored, n, dec.Skipped)
	}
	return decoded{secs: secs, allocs: m1.Mallocs - m0.Mallocs, ours: got, passedOver: dec.Ignored, framing: dec.Framing()}
}

// BenchmarkDecodeThroughput decodes recorded streams the way serve reads
// the bus (tag first, only our events decoded) and with Salt's own
// subscriber code (PubClient's Unpacker plus SaltEvent.unpack, which
// decodes every event), and prints events per second for both: a busy
// master's mix (about 90 % of it not ours) and job returns only, on the
// pinned release; then the mix of each supported line, in that line's
// framing, against that line's own subscriber.
func BenchmarkDecodeThroughput(b *testing.B) {
	n := sized(60000, 2000)
	pin := pinned(b)
	for _, mix := range []string{"mixed", "returns"} {
		ratio := decodeRatio(b, pin, mix, n)
		name := "decode_ratio_mixed"
		if mix == "returns" {
			name = "decode_ratio_returns"
		}
		metric(b, name, ratio, "x")
	}
	for _, l := range lines(b) {
		metric(b, "decode_ratio_mixed_"+l.name, decodeRatio(b, l, "mixed", n), "x")
	}
}

// decodeRatio is how many times faster serve's decoder reads a stream of
// the line's than the line's own subscriber (medians of a few runs).
func decodeRatio(b *testing.B, l saltLine, mix string, n int) float64 {
	data := l.recorded(b, n, mix)
	path := filepath.Join(b.TempDir(), mix+".bin")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		b.Fatal(err)
	}
	var goSecs, pySecs []float64
	var last decoded
	for range sized(5, 1) {
		last = decodeOurs(b, data, n)
		goSecs = append(goSecs, last.secs)
		pySecs = append(pySecs, l.pythonRead(b, path, n))
	}
	if last.framing != l.framing {
		b.Fatalf("Salt %s's stream read as %s framing, want %s", l.release, last.framing, l.framing)
	}
	g, p := medianF(goSecs), medianF(pySecs)
	fmt.Printf("decode %s, Salt %s (%s framing): %d events (%.1f MB, written with that Salt's packer; %d ours decoded, %d passed over): ours %.0f events/s, that Salt's Python subscriber %.0f events/s: %.1fx; %d allocations in all (%.1f per decoded event)\n",
		mix, l.release, l.framing, n, float64(len(data))/1e6, last.ours, last.passedOver, float64(n)/g, float64(n)/p, p/g, last.allocs, float64(last.allocs)/float64(max(last.ours, 1)))
	return p / g
}

func medianF(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// replaySalt answers local_async with the job ids the recorded stream uses,
// and jobs.list_job with the returns the stream carries, as Salt's job cache
// would hold them (the reconciler confirms every bus return there).
type replaySalt struct{ cache map[string]saltapi.JobInfo }

func newReplaySalt(b *testing.B, data []byte) replaySalt {
	r := replaySalt{cache: map[string]saltapi.JobInfo{}}
	dec := events.NewDecoder(bytes.NewReader(data))
	for {
		ev, err := dec.Next()
		if err != nil {
			break
		}
		jr, ok := ev.AsJobReturn()
		if !ok {
			continue
		}
		body, err := json.Marshal(jr.Return)
		if err != nil {
			b.Fatal(err)
		}
		info := r.cache[jr.JID]
		if info.Returns == nil {
			info = saltapi.JobInfo{Known: true, Function: jr.Fun, Returns: map[string]saltapi.MinionReturn{}}
		}
		info.Returns[jr.Minion] = saltapi.MinionReturn{Return: body, Retcode: jr.Retcode}
		r.cache[jr.JID] = info
	}
	return r
}

func (replaySalt) LocalAsync(_ context.Context, tgt, _ string, arg []any, _ map[string]any) (saltapi.Job, error) {
	v := arg[1].([]any)[0].(spec.Spec)
	i, _ := strconv.Atoi(strings.TrimPrefix(v.Name, "vol-"))
	return saltapi.Job{JID: fmt.Sprintf("2026112200%010d", i), Minions: []string{tgt}}, nil
}
func (r replaySalt) ListJob(_ context.Context, jid string) (saltapi.JobInfo, error) {
	if info, ok := r.cache[jid]; ok {
		return info, nil
	}
	return saltapi.JobInfo{Known: true}, nil
}

// BenchmarkReplay settles volumes from a replayed bus stream (through a Unix
// socket and our bus reader, like the master's) with the bbolt store on
// disk: 100,000 volumes on 10,000 nodes against 1,000 on 100 in the same
// run.
func BenchmarkReplay(b *testing.B) {
	// One measurement however many times the framework calls us: a run
	// takes minutes, mostly writing the stream and the store.
	replayOnce.Do(func() {
		replaySmall = replay(b, sized(1000, 100), sized(100, 10), boltStore)
		replayLarge = replay(b, sized(100000, 1000), sized(10000, 100), boltStore)
	})
	small, large := replaySmall, replayLarge
	b.ReportMetric(large.settle.Seconds(), "s-settle-100k")
	b.ReportMetric(float64(large.heap)/1e6, "MB-heap-100k")
	per := func(r replayResult, n int) float64 { return float64(r.settle.Microseconds()) / float64(n) }
	fmt.Printf("replay: 100000 volumes on 10000 nodes settled in %s (%.0f us/volume), live heap %.1f MB (%.2f KB/volume); "+
		"1000 volumes on 100 nodes: %s (%.0f us/volume); per-volume time ratio 100k/1k = %.2fx\n",
		large.settle.Round(time.Millisecond), per(large, 100000), float64(large.heap)/1e6, float64(large.heap)/100000/1024,
		small.settle.Round(time.Millisecond), per(small, 1000), per(large, 100000)/per(small, 1000))
	metric(b, "replay_100k_settle_s", large.settle.Seconds(), "s")
	metric(b, "replay_100k_heap_mb", float64(large.heap)/1e6, "MB")
	// Seconds do not travel between machines; the per-volume ratio does.
	metric(b, "replay_per_volume_ratio_100k_1k", per(large, sized(100000, 1000))/per(small, sized(1000, 100)), "x")
}

// BenchmarkReplayEtcd is the 100k replay with the store on a real
// three-member etcd cluster (every settle one fenced transaction).
func BenchmarkReplayEtcd(b *testing.B) {
	replayEtcdOnce.Do(func() {
		ec := startEtcd(b)
		n := sized(100000, 500)
		open := func(b *testing.B, _ string) (store.Store, store.Writer) {
			st, cli, err := store.OpenEtcd(context.Background(), store.EtcdConfig{Endpoints: ec.Endpoints, Prefix: "/replay", RequestTimeout: 30 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close(); cli.Close() })
			// The reconciler writes as a leader does: fenced on a leader key.
			put, err := cli.Put(context.Background(), "/replay/leader/bench", "bench")
			if err != nil {
				b.Fatal(err)
			}
			return st, st.Fenced(&store.Fence{Key: "/replay/leader/bench", Rev: put.Header.Revision})
		}
		r := replay(b, n, n/10, open)
		fmt.Printf("replay on etcd (3 members): %d volumes on %d nodes settled in %s (%.0f us/volume)\n",
			n, n/10, r.settle.Round(time.Millisecond), float64(r.settle.Microseconds())/float64(n))
		metric(b, "replay_100k_etcd_settle_s", r.settle.Seconds(), "s")
	})
}

var replayEtcdOnce sync.Once

func boltStore(b *testing.B, dir string) (store.Store, store.Writer) {
	st, err := store.Open(filepath.Join(dir, "volumes.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st, st
}

type replayResult struct {
	settle time.Duration
	heap   int64
}

var (
	replayOnce               sync.Once
	replaySmall, replayLarge replayResult
)

func replay(b *testing.B, n, nodes int, open func(*testing.B, string) (store.Store, store.Writer)) replayResult {
	data := recorded(b, n*6, "ours", strconv.Itoa(nodes))
	dir := b.TempDir()
	st, w := open(b, dir)
	sock := filepath.Join(dir, "bus.ipc")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	release, finished := make(chan struct{}), make(chan struct{})
	defer close(finished)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		<-release
		_, _ = c.Write(data)
		<-finished
	}()
	// The live heap is measured with the stream loaded on both sides (and
	// the fake job cache built), so the difference is the store,
	// reconciler and listener.
	salt := newReplaySalt(b, data)
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	bus := &events.Bus{Network: "unix", Addr: sock, Want: events.Relevant, Lazy: true}
	// The recorded stream returns every volume's job at once, as if each
	// node ran its ten state runs side by side.
	rec := reconciler.New(st, salt, bus, reconciler.Options{Workers: 64, ConcurrentRuns: true}, nil)
	hub := store.NewHub()
	defer st.Watch(hub.Publish)()
	watch, stop := hub.Subscribe(n * 10)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); rec.Lead(ctx, w) }()
	// Created by 32 concurrent clients, as a burst of API calls would.
	var cw sync.WaitGroup
	for c := range 32 {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for i := c; i < n; i += 32 {
				s := &spec.Spec{Name: fmt.Sprintf("vol-%06d", i), UUID: fmt.Sprintf("3f2504e0-4f89-41d3-9a0c-%012d", i),
					Node: fmt.Sprintf("node-%05d", i%nodes), SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}
				if err := s.Validate(); err != nil {
					b.Error(err)
					return
				}
				if _, err := rec.Requests.Create(context.Background(), s); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	cw.Wait()
	if b.Failed() {
		b.FailNow()
	}
	pending := 0
	for pending < n {
		ev := <-watch
		if ev.Type == store.Modified && ev.Volume.Status.Phase == volume.Pending && ev.Volume.Status.JobID != "" && ev.Volume.Status.Step == "" {
			pending++
		}
	}
	start := time.Now()
	close(release)
	available := 0
	for available < n {
		ev := <-watch
		if ev.Volume.Status.Phase == volume.Available {
			available++
		}
	}
	settle := time.Since(start)
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	if st.Len() != n {
		b.Fatalf("store holds %d volumes, want %d", st.Len(), n)
	}
	cancel()
	wg.Wait()
	res := replayResult{settle: settle, heap: int64(m1.HeapAlloc) - int64(m0.HeapAlloc)}
	runtime.KeepAlive(data)
	runtime.KeepAlive(rec)
	return res
}
