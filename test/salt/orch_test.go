package salt

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
)

// orchestrate runs the orchestrate files against a minion whose own pillar
// defines a volume of its own (and asks for wipes): a run on other volumes,
// from the orchestrate files or from apply_volume (the control plane's
// path), never touches it, though Salt merges a command line's pillar into
// the node's.
func orchestrate(t *testing.T, s *saltstack.Stack, uuids *[]string) {
	me := s.MinionID
	derived := func(name string) string {
		out, code := s.Salt(me, "salt_volumes.pillar_uuid", me, name, "--out=json", "--static")
		require.Equal(t, 0, code, out)
		u, _ := saltstack.JSON(t, out)[me].(string)
		require.NotEmpty(t, u, out)
		*uuids = append(*uuids, u)
		return u
	}
	recorded := func(u string) bool {
		_, err := os.Stat(filepath.Join(s.StateDir, "volumes", u+".json"))
		return err == nil
	}

	// The node's own pillar: a volume without a uuid, wipe: true, and a
	// snapshot of another volume to delete.
	pillarDir := filepath.Join(s.Root, "pillar")
	require.NoError(t, os.WriteFile(filepath.Join(pillarDir, "top.sls"), []byte("base:\n  '"+me+"':\n    - volumes\n"), 0o600))
	own, err := json.Marshal(map[string]any{"salt_volumes": map[string]any{"wipe": true,
		"snapshots_absent": map[string]any{"orch-fs": []string{"keep"}}, "volumes": map[string]any{
			"own-vol": map[string]any{"node": me, "sparseLoopDevice": map[string]any{"size": "32Mi"}}}}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(pillarDir, "volumes.sls"), own, 0o600))
	t.Cleanup(func() {
		os.Remove(filepath.Join(pillarDir, "top.sls"))
		os.Remove(filepath.Join(pillarDir, "volumes.sls"))
	})
	// state.apply compiles the pillar afresh.
	out, code := s.Salt(me, "state.apply", "salt_volumes.prepared", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	ownU := derived("own-vol")
	require.True(t, recorded(ownU), "a pillar volume without a uuid is prepared under the one derived from node and name")
	out, code = s.Salt(me, "state.apply", "salt_volumes.prepared", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	for _, st := range states(t, saltstack.JSON(t, out), me) {
		assert.Empty(t, st["changes"], "re-applying finds the same volume: %v", st["comment"])
	}

	// Deploy, two nodes at once: the ghost node fails the run, named; the
	// real one gets its volumes (one without a uuid).
	u3 := uuid.NewString()
	*uuids = append(*uuids, u3)
	vols := map[string]any{
		"orch-fs":   map[string]any{"node": me, "sparseLoopDevice": map[string]any{"size": "32Mi"}},
		"orch-blk":  vol("", u3, me, map[string]any{"mode": "Block"}),
		"ghost-vol": vol("", uuid.NewString(), "ghost-node", nil),
	}
	orch := func(sls string, extra map[string]any) (string, int) {
		p := map[string]any{"volumes": vols}
		for k, v := range extra {
			p[k] = v
		}
		return s.SaltRun("state.orchestrate", "salt_volumes.orch."+sls, saltstack.Pillar(map[string]any{"salt_volumes": p}), "--out=json")
	}
	out, code = orch("deploy", map[string]any{"orch": map[string]any{"batch": 2}})
	assert.NotEqual(t, 0, code, "a node that cannot be reached fails the orchestration")
	assert.Contains(t, out, "ghost-node")
	fsU := derived("orch-fs")
	for _, u := range []string{fsU, u3} {
		assert.True(t, recorded(u), "orchestrate prepared %s", u)
	}
	delete(vols, "ghost-vol")
	out, code = orch("deploy", map[string]any{"orch": map[string]any{"batch": "two"}})
	assert.NotEqual(t, 0, code)
	assert.Contains(t, out, "salt_volumes:orch:batch")

	// A snapshot of the named volumes, then deleted. The node's own
	// pillar asks to delete one more: only the names typed count.
	for _, name := range []string{"keep", "pre"} {
		out, code = orch("snapshot", map[string]any{"orch": map[string]any{"volumes": "orch-fs", "snapshot": name}})
		require.Equal(t, 0, code, out)
	}
	_, err = os.Stat(filepath.Join(s.StateDir, "snapshots", fsU))
	require.NoError(t, err, "the snapshot was taken")
	out, code = s.Salt(me, "salt_volumes.snapshots", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, `"pre"`)
	assert.Contains(t, out, `"keep"`, "the node's own snapshots_absent is not part of the run")
	for _, bad := range []struct {
		orch map[string]any
		says string
	}{
		{map[string]any{"volumes": "nope", "snapshot": "pre"}, "nope: no such volume"},
		{map[string]any{"volumes": []string{"orch-fs"}, "snapshot": "pre"}, "in one string, separated by commas"},
		{map[string]any{"volumes": "orch-fs", "snapshot": "pre", "snapshot_absent": "pre"}, "not both"},
	} {
		out, code = orch("snapshot", map[string]any{"orch": bad.orch})
		assert.NotEqual(t, 0, code, "%v", bad.orch)
		assert.Contains(t, out, bad.says)
	}
	for _, name := range []string{"keep", "pre"} {
		out, code = orch("snapshot", map[string]any{"orch": map[string]any{"volumes": "orch-fs", "snapshot_absent": name}})
		require.Equal(t, 0, code, out)
	}
	out, code = s.Salt(me, "salt_volumes.snapshots", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	assert.NotContains(t, out, `"pre"`)

	// Remove: only what is named; nothing named, a list (Salt would join
	// it with a pillar file's) or an unknown name removes nothing.
	for _, bad := range []struct {
		remove any
		says   string
	}{{nil, "name the volumes"}, {[]string{"orch-fs"}, "in one string"}, {"orch-fs, nope", "nope: no such volume"}} {
		out, code = orch("remove", map[string]any{"orch": map[string]any{"remove": bad.remove}})
		assert.NotEqual(t, 0, code)
		assert.Contains(t, out, bad.says)
		assert.True(t, recorded(fsU), "nothing removed")
	}
	out, code = orch("remove", map[string]any{"orch": map[string]any{"remove": "orch-fs, orch-blk"}})
	require.Equal(t, 0, code, out)
	assert.False(t, recorded(fsU))
	assert.False(t, recorded(u3))
	assert.True(t, recorded(ownU), "the node's own pillar volume is not part of another run")

	// The control plane's path: two volumes in one run, prepared and
	// removed; the node's own volume stays, and no wipe was asked for.
	a, b := uuid.NewString(), uuid.NewString()
	*uuids = append(*uuids, a, b)
	specs, err := json.Marshal([]any{vol("cp-a", a, me, nil), vol("cp-b", b, me, nil)})
	require.NoError(t, err)
	for _, action := range []string{"prepared", "unprepared"} {
		out, code = s.Salt(me, "salt_volumes.apply_volume", action, string(specs), "--out=json", "--static")
		require.Equal(t, 0, code, out)
		res := states(t, saltstack.JSON(t, out), me)
		assert.Len(t, res, 2, "the run's volumes only: %v", keys(res))
	}
	assert.False(t, recorded(a))
	assert.True(t, recorded(ownU), "a removal through apply_volume leaves the node's own pillar volume")

	out, code = s.Salt(me, "state.apply", "salt_volumes.unprepared", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	assert.False(t, recorded(ownU))
}

func keys(m map[string]map[string]any) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return strings.Join(ks, ", ")
}
