package reconciler

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// healthEvent is the beacon's event as the master puts it on the bus: the
// single-event envelope with the sender's id. Any minion can put the same
// bytes there with a batched event, so it is only a hint.
func healthEvent(tagNode, sender string, vols ...map[string]any) events.Event {
	list := make([]any, len(vols))
	for i, v := range vols {
		list[i] = v
	}
	return events.Event{Tag: "salt-volumes/node/" + tagNode + "/health", Data: map[string]any{
		"cmd": "_minion_event", "id": sender, "data": map[string]any{
			"kind": "change", "interval": int64(10), "heartbeat": int64(300), "volumes": list,
			"capacity": map[string]any{"path": "/var/lib/salt-volumes/sparse", "size": int64(100 << 30), "free": int64(60 << 30), "committed": int64(1 << 30), "overcommitRatio": 1.0},
		}}}
}

func withState(d map[string]any, state, errMsg string) map[string]any {
	out := map[string]any{}
	for k, v := range d {
		out[k] = v
	}
	out["state"] = state
	if errMsg != "" {
		out["error"] = errMsg
	}
	return out
}

// truth is what salt_volumes.status returns on node-1: the node's real
// state, which only a job return written to the job cache carries.
type truth struct {
	mu      sync.Mutex
	volumes []map[string]any
	restore map[string]any
	runs    int
}

func (tr *truth) set(restore map[string]any, vols ...map[string]any) {
	tr.mu.Lock()
	tr.volumes, tr.restore = vols, restore
	tr.mu.Unlock()
}

// statusRig answers salt_volumes.status jobs from tr, as a node would:
// the return goes to the job cache and its event on the bus.
func statusRig(t *testing.T, tr *truth) *rig { return statusRigWith(t, tr, false) }

// statusRigWith's early rig puts each status return on the bus, and lets
// it be handled, before local_async answers: a fast node behind a slow
// salt-api.
func statusRigWith(t *testing.T, tr *truth, early bool) *rig {
	var g *rig
	ready := make(chan struct{})
	fs := &fakeSalt{jobs: map[string]saltapi.JobInfo{}}
	fs.onLaunch = func(jid string, c call) {
		if c.Fun != FunStatus {
			return
		}
		<-ready
		tr.mu.Lock()
		tr.runs++
		doc := map[string]any{"volumes": tr.volumes, "lastRestore": tr.restore,
			"capacity": map[string]any{"path": "/x", "size": int64(100 << 30), "free": int64(50 << 30), "committed": int64(1 << 30), "overcommitRatio": 1.0}}
		tr.mu.Unlock()
		b, err := json.Marshal(doc)
		require.NoError(t, err)
		var ret any
		require.NoError(t, json.Unmarshal(b, &ret))
		ev := events.Event{Tag: "salt/job/" + jid + "/ret/" + c.Tgt, Data: map[string]any{
			"fun": FunStatus, "retcode": int64(0), "return": ret, "jid": jid, "id": c.Tgt}}
		if !early {
			go g.send(ev)
			return
		}
		g.send(ev) // handled, before local_async answers
	}
	g = newRigWith(t, fs, Options{})
	close(ready)
	return g
}

