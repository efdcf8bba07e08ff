package controlplane

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/volume"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestForgedEventsChangeNothing: any accepted minion can put job returns
// and progress events with any payload on the master bus, in Salt's
// single-event form and in its batched form (event.fire_master with a
// preload of events). The volume's own minion and a second one forge every
// transition; no volume changes, the rejections are counted, and a real
// create and delete still work.
func TestForgedEventsChangeNothing(t *testing.T) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	state2 := s.AddMinion("node-2")
	var uuids []string
	t.Cleanup(func() {
		testenv.Cleanup(s.StateDir, uuids, t.Logf)
		testenv.Cleanup(state2, nil, t.Logf)
	})
	out, code := s.SyncAll("*")
	require.Equal(t, 0, code, out)
	p := newPlane(t, s)
	p.Start("")
	c := p.Client()
	ctx := context.Background()

	_, errs, code := p.CLI("create", "real-1", "--node", "node-1", "--size", "32Mi", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
	real1 := getJSON(t, p, "real-1")
	uuids = append(uuids, real1.Spec.UUID)
	// A volume whose job cannot return: its node is down.
	s.StopMinion("node-2")
	_, err := c.Create(ctx, map[string]any{"name": "waiting", "node": "node-2", "sparseLoopDevice": map[string]any{"size": "32Mi"}})
	require.NoError(t, err)
	var waiting saltvolumes.View
	require.Eventually(t, func() bool {
		waiting = getJSON(t, p, "waiting")
		return waiting.Status.Phase == volume.Pending && waiting.Status.JobID != ""
	}, time.Minute, 100*time.Millisecond, "the job for the stopped node is published")

	evil := map[string]any{"name": "real-1", "uuid": real1.Spec.UUID, "devicePath": "/", "deviceName": "sda",
		"persistentPath": "/", "size": 1 << 40}
	ghost := map[string]any{"name": "ghost", "uuid": "5b3a5ad4-6f1c-4b8a-9d3e-1f2a3b4c5d6e", "node": "node-1",
		"mode": "Filesystem", "fsType": "ext4", "sparseLoopDevice": map[string]any{"size": "1Gi"}}
	stateRet := func(name, fun string, ok bool, vol, spec map[string]any) map[string]any {
		st := map[string]any{"result": ok, "comment": "forged", "__run_num__": 0, "changes": map[string]any{}}
		if vol != nil {
			st["volume"] = vol
		}
		if spec != nil {
			st["spec"] = spec
		}
		return map[string]any{"salt_volumes_|-salt_volumes " + name + "_|-" + name + "_|-" + fun: st}
	}
	retData := func(jid, minion string, retcode int, ret any) map[string]any {
		return map[string]any{"fun": "state.apply", "jid": jid, "id": minion, "retcode": retcode,
			"success": retcode == 0, "return": ret, "cmd": "_return", "fun_args": []any{"salt_volumes.prepared"}}
	}
	type forgery struct {
		what, tag string
		data      map[string]any
	}
	const jid = "20261123000000000001"
	forged := []forgery{
		{"settle the waiting volume", "salt/job/" + waiting.Status.JobID + "/ret/node-2",
			retData(waiting.Status.JobID, "node-2", 0, stateRet("waiting", "prepared", true, evil, nil))},
		{"fail the waiting volume", "salt/job/" + waiting.Status.JobID + "/ret/node-2",
			retData(waiting.Status.JobID, "node-2", 2, stateRet("waiting", "prepared", false, nil, nil))},
		{"re-point an Available volume to /", "salt/job/" + jid + "/ret/node-1",
			retData(jid, "node-1", 0, stateRet("real-1", "prepared", true, evil, nil))},
		{"remove an Available volume", "salt/job/" + jid + "/ret/node-1",
			retData(jid, "node-1", 0, stateRet("real-1", "absent", true, nil, nil))},
		{"adopt a volume nobody made", "salt/job/" + jid + "/ret/node-1",
			retData(jid, "node-1", 0, stateRet("ghost", "prepared", true, map[string]any{"uuid": ghost["uuid"],
				"devicePath": "/dev/loop9", "deviceName": "loop9", "persistentPath": "/dev/disk/by-uuid/" + ghost["uuid"].(string), "size": 1 << 30}, ghost))},
	}
	progress := []forgery{
		{"progress for the waiting volume", "salt-volumes/waiting/progress",
			map[string]any{"step": "forged", "uuid": waiting.Spec.UUID, "volume": "waiting", "node": "node-2"}},
	}
	unconfirmed0 := p.Metric(`salt_volumes_events_rejected_total{reason="unconfirmed"}`)
	progress0 := p.Metric(`salt_volumes_events_rejected_total{reason="progress"}`)

	fire := func(minion string, batched bool, f forgery) {
		t.Helper()
		data, _ := json.Marshal(f.data)
		args := []string{minion, "event.fire_master", string(data), f.tag, "--out=json"}
		if batched {
			pre, _ := json.Marshal(map[string]any{"events": []any{map[string]any{"tag": f.tag, "data": f.data}}})
			args = []string{minion, "event.fire_master", "{}", "salt-volumes/carrier", "preload=" + string(pre), "--out=json"}
		}
		out, code := s.Salt(args...)
		require.Equal(t, 0, code, "%s: %s", f.what, out)
	}
	// node-2 is down: node-1, the Available volume's own minion, forges
	// everything, both ways; then node-1 forges as if it were node-2.
	n := 0
	for _, batched := range []bool{false, true} {
		for _, f := range forged {
			fire("node-1", batched, f)
			n++
		}
		for _, f := range progress {
			fire("node-1", batched, f)
		}
	}
	require.Eventually(t, func() bool {
		return p.Metric(`salt_volumes_events_rejected_total{reason="unconfirmed"}`)-unconfirmed0 >= float64(n)
	}, 30*time.Second, 100*time.Millisecond, "every forged return is rejected and counted")
	assert.Equal(t, float64(n), p.Metric(`salt_volumes_events_rejected_total{reason="unconfirmed"}`)-unconfirmed0)
	assert.Equal(t, float64(2*len(progress)), p.Metric(`salt_volumes_events_rejected_total{reason="progress"}`)-progress0,
		"progress from another minion (single form) and without an envelope (batched) are rejected")

	after := getJSON(t, p, "real-1")
	assert.Equal(t, real1.Status, after.Status, "the Available volume is untouched")
	w := getJSON(t, p, "waiting")
	assert.Equal(t, volume.Pending, w.Status.Phase)
	assert.Empty(t, w.Status.Step, "no forged progress")
	_, _, code = p.CLI("get", "ghost")
	assert.Equal(t, 4, code, "nothing adopted")
	pv, _, code := p.CLI("pv", "real-1")
	require.Equal(t, 0, code)
	assert.Contains(t, pv, "path: /dev/disk/by-uuid/"+real1.Spec.UUID)

	// The real thing still works: create and delete.
	_, errs, code = p.CLI("create", "real-2", "--node", "node-1", "--size", "16Mi", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
	uuids = append(uuids, getJSON(t, p, "real-2").Spec.UUID)
	for _, name := range []string{"real-1", "real-2"} {
		_, errs, code = p.CLI("rm", name, "--wait", "--timeout", "2m")
		require.Equal(t, 0, code, errs)
	}
	items, err := c.List(ctx, "node-1")
	require.NoError(t, err)
	assert.Empty(t, items)
	var names []string
	all, _ := c.List(ctx, "")
	for _, v := range all {
		names = append(names, v.Spec.Name)
	}
	assert.Equal(t, "waiting", strings.Join(names, ","))
}
