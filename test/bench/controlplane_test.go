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

func venvPython(b *testing.B) (string, string) {
	repo, err := saltstack.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	py := filepath.Join(repo, ".venv", "bin", "python")
	if _, err := os.Stat(py); err != nil {
		b.Skip("Salt is not installed in .venv: run make setup")
	}
	return py, filepath.Join(repo, "test", "bench", "eventstream.py")
}

// recorded writes n events with Salt's own packer (eventstream.py); mix is
// ours, returns or mixed.
func recorded(b *testing.B, n int, mix ...string) []byte {
	py, script := venvPython(b)
	path := filepath.Join(b.TempDir(), "stream.bin")
	args := append([]string{script, "write", strconv.Itoa(n), path}, mix...)
	if out, err := exec.Command(py, args...).CombinedOutput(); err != nil {
		b.Fatalf("writing the stream: %v: %s", err, out)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkDecodeThroughput decodes recorded streams the way serve reads
// the bus (tag first, only our events decoded) and with Salt's own
// subscriber code (PubClient's Unpacker plus SaltEvent.unpack, which
// decodes every event), and prints events per second for both: a busy
// master's mix (about 90 % of it not ours) and job returns only.
func BenchmarkDecodeThroughput(b *testing.B) {
	n := sized(60000, 2000)
	py, script := venvPython(b)
	for _, mix := range []string{"mixed", "returns"} {
		data := recorded(b, n, mix)
		path := filepath.Join(b.TempDir(), mix+".bin")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			b.Fatal(err)
		}
		var goSecs, pySecs []float64
		var allocs uint64
		var ignored, decoded int
		for range sized(5, 1) {
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
			goSecs = append(goSecs, time.Since(start).Seconds())
			runtime.ReadMemStats(&m1)
			allocs = m1.Mallocs - m0.Mallocs
			if got+dec.Ignored != n || dec.Skipped != 0 {
				b.Fatalf("%s: decoded %d + ignored %d of %d (skipped %d)", mix, got, dec.Ignored, n, dec.Skipped)
			}
			ignored, decoded = dec.Ignored, got
			out, err := exec.Command(py, script, "read", path).Output()
			if err != nil {
				b.Fatal(err)
			}
			f := strings.Fields(string(out))
			if len(f) != 2 || f[0] != strconv.Itoa(n) {
				b.Fatalf("python decoded %q", out)
			}
			sec, _ := strconv.ParseFloat(f[1], 64)
			pySecs = append(pySecs, sec)
		}
		g, p := medianF(goSecs), medianF(pySecs)
		b.ReportMetric(float64(n)/g, mix+"-events/s")
		b.ReportMetric(float64(n)/p, mix+"-python-events/s")
		fmt.Printf("decode %s: %d events (%.1f MB, recorded with Salt's packer; %d ours decoded, %d passed over): ours %.0f events/s, Salt's Python subscriber %.0f events/s: %.1fx; %d allocations in all (%.1f per decoded event)\n",
			mix, n, float64(len(data))/1e6, decoded, ignored, float64(n)/g, float64(n)/p, p/g, allocs, float64(allocs)/float64(max(decoded, 1)))
		name := "decode_ratio_mixed"
		if mix == "returns" {
			name = "decode_ratio_returns"
		}
		metric(b, name, p/g, "x")
	}
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

func (replaySalt) LocalAsync(_ context.Context, tgt, _ string, _ []any, kwarg map[string]any) (saltapi.Job, error) {
	v := kwarg["pillar"].(map[string]any)["salt_volumes"].(map[string]any)["volume"].(spec.Spec)
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
	watch, stop := rec.Hub.Subscribe(n * 10)
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
				if _, err := rec.Create(s); err != nil {
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
		if ev.Type == reconciler.Modified && ev.Volume.Status.Phase == volume.Pending && ev.Volume.Status.JobID != "" && ev.Volume.Status.Step == "" {
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