func TestNodeReportsMoveVolumesOnlyOnceConfirmed(t *testing.T) {
	tr := &truth{}
	g := statusRig(t, tr)
	s := sparseSpec("hv")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("hv", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("hv", "prepared", true, "", device(s))))
	g.until("hv", "Available")
	d := device(s)
	tr.set(nil, withState(d, "prepared", ""))

	// A report about node-1 from another minion is not even a hint.
	g.forge(healthEvent("node-1", "node-2", withState(d, "detached", "")))
	// A report in node-1's envelope that the node's own status does not
	// bear out (a forged batched event, or a stale one) changes nothing.
	g.forge(healthEvent("node-1", "node-1", withState(d, "detached", "")))
	require.Eventually(t, func() bool { return g.r.Metrics.NodeReportsConfirmed.Value() == 1 }, 5*time.Second, 10*time.Millisecond)
	got, err := g.store.Get("hv")
	require.NoError(t, err)
	assert.Equal(t, volume.Available, got.Status.Phase, "the node says prepared")
	assert.EqualValues(t, 1, g.r.Metrics.Rejected.Health.Value())
	assert.Equal(t, "prepared", g.r.Nodes.Usage("node-1", s.UUID).State, "the confirmed status is what is shown")

	// Really detached: the report is confirmed.
	tr.set(nil, withState(d, "detached", ""))
	g.forge(healthEvent("node-1", "node-1", withState(d, "detached", "")))
	v = g.until("hv", "Failed")
	assert.Equal(t, ReasonDetached, v.Status.Reason)
	assert.Contains(t, v.Status.Message, "salt node-1 salt_volumes.restore")

	// Restored: Available again with the device the node now has; the
	// restore is counted from the node's status, once.
	back := withState(d, "prepared", "")
	back["deviceName"], back["devicePath"], back["allocated"] = "loop7", "/dev/loop7", int64(5<<20)
	tr.set(map[string]any{"id": "r1", "restored": 3, "failed": 1}, back)
	restore := events.Event{Tag: "salt-volumes/node/node-1/restore", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-1", "data": map[string]any{"id": "r1", "restored": int64(300), "failed": int64(0)}}}
	g.forge(restore)
	v = g.until("hv", "Available")
	assert.Equal(t, "/dev/loop7", v.Status.DevicePath)
	assert.Equal(t, int64(5<<20), g.r.Nodes.Usage("node-1", s.UUID).Allocated)
	g.forge(restore)
	require.Eventually(t, func() bool { return g.r.Metrics.NodeReportsConfirmed.Value() == 4 }, 5*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 3, g.r.Nodes.Reconstructed.Value(), "the node's numbers, not the event's, once")
	assert.EqualValues(t, 1, g.r.Nodes.RestoreFailed.Value())

	// Two runs before serve read the node (the boot's, then the beacon's):
	// the status carries the first run's counts with the last's.
	tr.set(map[string]any{"id": "r3", "restored": 1, "failed": 0, "earlier": []map[string]any{
		{"id": "r1", "restored": 3, "failed": 1}, {"id": "r2", "restored": 4, "failed": 0}}}, back)
	g.forge(restore)
	require.Eventually(t, func() bool { return g.r.Metrics.NodeReportsConfirmed.Value() == 5 }, 5*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 8, g.r.Nodes.Reconstructed.Value(), "r2 and r3 counted, r1 not again")
	assert.EqualValues(t, 1, g.r.Nodes.RestoreFailed.Value())

	// Device info the node returns must still describe the volume.
	bad := withState(back, "prepared", "")
	bad["persistentPath"], bad["deviceName"] = "/etc/passwd", "loop9"
	tr.set(nil, withState(d, "missing", "/var/lib/salt-volumes/sparse/x is gone"))
	g.forge(healthEvent("node-1", "node-1", withState(d, "missing", "")))
	v = g.until("hv", "Failed")
	assert.Equal(t, ReasonStorageLost, v.Status.Reason)
	assert.Contains(t, v.Status.Message, "is gone")
	tr.set(nil, bad)
	g.forge(healthEvent("node-1", "node-1", bad))
	require.Eventually(t, func() bool { return g.r.Metrics.Rejected.Device.Value() == 1 }, 5*time.Second, 10*time.Millisecond)
	got, err = g.store.Get("hv")
	require.NoError(t, err)
	assert.Equal(t, ReasonStorageLost, got.Status.Reason, "a bad device never revives the volume")

	tr.set(nil, withState(d, "damaged", "no longer carries the volume's ext4"))
	g.forge(healthEvent("node-1", "node-1", withState(d, "damaged", "")))
	assert.Equal(t, ReasonDamaged, g.until("hv", "Failed").Status.Reason)

	// A volume failed by its job is not a report's to revive.
	_, err = g.r.Requests.Create(context.Background(), sparseSpec("job-failed"))
	require.NoError(t, err)
	jf := g.until("job-failed", "Pending")
	g.send(ret(jf.Status.JobID, "node-1", 1, stateRet("job-failed", "prepared", false, "mkfs failed", nil)))
	g.until("job-failed", "Failed")
	jd := device(sparseSpec("job-failed"))
	tr.set(nil, withState(d, "prepared", ""), withState(jd, "prepared", ""))
	g.forge(healthEvent("node-1", "node-1", withState(d, "prepared", "")))
	assert.Equal(t, volume.Available, g.until("hv", "Available").Status.Phase)
	got, err = g.store.Get("job-failed")
	require.NoError(t, err)
	assert.Equal(t, ReasonPrepareFailed, got.Status.Reason)
}

