// Package salt tests the Salt modules and formulas on real Salt: masterless
// salt-call, and a salt-master with a salt-minion on loopback.
package salt

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var binary string

func TestMain(m *testing.M) { testenv.MainWithExec(m, &binary) }

// cleanupNode detaches whatever the stack's node state attached, and removes
// the links of the given volumes, even when the test failed.
func cleanupNode(t *testing.T, s *saltstack.Stack, uuids *[]string) {
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, *uuids, t.Logf) })
}

func vol(name, u, node string, extra map[string]any) map[string]any {
	v := map[string]any{"uuid": u, "node": node, "sparseLoopDevice": map[string]any{"size": "32Mi"}}
	if name != "" {
		v["name"] = name
	}
	for k, x := range extra {
		v[k] = x
	}
	return v
}

// states returns the state results of one minion's state.apply, keyed by
// state id.
func states(t *testing.T, out map[string]any, minion string) map[string]map[string]any {
	t.Helper()
	raw, ok := out[minion].(map[string]any)
	require.True(t, ok, "no state results for %s: %v", minion, out)
	res := map[string]map[string]any{}
	for _, v := range raw {
		st := v.(map[string]any)
		res[st["__id__"].(string)] = st
	}
	return res
}

func TestMasterless(t *testing.T) {
	s := saltstack.Masterless(t, binary)
	var uuids []string
	cleanupNode(t, s, &uuids)
	out, code := s.SaltCall("saltutil.sync_all", "--out=json")
	require.Equal(t, 0, code, out)

	fsU, blkU := uuid.NewString(), uuid.NewString()
	uuids = append(uuids, fsU, blkU)
	pillar := saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volumes": map[string]any{
		"data-fs":  vol("", fsU, "node-1", nil),
		"data-blk": vol("", blkU, "node-1", map[string]any{"mode": "Block"}),
		"other":    vol("", uuid.NewString(), "node-2", nil), // not this minion's
	}}})
	apply := func(args ...string) (map[string]map[string]any, int) {
		out, code := s.SaltCall(append([]string{"--retcode-passthrough", "--out=json", "state.apply"}, args...)...)
		return states(t, saltstack.JSON(t, out), "local"), code
	}

	// test=True first: says what would change, touches nothing.
	res, code := apply("salt_volumes", pillar, "test=True")
	require.Equal(t, 0, code)
	require.Len(t, res, 2, "only this minion's volumes")
	for id, st := range res {
		assert.Nil(t, st["result"], "%s would change", id)
		assert.NotEmpty(t, st["changes"])
	}
	_, err := os.Stat(filepath.Join(s.StateDir, "sparse", fsU))
	assert.True(t, os.IsNotExist(err), "test=True creates nothing")

	res, code = apply("salt_volumes", pillar)
	require.Equal(t, 0, code, res)
	fs := res["salt_volumes data-fs"]
	require.NotNil(t, fs)
	assert.Equal(t, true, fs["result"])
	v := fs["volume"].(map[string]any)
	assert.Equal(t, "/dev/disk/by-uuid/"+fsU, v["persistentPath"])
	dev, err := filepath.EvalSymlinks(v["persistentPath"].(string))
	require.NoError(t, err)
	assert.Equal(t, v["devicePath"], dev)
	assert.Equal(t, float64(32<<20), v["size"])
	assert.NotEmpty(t, fs["changes"].(map[string]any)["prepared"])
	blk := res["salt_volumes data-blk"]["volume"].(map[string]any)
	assert.Equal(t, "/dev/disk/by-partuuid/"+blkU, blk["persistentPath"])
	assert.Regexp(t, `^loop\d+p1$`, blk["deviceName"])

	// Second run: no changes, same device info.
	res, code = apply("salt_volumes", pillar)
	require.Equal(t, 0, code)
	for id, st := range res {
		assert.Empty(t, st["changes"], "%s changed on the second run", id)
		assert.Equal(t, true, st["result"])
	}
	assert.Equal(t, v["devicePath"], res["salt_volumes data-fs"]["volume"].(map[string]any)["devicePath"])

	// Execution module directly.
	specJSON := saltstack.Pillar(vol("data-fs", fsU, "node-1", nil))[len("pillar="):]
	out, code = s.SaltCall("--out=json", "salt_volumes.is_prepared", "spec="+specJSON)
	require.Equal(t, 0, code)
	assert.Equal(t, true, saltstack.JSON(t, out)["local"])
	out, code = s.SaltCall("--out=json", "salt_volumes.list")
	require.Equal(t, 0, code)
	assert.Len(t, saltstack.JSON(t, out)["local"], 2)

	// Snapshots through the execution module, as a pillar-driven fleet
	// takes them: taken, listed, a volume with one is not removed, deleted.
	out, code = s.SaltCall("--out=json", "salt_volumes.snapshot", "spec="+specJSON, "snapshot_name=before")
	require.Equal(t, 0, code, out)
	snap := saltstack.JSON(t, out)["local"].(map[string]any)
	assert.Equal(t, "taken", snap["phase"])
	assert.Contains(t, []any{"reflink", "sparse-copy"}, snap["method"])
	out, code = s.SaltCall("--out=json", "salt_volumes.snapshots")
	require.Equal(t, 0, code, out)
	require.Len(t, saltstack.JSON(t, out)["local"], 1)
	_, code = s.SaltCall("--out=json", "--retcode-passthrough", "salt_volumes.unprepare", "spec="+specJSON)
	assert.NotEqual(t, 0, code, "refused: it has a snapshot (the message names it)")
	_, err = os.Stat(filepath.Join(s.StateDir, "sparse", fsU))
	require.NoError(t, err, "the volume is still there")
	out, code = s.SaltCall("--out=json", "salt_volumes.snapshot_delete", "spec="+specJSON, "snapshot_name=before")
	require.Equal(t, 0, code, out)
	out, code = s.SaltCall("--out=json", "salt_volumes.snapshots")
	require.Equal(t, 0, code, out)
	assert.Empty(t, saltstack.JSON(t, out)["local"])

	// The formula a pillar-driven fleet applies: salt_volumes:snapshots
	// names each volume's snapshots; taken once, then left; a name under
	// snapshots_absent deleted.
	snapPillar := func(key string) string {
		return saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{
			"volumes": map[string]any{"data-fs": vol("", fsU, "node-1", nil)},
			key:       map[string]any{"data-fs": []string{"nightly"}}}})
	}
	res, code = apply("salt_volumes.snapshotted", snapPillar("snapshots"))
	require.Equal(t, 0, code, res)
	taken := res["salt_volumes snapshot data-fs nightly"]
	require.NotNil(t, taken, res)
	assert.Equal(t, true, taken["result"], taken["comment"])
	assert.Contains(t, taken["changes"], "taken")
	res, code = apply("salt_volumes.snapshotted", snapPillar("snapshots"))
	require.Equal(t, 0, code, res)
	assert.Empty(t, res["salt_volumes snapshot data-fs nightly"]["changes"], "a snapshot is a point in time: not taken again")
	res, code = apply("salt_volumes.snapshotted", snapPillar("snapshots_absent"))
	require.Equal(t, 0, code, res)
	assert.Equal(t, "nightly", res["salt_volumes snapshot data-fs nightly absent"]["changes"].(map[string]any)["deleted"])
	out, code = s.SaltCall("--out=json", "salt_volumes.snapshots")
	require.Equal(t, 0, code, out)
	assert.Empty(t, saltstack.JSON(t, out)["local"])

	// Bad pillar: the state fails naming the volume and the field, and
	// nothing is prepared for it.
	badU := uuid.NewString()
	bad := saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volumes": map[string]any{
		"bad-size":  vol("", badU, "node-1", map[string]any{"sparseLoopDevice": map[string]any{"size": "lots"}}),
		"bad-key":   vol("", uuid.NewString(), "node-1", map[string]any{"fstype": "xfs"}),
		"no-node":   vol("", uuid.NewString(), "", nil),
		"wrong-key": vol("other-name", uuid.NewString(), "node-1", nil),
	}}})
	res, code = apply("salt_volumes.prepared", bad)
	assert.NotEqual(t, 0, code, "a bad pillar fails the run")
	want := map[string]string{
		"salt_volumes bad-size":  "volume bad-size: sparseLoopDevice.size",
		"salt_volumes bad-key":   `volume bad-key: spec: unknown field "fstype"`,
		"salt_volumes no-node":   "volume no-node: node: missing",
		"salt_volumes wrong-key": "volume wrong-key: name:",
	}
	for id, prefix := range want {
		require.Contains(t, res, id)
		assert.Equal(t, false, res[id]["result"])
		assert.Contains(t, res[id]["comment"], prefix)
	}
	_, err = os.Stat(filepath.Join(s.StateDir, "sparse", badU))
	assert.True(t, os.IsNotExist(err))

	// Remove them all.
	res, code = apply("salt_volumes.unprepared", pillar)
	require.Equal(t, 0, code, res)
	for id, st := range res {
		assert.NotEmpty(t, st["changes"], id)
	}
	ents, _ := os.ReadDir(filepath.Join(s.StateDir, "sparse"))
	assert.Empty(t, ents)
	_, err = os.Lstat("/dev/disk/by-uuid/" + fsU)
	assert.True(t, os.IsNotExist(err))
	res, code = apply("salt_volumes.unprepared", pillar)
	require.Equal(t, 0, code)
	for id, st := range res {
		assert.Empty(t, st["changes"], id)
	}
}

