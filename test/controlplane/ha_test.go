package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/volume"
	"github.com/salt-volumes/salt-volumes/test/etcdcluster"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// haTTL is the leader's session TTL in these tests: short, so that the
// failovers the test waits for stay short.
const haTTL = 3 * time.Second

// startEtcd runs a three-member etcd cluster for the test.
func startEtcd(t *testing.T) *etcdcluster.Cluster {
	t.Helper()
	ebin, err := etcdcluster.Binary("../..")
	require.NoError(t, err, "etcd is built by make setup (scripts/kube-tools.sh)")
	dir, err := os.MkdirTemp("", "sv-etcd")
	require.NoError(t, err)
	ec, err := etcdcluster.Start(context.Background(), dir, ebin, 3)
	require.NoError(t, err)
	t.Cleanup(func() {
		ec.Stop()
		if t.Failed() {
			for i := range 3 {
				b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("m%d.log", i)))
				t.Logf("--- etcd m%d log (tail)\n%s", i, serveproc.Tail(string(b), 2000))
			}
		}
		os.RemoveAll(dir)
	})
	return ec
}

// newReplica is one serve replica on the shared etcd store.
func newReplica(t *testing.T, s *saltstack.Stack, ec *etcdcluster.Cluster, n int) *plane {
	p := newPlane(t, s)
	p.Config = filepath.Join(s.Root, fmt.Sprintf("replica-%d.yaml", n))
	p.Log = fmt.Sprintf("replica-%d", n)
	p.StoreConfig = fmt.Sprintf("etcd:\n  endpoints: [%s]\n  prefix: /sv-test\n  sessionTTL: %s\n  requestTimeout: 2s\n  replicaID: replica-%d\n",
		strings.Join(ec.Endpoints, ", "), haTTL, n)
	return p
}

