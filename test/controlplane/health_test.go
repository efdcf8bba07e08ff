package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// Short beacon timings: the defaults (10 s, 5 min) scaled down so that the
// test sees several heartbeats.
const (
	beaconInterval  = 1 * time.Second
	beaconHeartbeat = 5 * time.Second
	// The overcommit ratio of the test minion: small, so that a refusal
	// needs no large file on any disk.
	testRatio = 0.001
)

// TestNodeHealth runs the salt_volumes beacon on a real minion: the node
// pushes health, usage and capacity, and the control plane moves volumes
// by it without running any state.
func TestNodeHealth(t *testing.T) {
	saltstack.Need(t)
	s := saltstack.StartOpts(t, bin("salt-volume-exec"), saltstack.Options{
		API: true,
		SaltVolumes: fmt.Sprintf("overcommit_ratio: %g\nbeacon_interval: %d\nbeacon_heartbeat: %d",
			testRatio, int(beaconInterval.Seconds()), int(beaconHeartbeat.Seconds())),
	})
	// The formula's own state turns the beacon on, as salt_volumes.installed
	// does for operators.
	out, code := s.Salt("node-1", "state.apply", "salt_volumes.beacon", "--out=json")
	require.Equal(t, 0, code, out)
	out, code = s.Salt("node-1", "beacons.list", "return_yaml=False", "--out=json")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"heartbeat": 5`, "the beacon is configured")
	p := newPlane(t, s)
	p.Start("")
	ctx := context.Background()
	deadline := beaconInterval + 5*time.Second

	var errs string
	out, errs, code = p.CLI("create", "hv1", "--node", "node-1", "--size", "64Mi", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, "create: %s %s", out, errs)
	var vol saltvolumes.View
	t.Cleanup(func() {
		// Whatever state the test left it in, the volume goes.
		_, _ = s.Salt("node-1", "salt_volumes.restore")
		_, _, _ = p.CLI("rm", "hv1", "--wait", "--timeout", "1m")
	})

	t.Run("usage and capacity reach the API, CLI and metrics", func(t *testing.T) {
		waitFor(t, deadline, "hv1's usage in the API", func() bool {
			v, err := p.Client().Get(ctx, "hv1")
			require.NoError(t, err)
			vol = v
			return v.Usage != nil && v.Usage.State == "prepared"
		})
		require.Greater(t, vol.Usage.Allocated, int64(0), "a formatted sparse file takes some room")
		require.Less(t, vol.Usage.Allocated, int64(64<<20), "but far less than its size")

		out, errs, code := p.CLI("nodes", "-o", "json")
		require.Equal(t, 0, code, errs)
		var nodes struct{ Items []saltvolumes.Node }
		require.NoError(t, json.Unmarshal([]byte(out), &nodes))
		require.Len(t, nodes.Items, 1)
		n := nodes.Items[0]
		require.NotNil(t, n.Capacity, out)
		require.Equal(t, int64(64<<20), n.Capacity.Committed, "committed is the sum of sparse sizes")
		require.Greater(t, n.Capacity.Free, int64(0))
		require.Greater(t, n.Capacity.Size, n.Capacity.Free)
		require.Equal(t, testRatio, n.Capacity.OvercommitRatio)
		require.False(t, n.Health.Silent)

		got, _, code := p.CLI("get", "hv1")
		require.Equal(t, 0, code)
		require.Contains(t, got, "on the node: prepared, allocated ")

		table, _, code := p.CLI("nodes")
		require.Equal(t, 0, code)
		require.Contains(t, table, "COMMITTED")
		require.Contains(t, table, "64.0MiB")

		require.Equal(t, float64(vol.Usage.Allocated),
			p.Metric(`salt_volumes_volume_allocated_bytes{volume="hv1",node="node-1"}`))
		require.Equal(t, float64(64<<20), p.Metric(`salt_volumes_node_committed_bytes{node="node-1"}`))
		require.Equal(t, 1.0, p.Metric(`salt_volumes_volume_healthy{volume="hv1",node="node-1"}`))
	})

	t.Run("a forged report changes nothing", func(t *testing.T) {
		// Salt's batched form puts any data on the bus under any tag,
		// envelope included: the report is only a hint, and the node's own
		// salt_volumes.status, read from the job cache, says prepared.
		forged := map[string]any{"cmd": "_minion_event", "id": "node-1", "data": map[string]any{
			"kind": "change", "interval": 1, "heartbeat": 5,
			"volumes":  []any{map[string]any{"name": "hv1", "uuid": vol.Spec.UUID, "state": "detached", "size": 64 << 20}},
			"capacity": map[string]any{"path": "/forged", "size": 1, "free": 1, "committed": 1, "overcommitRatio": 1}}}
		pre, _ := json.Marshal(map[string]any{"events": []any{map[string]any{"tag": "salt-volumes/node/node-1/health", "data": forged}}})
		before := p.Metric("salt_volumes_node_reports_total")
		out, code := s.Salt("node-1", "event.fire_master", "{}", "salt-volumes/carrier", "preload="+string(pre), "--out=json")
		require.Equal(t, 0, code, out)
		// The forged hint, then the confirmed status: what the node
		// says again (under load another report can come between the
		// two, so the count alone does not say the confirmation landed).
		var v saltvolumes.View
		waitFor(t, deadline, "the confirmation", func() bool {
			var err error
			v, err = p.Client().Get(ctx, "hv1")
			require.NoError(t, err)
			return p.Metric("salt_volumes_node_reports_total") >= before+2 && v.Usage != nil && v.Usage.State == "prepared"
		})
		require.Equal(t, "Available", v.Status.Phase.String(), "never failed by the forged report")
	})

	t.Run("a minion's flood of made-up volumes and nodes leaves serve's memory flat", func(t *testing.T) {
		// node-1's own key, as a compromised minion would use it: reports
		// listing volumes that do not exist, some over the cap, and
		// reports under made-up node names (Salt's batched form carries
		// any envelope). A salt argument stays under 128 KiB, hence the
		// sizes.
		fakes := func(round, n int) []any {
			out := make([]any, n)
			for i := range out {
				out[i] = map[string]any{"uuid": fmt.Sprintf("f100d000-%04d-4000-8000-%012d", round, i), "state": "prepared", "allocated": i}
			}
			return out
		}
		report := func(node string, vols []any) map[string]any {
			return map[string]any{"cmd": "_minion_event", "id": node, "data": map[string]any{
				"kind": "change", "interval": 1, "heartbeat": 5, "volumes": vols,
				"capacity": map[string]any{"path": "/flood", "size": 1, "free": 1, "committed": 1, "overcommitRatio": 1}}}
		}
		send := func(events ...map[string]any) {
			var batch []any
			for _, ev := range events {
				node := ev["id"].(string)
				batch = append(batch, map[string]any{"tag": "salt-volumes/node/" + node + "/health", "data": ev})
			}
			pre, _ := json.Marshal(map[string]any{"events": batch})
			out, code := s.Salt("node-1", "event.fire_master", "{}", "salt-volumes/carrier", "preload="+string(pre), "--out=json")
			require.Equal(t, 0, code, out)
		}
		rss := func() int64 {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
			require.NoError(t, err)
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
					kb, _ := strconv.ParseInt(f[1], 10, 64)
					return kb << 10
				}
			}
			t.Fatal("no VmRSS")
			return 0
		}
		const rounds = 5
		before := rss()
		tooMany := p.Metric(`salt_volumes_node_reports_refused_total{reason="too_many_volumes"}`)
		unknown := p.Metric(`salt_volumes_node_reports_refused_total{reason="unknown_node"}`)
		for r := range rounds {
			send(report("node-1", fakes(r, 1000)), report(fmt.Sprintf("made-up-%d", r), fakes(r, 10)))
			send(report("node-1", fakes(r, 1100)))
		}
		waitFor(t, 30*time.Second, "every flood report counted", func() bool {
			return p.Metric(`salt_volumes_node_reports_refused_total{reason="too_many_volumes"}`) >= tooMany+rounds &&
				p.Metric(`salt_volumes_node_reports_refused_total{reason="unknown_node"}`) >= unknown+rounds
		})
		after := rss()
		t.Logf("serve's RSS %.1f MB before %d rounds of made-up reports (1,000 and 1,100 volumes under node-1, 10 under a made-up node each round), %.1f MB after",
			float64(before)/1e6, rounds, float64(after)/1e6)
		assert.Less(t, after-before, int64(20<<20), "RSS grew by %.1f MB", float64(after-before)/1e6)

		out, errs, code := p.CLI("nodes", "-o", "json")
		require.Equal(t, 0, code, errs)
		assert.NotContains(t, out, "made-up", "no made-up node is shown")
		_, metricsText, err := p.Fetch("/metrics")
		require.NoError(t, err)
		assert.NotContains(t, string(metricsText), "made-up", "no metric series for a made-up node")
		assert.NotContains(t, string(metricsText), "f100d000", "no metric series for a made-up volume")

		// A restart loads the history of the stored volume only.
		p.Stop()
		hist, err := os.ReadFile(filepath.Join(filepath.Dir(p.Store), "history.json"))
		require.NoError(t, err)
		assert.NotContains(t, string(hist), "f100d000", "no history of a made-up volume is saved")
		t.Logf("history.json after the flood: %d bytes", len(hist))
		p.Start("")
		v, err := p.Client().Get(ctx, "hv1")
		require.NoError(t, err)
		require.Equal(t, "Available", v.Status.Phase.String())
	})

	t.Run("an idle node fires no more than its heartbeats", func(t *testing.T) {
		// Ten minutes of idle at the default 5 min heartbeat is 2 events;
		// scaled to a 5 s heartbeat, 20 s of idle is 4 (5 with the edge):
		// a beacon that fired on every 1 s run would send 20.
		const idle = 20 * time.Second
		l := s.Listen()
		evs, _ := l.Collect(idle, func(saltstack.Event) bool { return false })
		var health []string
		for _, ev := range evs {
			if ev.Tag == "salt-volumes/node/node-1/health" {
				inner, _ := ev.Data["data"].(map[string]any)
				health = append(health, fmt.Sprint(inner["kind"]))
			}
		}
		t.Logf("health events in %s of idle (heartbeat %s, interval %s): %d %v", idle, beaconHeartbeat, beaconInterval, len(health), health)
		require.LessOrEqual(t, len(health), int(idle/beaconHeartbeat)+1, "more events than heartbeats: %v", health)
		// Each heartbeat waits for the next beacon run past it, so a few
		// seconds drift per period: fewer than half means they stopped.
		require.GreaterOrEqual(t, len(health), int(idle/beaconHeartbeat)/2, "heartbeats missing: %v", health)
		for _, k := range health {
			require.Equal(t, "heartbeat", k)
		}
	})

	t.Run("loop device detached out of band fails the volume, restore brings it back", func(t *testing.T) {
		w := p.Watch("hv1")
		start := time.Now()
		out, err := exec.Command("losetup", "-d", vol.Status.DevicePath).CombinedOutput()
		require.NoError(t, err, string(out))
		evs := w.Until(t, deadline, phaseIs("Failed"))
		last := evs[len(evs)-1].Volume
		t.Logf("detached -> Failed in %s", time.Since(start).Round(time.Millisecond))
		require.Equal(t, "Detached", last.Status.Reason)
		require.Contains(t, last.Status.Message, "salt node-1 salt_volumes.restore")

		restoredBefore := p.Metric(`salt_volumes_restores_total{result="reconstructed"}`)
		out2, code := s.Salt("node-1", "salt_volumes.restore", "--out=json")
		require.Equal(t, 0, code, out2)
		evs = w.Until(t, deadline, phaseIs("Available"))
		last = evs[len(evs)-1].Volume
		require.Empty(t, last.Status.Reason)
		require.FileExists(t, last.Status.PersistentPath)
		waitFor(t, deadline, "the restore counted", func() bool {
			return p.Metric(`salt_volumes_restores_total{result="reconstructed"}`) >= restoredBefore+1
		})
		v, err := p.Client().Get(ctx, "hv1")
		require.NoError(t, err)
		vol = v
	})

	t.Run("web UI: capacity bar, detail page with usage chart and job steps", func(t *testing.T) {
		// The page shows the node's last report: wait until the report
		// after the restore above is in (a busy machine delays it).
		waitFor(t, deadline, "node-1's report after the restore", func() bool {
			items, _, err := p.Client().Nodes(ctx)
			require.NoError(t, err)
			for _, n := range items {
				if n.Name == "node-1" && n.Health != nil && !n.Health.Silent && n.Health.Error == "" {
					return true
				}
			}
			return false
		})
		var usage struct{ Current *saltvolumes.Usage }
		waitFor(t, deadline, "hv1 reported prepared", func() bool {
			req, _ := http.NewRequest(http.MethodGet, p.URL+"/api/v1/volumes/hv1/usage", nil)
			req.Header.Set("Authorization", "Bearer "+p.Token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&usage))
			return usage.Current != nil && usage.Current.State == "prepared"
		})
		// A blank partition on a stand-in disk: the node offers it for raw
		// volumes (#51), on the nodes page and in the create form.
		disk := testenv.FakeDisk(t, 64<<20, "-n", "1:2048:+16M")
		part, err := loopdev.EnsurePartition(disk.Name, 1, 2048*512, 16<<20)
		require.NoError(t, err)
		waitFor(t, deadline, "the blank partition among node-1's disks", func() bool {
			items, _, err := p.Client().Nodes(ctx)
			require.NoError(t, err)
			for _, n := range items {
				if n.Name == "node-1" && n.Capacity != nil {
					for _, d := range n.Capacity.Disks {
						if d.Path == "/dev/"+part && d.Size == 16<<20 {
							return true
						}
					}
				}
			}
			return false
		})
		b := newBrowser(t, p)
		b.login()
		b.do(chromedp.WaitVisible(`#nodes tr[data-node="node-1"] svg.capbar`))
		assert.Contains(t, b.eventually(`#nodes tr[data-node="node-1"] td.disks`, "title", contains("/dev/"+part)), "/dev/"+part+": 16Mi (partition of "+disk.Name+")")
		b.do(chromedp.Click(`#nodes th button[data-nsort="disks"]`))
		assert.Equal(t, "ascending", b.attr(`#nodes th:has(button[data-nsort="disks"])`, "aria-sort"), "the nodes sort by any column")
		// The bar's figures in words beside it (the drawing itself is
		// hidden from screen readers: the words say it).
		bar := b.eventually(`#nodes tr[data-node="node-1"] td.capacity .caption`, "", contains("committed 64Mi of "))
		assert.Contains(t, bar, "committed 64Mi of ")
		beacon := b.eventually(`#nodes tr[data-node="node-1"] td.beacon`, "", contains("reported"))
		assert.Contains(t, beacon, "reported")
		b.shot("nodes-capacity")
		b.do(chromedp.Click(`#nodes tr[data-node="node-1"] a`),
			chromedp.WaitVisible("#show-create"),
			chromedp.Click("#show-create"),
			chromedp.Click(`input[name="kind"][value="raw"]`),
			chromedp.WaitVisible("#disk-hint"))
		assert.Contains(t, b.eventually("#disk-hint", "", contains("/dev/"+part)), "/dev/"+part+" (16Mi)", "the create form offers it")
		offered := b.attr(`#disk-list option[value="/dev/`+part+`"]`, "label")
		assert.Equal(t, "16Mi, partition of "+disk.Name, offered)
		b.do(chromedp.Click("#cancel-create"), chromedp.Navigate(p.URL+"/#/"), chromedp.WaitVisible(`#nodes tr[data-node="node-1"]`))

		b.do(chromedp.Navigate(p.URL+"/#/volume/hv1"),
			chromedp.WaitVisible(`#volume-view`),
			chromedp.WaitVisible(`#vol-chart svg.usage-chart path.line-allocated`),
			chromedp.WaitVisible(`#vol-jobs tbody tr`))
		assert.Equal(t, "Available", b.eventually("#vol-phase", "", func(s string) bool { return s == "Available" }))
		assert.Contains(t, b.text("#vol-spec"), vol.Spec.UUID)
		assert.Contains(t, b.eventually("#vol-usage", "", contains("prepared")), "prepared")
		d := b.attr(`#vol-chart path.line-allocated`, "d")
		assert.Regexp(t, `^M[\d.]+,[\d.]+`, d, "the chart draws the reported samples")
		assert.Contains(t, b.attr(`#vol-chart svg`, "aria-label"), "reports")
		// The create job, with the steps the node reported and their times.
		assert.Contains(t, b.eventually(`#vol-jobs tbody tr:last-child .job-result`, "", contains("succeeded")), "succeeded")
		steps := b.eventually(`#vol-jobs tbody tr:last-child .job-steps`, "", contains("attached"))
		assert.Regexp(t, `formatted \+\d+\.\d\d`, steps)
		assert.Regexp(t, `attached \+\d+\.\d\d`, steps)
		disabled, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.querySelector('#vol-delete').disabled`))
		require.NoError(t, err)
		assert.False(t, disabled, "an Available volume can be deleted")
		hidden, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.querySelector('#vol-forget').hidden`))
		require.NoError(t, err)
		assert.True(t, hidden, "forget is only for Failed volumes")
		b.shot("volume-detail")
		b.noConsoleErrors()
	})

	t.Run("usage history and job steps survive a restart of serve", func(t *testing.T) {
		get := func(path string, out any) {
			t.Helper()
			req, _ := http.NewRequest(http.MethodGet, p.URL+path, nil)
			req.Header.Set("Authorization", "Bearer "+p.Token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
		}
		var usage struct{ Samples []saltvolumes.UsageSample }
		var jobs struct{ Items []saltvolumes.Job }
		get("/api/v1/volumes/hv1/usage", &usage)
		get("/api/v1/volumes/hv1/jobs", &jobs)
		require.NotEmpty(t, usage.Samples)
		require.NotEmpty(t, jobs.Items)
		first, job := usage.Samples[0], jobs.Items[0]
		require.NotEmpty(t, job.Steps)

		p.Stop()
		p.Start("")
		usage.Samples, jobs.Items = nil, nil
		get("/api/v1/volumes/hv1/usage", &usage)
		get("/api/v1/volumes/hv1/jobs", &jobs)
		require.NotEmpty(t, usage.Samples, "the history is back at once, before any new report")
		assert.True(t, first.At.Equal(usage.Samples[0].At), "the oldest sample is the one from before the restart")
		require.NotEmpty(t, jobs.Items)
		assert.Equal(t, job.JID, jobs.Items[0].JID)
		assert.Equal(t, job.Steps, jobs.Items[0].Steps, "with its steps")
	})

	t.Run("orphans are listed per node, never deleted", func(t *testing.T) {
		orphan := filepath.Join(s.StateDir, "sparse", uuid.NewString())
		require.NoError(t, os.WriteFile(orphan, nil, 0o600))
		require.NoError(t, os.Truncate(orphan, 1<<20))
		t.Cleanup(func() { os.Remove(orphan) })
		waitFor(t, deadline, "the orphan in nodes", func() bool {
			items, _, err := p.Client().Nodes(ctx)
			require.NoError(t, err)
			return len(items) == 1 && items[0].Health != nil && len(items[0].Health.Orphans) == 1 &&
				items[0].Health.Orphans[0].BackingFile == orphan
		})
		require.FileExists(t, orphan)
	})

	t.Run("overcommit refused on the node, nothing written", func(t *testing.T) {
		items, _, err := p.Client().Nodes(ctx)
		require.NoError(t, err)
		c := items[0].Capacity
		limit := int64(testRatio * float64(c.Size))
		size := (limit-c.Committed)/(1<<20) + 16 // MiB: just past the limit
		w := p.Watch("hv2")
		out, errs, code := p.CLI("create", "hv2", "--node", "node-1", "--size", fmt.Sprintf("%dMi", size))
		require.Equal(t, 0, code, out+errs)
		evs := w.Until(t, 2*time.Minute, phaseIs("Failed"))
		last := evs[len(evs)-1].Volume
		require.Equal(t, "PrepareFailed", last.Status.Reason)
		require.Contains(t, last.Status.Message, "overcommit ratio")
		require.NoFileExists(t, filepath.Join(s.StateDir, "sparse", last.Spec.UUID))
		require.NoFileExists(t, filepath.Join(s.StateDir, "volumes", last.Spec.UUID+".json"))
		_, _, code = p.CLI("rm", "hv2", "--forget")
		require.Equal(t, 0, code)
	})

	t.Run("sparse file deleted: StorageLost", func(t *testing.T) {
		w := p.Watch("hv1")
		file := filepath.Join(s.StateDir, "sparse", vol.Spec.UUID)
		dev := vol.Status.DeviceName
		t.Cleanup(func() {
			// The loop device keeps the deleted file open: it is ours to
			// detach, and nobody else's.
			b, _ := os.ReadFile("/sys/block/" + dev + "/loop/backing_file")
			if strings.Contains(string(b), vol.Spec.UUID) {
				_ = exec.Command("losetup", "-d", "/dev/"+dev).Run()
			}
		})
		require.NoError(t, os.Remove(file))
		evs := w.Until(t, deadline, phaseIs("Failed"))
		last := evs[len(evs)-1].Volume
		require.Equal(t, "StorageLost", last.Status.Reason)
		require.Contains(t, last.Status.Message, "is gone")
		require.Equal(t, 0.0, p.Metric(`salt_volumes_volume_healthy{volume="hv1",node="node-1"}`))

		// The operator forgets it from the detail page, after confirming.
		b := newBrowser(t, p)
		b.login()
		b.do(chromedp.Navigate(p.URL+"/#/volume/hv1"),
			chromedp.WaitVisible(`#vol-forget`),
			chromedp.Click(`#vol-forget`),
			chromedp.WaitVisible(`#confirm`))
		assert.Contains(t, b.text("#confirm-text"), "Nothing runs on node node-1")
		assert.Equal(t, "Forget", b.text("#confirm-ok"))
		b.do(chromedp.Click("#confirm-ok"))
		isDeleted := func(ev saltvolumes.Event) bool { return ev.Type == "DELETED" }
		w.Until(t, 10*time.Second, isDeleted)
		b.do(chromedp.WaitVisible(`#vol-reason`))
		b.noConsoleErrors()
	})
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	end := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
