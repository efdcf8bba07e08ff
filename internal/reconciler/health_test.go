package reconciler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// healthEvent is the beacon's event as the master puts it on the bus: the
// single-event envelope with the authenticated id.
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

func TestNodeReportsMoveVolumes(t *testing.T) {
	g := newRig(t, Options{})
	s := sparseSpec("hv")
	_, err := g.r.Create(s)
	require.NoError(t, err)
	v := g.until("hv", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("hv", "prepared", true, "", device(s))))
	g.until("hv", "Available")
	d := device(s)

	// Reports about node-1 from another minion, or batched (no
	// authenticated id), change nothing.
	g.forge(healthEvent("node-1", "node-2", withState(d, "detached", "")))
	bare := healthEvent("node-1", "node-1", withState(d, "detached", ""))
	bare.Data = bare.Data["data"].(map[string]any)
	g.forge(bare)

	g.forge(healthEvent("node-1", "node-1", withState(d, "detached", "")))
	v = g.until("hv", "Failed")
	assert.Equal(t, ReasonDetached, v.Status.Reason, "the first change is the authenticated report")
	assert.Contains(t, v.Status.Message, "salt node-1 salt_volumes.restore")
	assert.EqualValues(t, 2, g.r.Metrics.Rejected.Health.Value())

	// Restored: Available again, with the device the node now has.
	back := withState(d, "prepared", "")
	back["deviceName"], back["devicePath"], back["allocated"] = "loop7", "/dev/loop7", int64(5<<20)
	g.forge(healthEvent("node-1", "node-1", back))
	v = g.until("hv", "Available")
	assert.Empty(t, v.Status.Reason)
	assert.Equal(t, "/dev/loop7", v.Status.DevicePath)
	u := g.r.Nodes.Usage("node-1", s.UUID)
	require.NotNil(t, u)
	assert.Equal(t, int64(5<<20), u.Allocated)

	// A report whose device info is not the volume's is not applied.
	bad := withState(back, "prepared", "")
	bad["persistentPath"], bad["deviceName"] = "/etc/passwd", "loop9"
	g.forge(healthEvent("node-1", "node-1", bad))
	g.forge(healthEvent("node-1", "node-1", withState(d, "missing", "/var/lib/salt-volumes/sparse/x is gone")))
	v = g.until("hv", "Failed")
	assert.Equal(t, ReasonStorageLost, v.Status.Reason)
	assert.Equal(t, "/dev/loop7", v.Status.DevicePath, "the forged device never applied")
	assert.EqualValues(t, 1, g.r.Metrics.Rejected.Device.Value())

	g.forge(healthEvent("node-1", "node-1", withState(d, "damaged", "no longer carries the volume's ext4")))
	v = g.until("hv", "Failed")
	assert.Equal(t, ReasonDamaged, v.Status.Reason)

	// A volume failed by its job is not the beacon's to revive.
	_, err = g.r.Create(sparseSpec("job-failed"))
	require.NoError(t, err)
	jf := g.until("job-failed", "Pending")
	g.send(ret(jf.Status.JobID, "node-1", 1, stateRet("job-failed", "prepared", false, "mkfs failed", nil)))
	g.until("job-failed", "Failed")
	jd := device(sparseSpec("job-failed"))
	g.forge(healthEvent("node-1", "node-1", withState(d, "prepared", ""), withState(jd, "prepared", "")))
	assert.Equal(t, volume.Available, g.until("hv", "Available").Status.Phase)
	got, err := g.store.Get("job-failed")
	require.NoError(t, err)
	assert.Equal(t, ReasonPrepareFailed, got.Status.Reason)

	// Restore reports count once each, whoever sends them twice.
	restore := events.Event{Tag: "salt-volumes/node/node-1/restore", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-1", "data": map[string]any{"id": "r1", "restored": int64(3), "failed": int64(1)}}}
	g.forge(restore)
	g.forge(restore)
	g.forge(healthEvent("node-1", "node-1", withState(d, "prepared", "")))
	require.Eventually(t, func() bool { return g.r.Nodes.Reconstructed.Value() == 3 }, 5e9, 1e7)
	assert.EqualValues(t, 1, g.r.Nodes.RestoreFailed.Value())
}