// role reads a replica's /readyz body ("" when it does not answer).
func role(p *plane) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(p.URL + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// leaderOf waits until exactly one of the replicas leads and returns it.
func leaderOf(t *testing.T, limit time.Duration, ps ...*plane) (*plane, time.Duration) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		var leaders []*plane
		for _, p := range ps {
			if role(p) == "ok: leader" {
				leaders = append(leaders, p)
			}
		}
		if len(leaders) == 1 {
			return leaders[0], time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no single leader among the replicas within %s", limit)
	return nil, 0
}

func TestHighAvailability(t *testing.T) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	ec := startEtcd(t)
	r1, r2 := newReplica(t, s, ec, 1), newReplica(t, s, ec, 2)
	r2.Token = r1.Token // every replica takes the same API token
	r1.Start("")
	r2.Start("")
	replicas := []*plane{r1, r2}
	other := func(p *plane) *plane {
		if p == r1 {
			return r2
		}
		return r1
	}
	ctx := context.Background()
	create := func(t *testing.T, p *plane, name string) string {
		t.Helper()
		v, err := p.Client().Create(ctx, map[string]any{"name": name, "node": "node-1", "sparseLoopDevice": map[string]any{"size": "16Mi"}})
		require.NoError(t, err)
		uuids = append(uuids, v.Spec.UUID)
		return v.Spec.UUID
	}

	// createUntilJob creates a volume through p and waits until its state
	// run has started (Pending with a job id on p's watch stream).
	createUntilJob := func(t *testing.T, p *plane, name string) (*watcher, string) {
		w := p.Watch(name)
		create(t, p, name)
		evs := w.Until(t, time.Minute, func(ev saltvolumes.Event) bool {
			return ev.Volume.Status.Phase == volume.Pending && ev.Volume.Status.JobID != ""
		})
		return w, evs[len(evs)-1].Volume.Status.JobID
	}

	t.Run("a create through a follower reaches Available, and the follower's watch sees every step", func(t *testing.T) {
		lead, _ := leaderOf(t, 30*time.Second, replicas...)
		follower := other(lead)
		assert.Contains(t, role(follower), "ok: follower of replica-", "the follower's /readyz names the leader")
		out, errs, code := follower.CLI("status")
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "ok: follower of replica-", "salt-volumes status names the role")
		assert.Equal(t, 1.0, lead.Metric("salt_volumes_leader"))
		assert.Equal(t, 0.0, follower.Metric("salt_volumes_leader"))
		w := follower.Watch("ha-1")
		create(t, follower, "ha-1")
		evs := w.Until(t, 2*time.Minute, phaseIs("Available"))
		assert.Equal(t, "ADDED", evs[0].Type)
		var pending bool
		for _, ev := range evs {
			pending = pending || ev.Volume.Status.Phase == volume.Pending
		}
		assert.True(t, pending, "the follower saw the leader's Pending: %s", summary(evs))
		// Replicas are not linearizable with each other: the follower's watch
		// can carry the leader's write a moment before the leader has taken
		// etcd's answer to that write into its own cache (CI saw Pending
		// here once). Each replica converges; none goes backwards.
		var v saltvolumes.View
		require.Eventually(t, func() bool {
			got, err := lead.Client().Get(ctx, "ha-1")
			v = got
			return err == nil && got.Status.Phase == volume.Available
		}, 10*time.Second, 10*time.Millisecond, "the leader answers Available too")
		assert.EqualValues(t, 0, follower.Metric("salt_volumes_jobs_launched_total"), "only the leader runs jobs")
		// Job step logs live in the leader's memory: a follower asks it.
		status, body, err := follower.Fetch("/api/v1/volumes/ha-1/jobs")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, string(body))
		assert.Contains(t, string(body), v.Status.JobID, "the follower relays the leader's job log")
	})

	t.Run("a token made through one replica works on both; revoked through the other, both refuse it at once", func(t *testing.T) {
		out, errs, code := r1.CLI("token", "create", "ha-viewer", "--role", "viewer", "--expires", "1d")
		require.Equal(t, 0, code, errs)
		tok := strings.TrimSpace(out)
		require.True(t, strings.HasPrefix(tok, "svt_"), out)
		assert.Contains(t, errs, "shown this once")
		for _, p := range replicas {
			out, errs, code = p.CLIAs(tok, "ls")
			require.Equal(t, 0, code, errs)
			assert.Contains(t, out, "ha-1")
		}
		_, errs, code = r2.CLIAs(tok, "rm", "ha-1")
		assert.Equal(t, 6, code, "exit 6: not allowed")
		assert.Contains(t, errs, "token:ha-viewer (role viewer) may not DELETE /api/v1/volumes/ha-1: it needs role operator")
		_, errs, code = r2.CLI("token", "revoke", "ha-viewer")
		require.Equal(t, 0, code, errs)
		for _, p := range replicas {
			_, errs, code = p.CLIAs(tok, "ls")
			assert.Equal(t, 6, code, "revoked: refused by %s at once", p.URL)
			assert.Contains(t, errs, "revoked")
		}
		out, errs, code = r1.CLI("audit", "--user", "token:ha-viewer", "-o", "json")
		require.Equal(t, 0, code, errs)
		var trail struct{ Items []map[string]any }
		require.NoError(t, json.Unmarshal([]byte(out), &trail))
		entries := trail.Items
		require.Len(t, entries, 1, "the refused delete, written by the other replica: %s", out)
		assert.Equal(t, "refused", entries[0]["decision"])
		assert.Equal(t, "ha-1", entries[0]["volume"])
		assert.Equal(t, "node-1", entries[0]["node"])
		out, errs, code = r2.CLI("audit", "--user", "bootstrap")
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "POST /api/v1/tokens", "who made the token")
		assert.Contains(t, out, "DELETE /api/v1/tokens/ha-viewer")
	})

	t.Run("a snapshot asked through a follower is taken by the leader; deleted through the other replica", func(t *testing.T) {
		lead, _ := leaderOf(t, 30*time.Second, replicas...)
		follower := other(lead)
		out, errs, code := follower.CLI("snapshot", "create", "ha-1", "ha-snap", "--wait", "-o", "json")
		require.Equal(t, 0, code, errs)
		var snap saltvolumes.Snapshot
		require.NoError(t, json.Unmarshal([]byte(out), &snap), out)
		assert.Equal(t, "Ready", snap.Phase)
		assert.NotEmpty(t, snap.JobID)
		assert.EqualValues(t, 0, follower.Metric("salt_volumes_snapshots_taken_total"), "only the leader runs snapshot jobs")
		assert.EqualValues(t, 1, lead.Metric("salt_volumes_snapshots_taken_total"))
		got, err := lead.Client().Snapshot(ctx, "ha-snap")
		require.NoError(t, err, "the record is in etcd, read by both")
		assert.Equal(t, snap.JobID, got.JobID)
		_, errs, code = lead.CLI("snapshot", "rm", "ha-snap", "--wait")
		require.Equal(t, 0, code, errs)
		items, err := follower.Client().Snapshots(ctx, "")
		require.NoError(t, err)
		assert.Empty(t, items)
	})

	t.Run("the leader killed while a prepare runs: another leads, the job it started settles the volume", func(t *testing.T) {
		lead, _ := leaderOf(t, 30*time.Second, replicas...)
		follower := other(lead)
		w, jid := createUntilJob(t, follower, "ha-kill")
		lead.Kill()
		killed := time.Now()
		next, _ := leaderOf(t, haTTL+5*time.Second, follower)
		took := time.Since(killed)
		t.Logf("failover after kill -9: %s (session TTL %s)", took.Round(time.Millisecond), haTTL)
		assert.LessOrEqual(t, took, haTTL+5*time.Second)
		evs := w.Until(t, 2*time.Minute, phaseIs("Available"))
		final := evs[len(evs)-1].Volume
		assert.Equal(t, jid, final.Status.JobID, "the job the killed leader started settled it: looked up by jid, not run again")
		assert.EqualValues(t, 0, next.Metric("salt_volumes_jobs_relaunched_total"))
		lead.Start("") // back, as a follower
		assert.Contains(t, role(lead), "follower")
		list, err := next.Client().List(ctx, "")
		require.NoError(t, err)
		n := 0
		for _, v := range list {
			if v.Spec.Name == "ha-kill" {
				n++
			}
		}
		assert.Equal(t, 1, n, "nothing duplicated")
	})

	t.Run("a leader paused mid-job is replaced, and after it resumes it writes nothing", func(t *testing.T) {
		lead, _ := leaderOf(t, 30*time.Second, replicas...)
		follower := other(lead)
		// Paused while its job runs: the job's return reaches its bus
		// socket while it sleeps, so it has something to write on waking.
		w, jid := createUntilJob(t, follower, "ha-pause")
		require.NoError(t, lead.Cmd.Process.Signal(syscall.SIGSTOP))
		resumed := false
		defer func() {
			if !resumed {
				_ = lead.Cmd.Process.Signal(syscall.SIGCONT)
			}
		}()
		paused := time.Now()
		leaderOf(t, haTTL+5*time.Second, follower)
		t.Logf("failover after SIGSTOP: %s", time.Since(paused).Round(time.Millisecond))
		evs := w.Until(t, 2*time.Minute, phaseIs("Available"))
		assert.Equal(t, jid, evs[len(evs)-1].Volume.Status.JobID, "the new leader settled the paused one's job")
		cli, err := ec.Client()
		require.NoError(t, err)
		defer cli.Close()
		before, err := cli.Get(ctx, "/sv-test/volumes/", clientv3.WithPrefix())
		require.NoError(t, err)
		require.NoError(t, lead.Cmd.Process.Signal(syscall.SIGCONT))
		resumed = true
		require.Eventually(t, func() bool { return strings.HasPrefix(role(lead), "ok: follower") }, 20*time.Second, 50*time.Millisecond,
			"the resumed replica serves as a follower")
		time.Sleep(2 * time.Second) // whatever it had queued has run by now
		after, err := cli.Get(ctx, "/sv-test/volumes/", clientv3.WithPrefix())
		require.NoError(t, err)
		revs := func(r *clientv3.GetResponse) map[string]int64 {
			m := map[string]int64{}
			for _, kv := range r.Kvs {
				m[string(kv.Key)] = kv.ModRevision
			}
			return m
		}
		assert.Equal(t, revs(before), revs(after), "no key was written after the paused leader resumed")
		assert.Equal(t, 0.0, lead.Metric("salt_volumes_leader"))
	})

	t.Run("one etcd member lost: everything goes on", func(t *testing.T) {
		ec.KillMember(0)
		defer func() { require.NoError(t, ec.StartMember(0)) }()
		lead, _ := leaderOf(t, 30*time.Second, replicas...)
		w := other(lead).Watch("ha-member")
		create(t, other(lead), "ha-member")
		w.Until(t, 2*time.Minute, phaseIs("Available"))
	})

	t.Run("quorum lost: writes answer 503 naming etcd, reads go on; back with quorum", func(t *testing.T) {
		require.NoError(t, ec.WaitHealthy(ctx, time.Minute))
		before, err := r1.Client().List(ctx, "")
		require.NoError(t, err)
		ec.KillMember(1)
		ec.KillMember(2)
		_, err = r1.Client().Create(ctx, map[string]any{"name": "ha-noquorum", "node": "node-1", "sparseLoopDevice": map[string]any{"size": "16Mi"}})
		var ae *client.Error
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, http.StatusServiceUnavailable, ae.Status)
		assert.Equal(t, saltvolumes.CodeUnavailable, ae.Body.Code)
		assert.Contains(t, err.Error(), "etcd")
		for _, p := range replicas {
			list, err := p.Client().List(ctx, "")
			require.NoError(t, err, "reads go on from the cache")
			assert.Len(t, list, len(before))
		}
		require.NoError(t, ec.StartMember(1))
		require.NoError(t, ec.StartMember(2))
		require.NoError(t, ec.WaitHealthy(ctx, time.Minute))
		var lead *plane
		require.Eventually(t, func() bool {
			for _, p := range replicas {
				if role(p) == "ok: leader" {
					lead = p
					return true
				}
			}
			return false
		}, 30*time.Second, 100*time.Millisecond)
		w := other(lead).Watch("ha-back")
		create(t, other(lead), "ha-back")
		w.Until(t, 2*time.Minute, phaseIs("Available"))
		_, err = lead.Client().Get(ctx, "ha-noquorum")
		assert.Error(t, err, "the refused create left nothing")
	})

	t.Run("every volume is removed through either replica", func(t *testing.T) {
		lead, _ := leaderOf(t, 30*time.Second, replicas...)
		list, err := lead.Client().List(ctx, "")
		require.NoError(t, err)
		for i, v := range list {
			_, err := replicas[i%2].Client().Delete(ctx, v.Spec.Name, false)
			require.NoError(t, err, v.Spec.Name)
		}
		require.Eventually(t, func() bool {
			l, err := other(lead).Client().List(ctx, "")
			return err == nil && len(l) == 0
		}, 2*time.Minute, 200*time.Millisecond)
	})

	t.Run("each replica's stderr is one format, the etcd client's lines included", func(t *testing.T) {
		for _, r := range replicas {
			c := r.OneLogFormat(t)
			t.Logf("%s logged by component: %v", r.Log, c)
			assert.NotZero(t, c["election"], "the election logged nothing: %v", c)
		}
	})
}
