package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/test/etcdcluster"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// smoke is make test's pass: every benchmark once at a tiny size, so that
// none rots unseen; the figures come from make bench.
var smoke = os.Getenv("SALT_VOLUMES_BENCH_SMOKE") == "1"

// sized picks the full size, or the tiny one in a smoke pass.
func sized(full, tiny int) int {
	if smoke {
		return tiny
	}
	return full
}

// replica is one salt-volumes serve process on the shared etcd store.
type replica struct {
	n      int
	cfg    string
	url    string
	token  string
	cmd    *exec.Cmd
	logf   *os.File
	bin    string
	client *client.Client
}

func startReplica(b *testing.B, r *replica) {
	b.Helper()
	f, err := os.OpenFile(r.cfg+".log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	r.logf = f
	r.cmd = exec.Command(r.bin, "serve", "--config", r.cfg)
	r.cmd.Stdout, r.cmd.Stderr = f, f
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for role(r) == "" {
		if time.Now().After(deadline) {
			b.Fatalf("replica %d not ready; log %s", r.n, f.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *replica) kill() {
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.logf.Close()
}

// role is the replica's /readyz body when it answers 200, else "".
func role(r *replica) string {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(r.url + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return strings.TrimSpace(string(body))
}

// startEtcd runs a three-member etcd cluster until the benchmark ends.
func startEtcd(b *testing.B) *etcdcluster.Cluster {
	repo, err := saltstack.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	ebin, err := etcdcluster.Binary(repo)
	if err != nil {
		b.Fatal(err)
	}
	ec, err := etcdcluster.Start(context.Background(), filepath.Join(b.TempDir(), "etcd"), ebin, 3)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ec.Stop)
	return ec
}

// BenchmarkHA measures the etcd backend with real Salt, a three-member
// etcd and two serve replicas:
//   - failover: kill -9 of the leader until the other replica is a ready
//     leader, repeated (the session TTL is the default 10 s);
//   - follower watch lag: the same change on the follower's watch stream
//     after the leader's;
//   - create -> Available through the etcd replicas over the same through
//     a bbolt-backed serve, same run, same minion.
func BenchmarkHA(b *testing.B) {
	needRoot(b)
	haOnce.Do(func() { measureHA(b) })
}

var haOnce sync.Once

func measureHA(b *testing.B) {
	s := saltstack.Start(b, binary, true)
	b.Cleanup(func() { testenv.Cleanup(s.StateDir, nil, b.Logf) })
	if out, code := s.SyncAll(s.MinionID); code != 0 {
		b.Fatalf("sync_all: %s", out)
	}
	ec := startEtcd(b)
	binDir := b.TempDir()
	if err := testenv.Build(binDir, "salt-volumes"); err != nil {
		b.Fatal(err)
	}
	creates := sized(20, 2)

	// Baseline: the same creates through a bbolt-backed serve.
	c, stop := controlPlaneAt(b, s, s.APIURL(), 0, true, "salt-api")
	var bolt []time.Duration
	var names []string
	for i := range creates {
		name := fmt.Sprintf("bolt-%d", i)
		_, took, _ := createAndWatch(b, c, s.MinionID, name)
		bolt = append(bolt, took)
		names = append(names, name)
	}
	deleteAll(b, c, names)
	stop()

	ttl := 10 * time.Second
	if smoke {
		ttl = 2 * time.Second
	}
	token := "bench-token-" + uuid.NewString()
	var reps []*replica
	for n := 1; n <= 2; n++ {
		l := freeAddr(b)
		r := &replica{n: n, cfg: filepath.Join(binDir, fmt.Sprintf("replica-%d.yaml", n)), url: "http://" + l, token: token, bin: filepath.Join(binDir, "salt-volumes")}
		text := fmt.Sprintf("listen: %s\ntoken: %s\netcd:\n  endpoints: [%s]\n  sessionTTL: %s\n  replicaID: replica-%d\nsalt:\n  url: %s\n  username: %s\n  password: %s\n  publish: salt-api\n  jobCache: %s\nevents:\n  socket: %s\n",
			l, token, strings.Join(ec.Endpoints, ", "), ttl, n, s.APIURL(), s.APIUser, s.APIPass,
			filepath.Join(s.Root, "var", "cache", "salt", "master", "jobs"), s.EventSocket())
		if err := os.WriteFile(r.cfg, []byte(text), 0o600); err != nil {
			b.Fatal(err)
		}
		r.client = &client.Client{URL: r.url, Token: token}
		startReplica(b, r)
		reps = append(reps, r)
		b.Cleanup(func() {
			if r.cmd.ProcessState == nil {
				_ = r.cmd.Process.Signal(syscall.SIGTERM)
				_ = r.cmd.Wait()
			}
		})
	}
	leader := func() (*replica, *replica) {
		deadline := time.Now().Add(ttl + 30*time.Second)
		for time.Now().Before(deadline) {
			for i, r := range reps {
				if role(r) == "ok: leader" {
					return r, reps[1-i]
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.Fatal("no leader")
		return nil, nil
	}
	lead, follower := leader()

	// Watch lag and create -> Available through the etcd replicas.
	lag := newLagRecorder(b, lead.client, follower.client)
	var viaEtcd []time.Duration
	names = nil
	for i := range creates {
		name := fmt.Sprintf("etcd-%d", i)
		_, took, _ := createAndWatch(b, lead.client, s.MinionID, name)
		viaEtcd = append(viaEtcd, took)
		names = append(names, name)
	}
	deleteAll(b, lead.client, names)
	lags := lag.stop()

	// Failover: kill -9 the leader, time until the other one leads and
	// is ready; bring the killed one back as a follower.
	var fails []time.Duration
	for range sized(10, 1) {
		lead, follower = leader()
		lead.kill()
		start := time.Now()
		for role(follower) != "ok: leader" {
			if time.Since(start) > ttl+30*time.Second {
				b.Fatalf("no failover within %s", ttl+30*time.Second)
			}
			time.Sleep(10 * time.Millisecond)
		}
		fails = append(fails, time.Since(start))
		startReplica(b, lead)
	}

	ratio := float64(percentile(viaEtcd, 0.5)) / float64(percentile(bolt, 0.5))
	fmt.Printf("HA (3 etcd members, 2 replicas, real Salt): create -> Available p50 %s via etcd, %s via bbolt (ratio %.2f, %d creates each); "+
		"follower watch lag over %d events p50 %s p99 %s; failover after kill -9 of the leader (session TTL %s), %d kills: p50 %s, max %s\n",
		percentile(viaEtcd, 0.5).Round(time.Millisecond), percentile(bolt, 0.5).Round(time.Millisecond), ratio, creates,
		len(lags), percentile(lags, 0.5).Round(10*time.Microsecond), percentile(lags, 0.99).Round(10*time.Microsecond),
		ttl, len(fails), percentile(fails, 0.5).Round(time.Millisecond), percentile(fails, 1).Round(time.Millisecond))
	metric(b, "etcd_create_to_available_ratio", ratio, "x")
	metric(b, "follower_watch_lag_ms_p99", float64(percentile(lags, 0.99).Microseconds())/1000, "ms")
	metric(b, "failover_s_p50", percentile(fails, 0.5).Seconds(), "s")
	metric(b, "failover_s_max", percentile(fails, 1).Seconds(), "s")
}

// lagRecorder notes when each change arrives on the leader's and on the
// follower's watch stream.
type lagRecorder struct {
	mu     sync.Mutex
	at     [2]map[string]time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newLagRecorder(b *testing.B, lead, follower *client.Client) *lagRecorder {
	ctx, cancel := context.WithCancel(context.Background())
	l := &lagRecorder{at: [2]map[string]time.Time{{}, {}}, cancel: cancel}
	for i, c := range []*client.Client{lead, follower} {
		synced := make(chan struct{})
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			_ = c.Watch(ctx, "", "", func(ev saltvolumes.Event) bool {
				if ev.Type == client.Synced {
					close(synced)
					return true
				}
				now := time.Now()
				st := ev.Volume.Status
				key := fmt.Sprintf("%s|%s|%s|%s|%s|%t", ev.Type, ev.Volume.Spec.Name, st.Phase, st.Step, st.JobID, ev.Volume.Deleting)
				l.mu.Lock()
				if _, ok := l.at[i][key]; !ok {
					l.at[i][key] = now
				}
				l.mu.Unlock()
				return true
			})
		}()
		select {
		case <-synced:
		case <-time.After(10 * time.Second):
			b.Fatal("watch stream did not sync")
		}
	}
	return l
}

// stop ends both streams and returns the follower's lag for every change
// both saw.
func (l *lagRecorder) stop() []time.Duration {
	time.Sleep(200 * time.Millisecond) // the last changes reach both
	l.cancel()
	l.wg.Wait()
	var out []time.Duration
	for key, t0 := range l.at[0] {
		if t1, ok := l.at[1][key]; ok {
			out = append(out, max(0, t1.Sub(t0)))
		}
	}
	if len(out) == 0 {
		out = append(out, 0)
	}
	return out
}

func freeAddr(b *testing.B) string {
	port, err := testenv.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}