func TestMasterMinionJobReturnAndProgressEvents(t *testing.T) {
	s := saltstack.Start(t, binary, false)
	var uuids []string
	cleanupNode(t, s, &uuids)
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	bus := s.Listen()

	u := uuid.NewString()
	uuids = append(uuids, u)
	spec := vol("api-vol", u, s.MinionID, nil)
	out, code = s.Salt(s.MinionID, "state.apply", "salt_volumes.prepared",
		saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volume": spec}}), "--out=json", "--static")
	require.Equal(t, 0, code, out)
	res := states(t, saltstack.JSON(t, out), s.MinionID)
	v := res["salt_volumes api-vol"]["volume"].(map[string]any)
	assert.Equal(t, "/dev/disk/by-uuid/"+u, v["persistentPath"])

	// The bus saw the steps, then the job return carrying the device info.
	type step struct {
		name string
		seq  float64
	}
	var got []step
	evs, ok := bus.Collect(30*time.Second, func(e saltstack.Event) bool {
		return strings.HasPrefix(e.Tag, "salt/job/") && strings.Contains(e.Tag, "/ret/"+s.MinionID) && e.Data["fun"] == "state.apply"
	})
	require.True(t, ok, "no job return event")
	for _, e := range evs {
		if e.Tag == "salt-volumes/api-vol/progress" {
			// Events a minion fires reach the master bus wrapped:
			// {"cmd": "_minion_event", "id": <minion>, "data": {...}}.
			assert.Equal(t, s.MinionID, e.Data["id"])
			d, _ := e.Data["data"].(map[string]any)
			assert.Equal(t, u, d["uuid"])
			name, _ := d["step"].(string)
			seq, _ := d["seq"].(float64)
			got = append(got, step{name, seq})
		}
	}
	// In the order the module fired them: Salt 3006's minion forwards
	// events concurrently, so they may arrive in another.
	sort.Slice(got, func(i, j int) bool { return got[i].seq < got[j].seq })
	var steps []string
	for i, st := range got {
		assert.Equal(t, float64(i+1), st.seq, "progress events numbered from 1 without gaps")
		steps = append(steps, st.name)
	}
	assert.Equal(t, []string{"started", "recorded", "file-created", "formatted", "attached", "linked", "prepared", "done"}, steps)
	ret := evs[len(evs)-1].Data
	assert.Equal(t, float64(0), ret["retcode"])
	found := false
	for _, st := range ret["return"].(map[string]any) {
		if vv, ok := st.(map[string]any)["volume"].(map[string]any); ok {
			assert.Equal(t, v["devicePath"], vv["devicePath"])
			assert.Equal(t, v["persistentPath"], vv["persistentPath"])
			found = true
		}
	}
	assert.True(t, found, "the job return event carries the device info")

	orchestrate(t, s, &uuids)

	// Clean up through Salt too.
	out, code = s.Salt(s.MinionID, "state.apply", "salt_volumes.unprepared",
		saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volume": spec}}), "--out=json", "--static")
	assert.Equal(t, 0, code, out)
	ents, _ := os.ReadDir(filepath.Join(s.StateDir, "sparse"))
	assert.Empty(t, ents)
}