// An encrypted volume whose container its node reports closed is Locked
// (its data is there, unreadable), not Failed; opened again it is
// Available; lost meanwhile it is Failed. A heartbeat saying locked again
// asks the node for nothing.
func TestNodeReportsLockedVolume(t *testing.T) {
	tr := &truth{}
	g := statusRig(t, tr)
	s := sparseSpec("enc")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("enc", "Pending")
	prepared := ret(v.Status.JobID, "node-1", 0, stateRet("enc", "prepared", true, "", device(s)))
	g.send(prepared)
	g.until("enc", "Available")
	d := device(s)

	tr.set(nil, withState(d, "locked", ""))
	g.forge(healthEvent("node-1", "node-1", withState(d, "locked", "")))
	v = g.until("enc", "Locked")
	assert.Equal(t, ReasonContainerClosed, v.Status.Reason)
	assert.Contains(t, v.Status.Message, "salt node-1 salt_volumes.restore")
	confirmed := g.r.Metrics.NodeReportsConfirmed.Value()
	g.forge(healthEvent("node-1", "node-1", withState(d, "locked", "")))
	// Past confirmGap: a confirmation the report asked for would have run.
	assert.Never(t, func() bool { return g.r.Metrics.NodeReportsConfirmed.Value() != confirmed }, 2*confirmGap+500*time.Millisecond, 20*time.Millisecond,
		"a steady locked report runs no status job")

	// The prepare's own return, still in the job cache, replayed on the
	// bus (any minion can): the node is asked again, and says locked.
	g.forge(prepared)
	require.Eventually(t, func() bool { return g.r.Metrics.NodeReportsConfirmed.Value() > confirmed }, 5*time.Second, 10*time.Millisecond,
		"the replayed return asks the node")
	got, err := g.store.Get("enc")
	require.NoError(t, err)
	assert.Equal(t, volume.Locked, got.Status.Phase, "a replayed return does not unlock the volume")

	// Resize asks for an Available volume; a Locked one is refused by name.
	_, err = g.r.Requests.Resize(context.Background(), "enc", "2Gi")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "it is Locked")

	tr.set(nil, withState(d, "prepared", ""))
	g.forge(healthEvent("node-1", "node-1", withState(d, "prepared", "")))
	v = g.until("enc", "Available")
	assert.Empty(t, v.Status.Reason)

	tr.set(nil, withState(d, "locked", ""))
	g.forge(healthEvent("node-1", "node-1", withState(d, "locked", "")))
	g.until("enc", "Locked")
	tr.set(nil, withState(d, "missing", "/var/lib/salt-volumes/sparse/x is gone"))
	g.forge(healthEvent("node-1", "node-1", withState(d, "missing", "")))
	assert.Equal(t, ReasonStorageLost, g.until("enc", "Failed").Status.Reason)
}

// A Locked volume whose key is the master's says who opens it: its node's
// beacon, once the minion has the key from pillar.
func TestLockedMasterKeyVolumeNamesItsKey(t *testing.T) {
	tr := &truth{}
	g := statusRig(t, tr)
	s := sparseSpec("vault")
	s.Encryption = &spec.Encryption{Provider: spec.ProviderMaster}
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("vault", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("vault", "prepared", true, "", device(s))))
	g.until("vault", "Available")
	d := withState(device(s), "locked", "")
	tr.set(nil, d)
	g.forge(healthEvent("node-1", "node-1", d))
	v = g.until("vault", "Locked")
	assert.Equal(t, ReasonContainerClosed, v.Status.Reason)
	assert.Contains(t, v.Status.Message, "its key is the master's: the node's beacon opens it once its minion has the key from pillar (salt_volumes:keys:vault)")
	assert.Contains(t, v.Status.Message, "salt node-1 salt_volumes.restore")
}

// A status return seen on the bus before local_async answered with its jid
// still confirms the report at once, not after statusWait (30 s).
func TestStatusReturnBeforeLocalAsyncAnswers(t *testing.T) {
	tr := &truth{}
	g := statusRigWith(t, tr, true)
	s := sparseSpec("early")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("early", "Pending")
	for v.Status.JobID == "" {
		v = g.next("early").Volume
	}
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("early", "prepared", true, "", device(s))))
	g.until("early", "Available")
	d := device(s)
	tr.set(nil, withState(d, "detached", ""))
	g.forge(healthEvent("node-1", "node-1", withState(d, "detached", "")))
	v = g.until("early", "Failed")
	assert.Equal(t, ReasonDetached, v.Status.Reason)
}
