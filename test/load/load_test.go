// Package load runs salt-volumes serve under load against a fake salt-api
// and a fake event bus (make load; part of make bench): the real binary,
// its real store and HTTP server, with Salt replaced by a process that
// answers every job after a short delay.
package load

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

func env(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestLoad: 5,000 volumes in the store on 100 nodes, 500 idle watchers,
// 50 creates a second for 60 s. serve's peak RSS must stay under 300 MB
// and every create must end Available; p50 and p99 create latency are
// printed. Then the web UI's all-volumes view in Chromium, over them all.
func TestLoad(t *testing.T) {
	if os.Getenv("SALT_VOLUMES_LOAD") == "" {
		t.Skip("a 60 s load test: run it with make load (or make bench)")
	}
	seed, watchers := env("LOAD_VOLUMES", 5000), env("LOAD_WATCHERS", 500)
	rate, seconds := env("LOAD_RATE", 50), env("LOAD_SECONDS", 60)
	nodes := env("LOAD_NODES", 100)
	dir := t.TempDir()
	require.NoError(t, testenv.Build(dir, "salt-volumes"))

	storePath := filepath.Join(dir, "volumes.db")
	seedStore(t, storePath, seed, nodes)
	bus := newFakeBus(t, filepath.Join(dir, "bus.ipc"))
	salt := newFakeSalt(bus)
	api := httptest.NewServer(salt)
	t.Cleanup(api.Close)

	token := strings.ReplaceAll(uuid.NewString(), "-", "")
	port := freePort(t)
	cfg := fmt.Sprintf("listen: 127.0.0.1:%d\ntoken: %s\nstore: %s\nsalt:\n  url: %s\n  username: u\n  password: p\n  publish: salt-api\nevents:\n  source: bus\n  socket: %s\nlogLevel: warn\n",
		port, token, storePath, api.URL, bus.path)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o600))
	serve := exec.Command(filepath.Join(dir, "salt-volumes"), "serve", "--config", filepath.Join(dir, "config.yaml"))
	logf, _ := os.Create(filepath.Join(dir, "serve.log"))
	serve.Stdout, serve.Stderr = logf, logf
	require.NoError(t, serve.Start())
	t.Cleanup(func() { _ = serve.Process.Kill(); _ = serve.Wait() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 30*time.Second, 100*time.Millisecond)
	rssIdle := rssKB(t, serve.Process.Pid)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var synced sync.WaitGroup
	var dropped atomic.Int64
	for range watchers {
		synced.Add(1)
		go watch(ctx, base, token, &synced, &dropped)
	}
	synced.Wait()
	rssWatched := rssKB(t, serve.Process.Pid)

	var mu sync.Mutex
	var lat []time.Duration
	var failed []string
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	names := make([]string, 0, rate*seconds)
	for i := range rate * seconds {
		<-tick.C
		name := fmt.Sprintf("load-%05d", i)
		names = append(names, name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"name":%q,"node":"node-%d","sparseLoopDevice":{"size":"1Gi"}}`, name, i%nodes)
			start := time.Now()
			code := post(base+"/api/v1/volumes", token, body)
			d := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			lat = append(lat, d)
			if code != http.StatusCreated {
				failed = append(failed, fmt.Sprintf("%s: HTTP %d", name, code))
			}
		}()
	}
	tick.Stop()
	wg.Wait()
	require.Empty(t, failed, "every create is accepted")

	// Every create settles (the fake minion answers after 20 ms).
	var phases map[string]int
	require.Eventually(t, func() bool {
		phases = listPhases(t, base, token, names)
		return phases["Available"] == len(names)
	}, 2*time.Minute, time.Second, "phases: %v", phases)
	rssPeak := peakRSSKB(t, serve.Process.Pid)

	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	t.Logf("load: %d seeded volumes, %d watchers (%d dropped), %d creates at %d/s", seed, watchers, dropped.Load(), len(names), rate)
	t.Logf("create latency p50 %s p99 %s max %s", p(0.5), p(0.99), lat[len(lat)-1])
	t.Logf("serve RSS: idle %d MB, with watchers %d MB, peak %d MB; salt-api requests %d", rssIdle/1024, rssWatched/1024, rssPeak/1024, salt.requests.Load())
	fmt.Printf("metric load_create_p50_ms %.1f ms\nmetric load_create_p99_ms %.1f ms\nmetric load_rss_peak_mb %d MB\n",
		float64(p(0.5).Microseconds())/1000, float64(p(0.99).Microseconds())/1000, rssPeak/1024)
	assert.LessOrEqual(t, rssPeak/1024, int64(300), "peak RSS at most 300 MB")
	assert.Zero(t, dropped.Load(), "no idle watcher falls behind")

	t.Run("the all-volumes view", func(t *testing.T) {
		allVolumesView(t, base, token, seed, len(names), nodes)
	})
}

func seedStore(t *testing.T, path string, n, nodes int) {
	st, err := store.Open(path)
	require.NoError(t, err)
	defer st.Close()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			u := uuid.NewString()
			v := &volume.Volume{Spec: spec.Spec{Name: fmt.Sprintf("seed-%05d", i), UUID: u, Node: fmt.Sprintf("node-%d", i%nodes),
				Mode: spec.ModeFilesystem, FSType: spec.FSExt4, SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}},
				CreatedAt: time.Now().UTC(), Origin: "salt"}
			v.Status = volume.Status{Status: saltvolumes.Status{Phase: volume.Available, DeviceName: "loop1", DevicePath: "/dev/loop1", PersistentPath: "/dev/disk/by-uuid/" + u, Size: 1 << 30, UpdatedAt: time.Now().UTC()}}
			require.NoError(t, st.Create(context.Background(), v))
		}()
	}
	wg.Wait()
}

// watch holds one watch stream open, reading (and dropping) what comes.
func watch(ctx context.Context, base, token string, synced *sync.WaitGroup, dropped *atomic.Int64) {
	once := sync.OnceFunc(synced.Done)
	defer once()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/watch", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		dropped.Add(1)
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if sc.Text() == "event: SYNCED" {
			once()
		}
	}
	if ctx.Err() == nil {
		dropped.Add(1) // the server closed it: the watcher fell behind
	}
}

func post(url, token, body string) int {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func listPhases(t *testing.T, base, token string, names []string) map[string]int {
	req, _ := http.NewRequest("GET", base+"/api/v1/volumes", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		Items []struct {
			Spec   struct{ Name string }
			Status struct{ Phase string }
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	phases := map[string]int{}
	for _, it := range out.Items {
		if want[it.Spec.Name] {
			phases[it.Status.Phase]++
		}
	}
	return phases
}

func rssKB(t *testing.T, pid int) int64 { return procStatus(t, pid, "VmRSS:") }

func peakRSSKB(t *testing.T, pid int) int64 { return procStatus(t, pid, "VmHWM:") }

func procStatus(t *testing.T, pid int, key string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, key) {
			f := strings.Fields(line)
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	t.Fatalf("%s not in /proc/%d/status", key, pid)
	return 0
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// fakeBus is a master event socket: every connected reader gets every
// frame, in Salt's wire format.
type fakeBus struct {
	path  string
	mu    sync.Mutex
	conns []net.Conn
}

func newFakeBus(t *testing.T, path string) *fakeBus {
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	b := &fakeBus{path: path}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
		}
	}()
	return b
}

func (b *fakeBus) fire(tag string, data map[string]any) {
	body, _ := msgpack.Marshal(data)
	frame, _ := msgpack.Marshal(map[string]any{"head": map[string]any{}, "body": append([]byte(tag+"\n\n"), body...)})
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_, _ = c.Write(frame)
	}
}

// fakeSalt answers salt-api: logins, local_async (the job "runs" for 20 ms,
// then its return is stored and fired on the bus, as the master does) and
// jobs.list_job from what it stored.
type fakeSalt struct {
	bus      *fakeBus
	mu       sync.Mutex
	n        int
	jobs     map[string]map[string]any // jid -> node -> {return, retcode}
	requests atomic.Int64
}

func newFakeSalt(bus *fakeBus) *fakeSalt {
	return &fakeSalt{bus: bus, jobs: map[string]map[string]any{}}
}

func (f *fakeSalt) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/login" {
		fmt.Fprintf(w, `{"return":[{"token":"t","expire":%d}]}`, time.Now().Add(time.Hour).Unix())
		return
	}
	var low []map[string]any
	if err := json.NewDecoder(r.Body).Decode(&low); err != nil || len(low) == 0 {
		http.Error(w, "bad lowstate", http.StatusBadRequest)
		return
	}
	l := low[0]
	switch {
	case l["client"] == "local_async":
		node := l["tgt"].([]any)[0].(string)
		vols, err := runVolumes(l)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.n++
		jid := fmt.Sprintf("2026112300%010d", f.n)
		f.mu.Unlock()
		fmt.Fprintf(w, `{"return":[{"jid":%q,"minions":[%q]}]}`, jid, node)
		go f.finish(jid, node, vols)
	case l["fun"] == "jobs.list_job":
		jid := l["jid"].(string)
		f.mu.Lock()
		res := f.jobs[jid]
		f.mu.Unlock()
		if res == nil {
			fmt.Fprint(w, `{"return":[{"Function":"salt_volumes.apply_volume","Result":{}}]}`)
			return
		}
		b, _ := json.Marshal(map[string]any{"return": []any{map[string]any{"Function": "salt_volumes.apply_volume", "Result": res}}})
		w.Write(b)
	case l["fun"] == "manage.up":
		fmt.Fprint(w, `{"return":[["node-0"]]}`)
	default:
		fmt.Fprint(w, `{"return":[{}]}`)
	}
}

// runVolumes reads the volumes a state run is for, as serve passes them
// to salt_volumes.apply_volume: [action, [spec...], wipe].
func runVolumes(l map[string]any) ([]map[string]any, error) {
	if l["fun"] != "salt_volumes.apply_volume" {
		return nil, fmt.Errorf("fun %v: serve runs its formulas through salt_volumes.apply_volume", l["fun"])
	}
	arg, _ := l["arg"].([]any)
	if len(arg) != 3 {
		return nil, fmt.Errorf("arg %v: want [action, specs, wipe]", arg)
	}
	specs, _ := arg[1].([]any)
	if len(specs) == 0 {
		return nil, fmt.Errorf("arg %v: no volume specs", arg)
	}
	var out []map[string]any
	for _, v := range specs {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("arg: %T is not a spec", v)
		}
		out = append(out, m)
	}
	return out, nil
}

func (f *fakeSalt) finish(jid, node string, vols []map[string]any) {
	time.Sleep(20 * time.Millisecond)
	ret := map[string]any{}
	for i, vol := range vols {
		name, u := vol["name"].(string), vol["uuid"].(string)
		ret["salt_volumes_|-salt_volumes "+name+"_|-"+name+"_|-prepared"] = map[string]any{
			"result": true, "comment": "prepared", "__run_num__": i, "changes": map[string]any{},
			"volume": map[string]any{"name": name, "uuid": u, "devicePath": fmt.Sprintf("/dev/loop%d", 7+i), "deviceName": fmt.Sprintf("loop%d", 7+i),
				"persistentPath": "/dev/disk/by-uuid/" + u, "size": 1 << 30, "inUse": false}}
	}
	f.mu.Lock()
	f.jobs[jid] = map[string]any{node: map[string]any{"return": ret, "retcode": 0}}
	f.mu.Unlock()
	f.bus.fire("salt/job/"+jid+"/ret/"+node, map[string]any{"fun": "salt_volumes.apply_volume", "jid": jid, "id": node,
		"retcode": 0, "success": true, "return": ret, "cmd": "_return"})
}
