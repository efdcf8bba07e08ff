package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// A node gone for good is drained: its volumes leave salt-volumes whatever
// their phase, and nothing on its disks is touched.
func TestNodeForget(t *testing.T) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	p := newPlane(t, s)
	p.Start("")
	c := p.Client()
	ctx := context.Background()

	for _, args := range [][]string{
		{"create", "drain-fs", "--node", s.MinionID, "--size", "32Mi", "--wait", "--timeout", "2m"},
		{"create", "drain-blk", "--node", s.MinionID, "--size", "32Mi", "--mode", "Block", "--wait", "--timeout", "2m"},
	} {
		out, errs, code := p.CLI(args...)
		require.Equal(t, 0, code, out+errs)
		uuids = append(uuids, getJSON(t, p, args[1]).Spec.UUID)
	}
	// The node goes away for good: a volume created now stays Pending.
	s.StopMinion(s.MinionID)
	w := p.Watch("drain-late")
	v, err := c.Create(ctx, map[string]any{"name": "drain-late", "node": s.MinionID, "sparseLoopDevice": map[string]any{"size": "32Mi"}})
	require.NoError(t, err)
	uuids = append(uuids, v.Spec.UUID)
	w.Until(t, time.Minute, phaseIs("Pending"))

	out, errs, code := p.CLI("node", "forget", s.MinionID)
	assert.Equal(t, 3, code, "no answer, no drain: %s", errs)
	assert.Contains(t, out, "drain-fs")
	assert.Contains(t, out, "drain-late", "every volume of the node is listed before anything goes")
	assert.Contains(t, errs, "not confirmed; nothing was forgotten")
	list, err := c.List(ctx, s.MinionID)
	require.NoError(t, err)
	assert.Len(t, list, 3)

	launched := p.Metric("salt_volumes_jobs_launched_total")
	out, errs, code = p.CLI("node", "forget", s.MinionID, "--yes")
	require.Equal(t, 0, code, out+errs)
	assert.Contains(t, out, "3 volume(s) forgotten")
	require.Eventually(t, func() bool {
		l, err := c.List(ctx, s.MinionID)
		return err == nil && len(l) == 0
	}, 30*time.Second, 100*time.Millisecond, "the node's volumes are gone, Available and Pending alike")
	assert.Equal(t, launched, p.Metric("salt_volumes_jobs_launched_total"), "no state run was started for the drain")

	// Nothing on the node was touched: files, loop devices, links stay.
	for i, name := range []string{"drain-fs", "drain-blk"} {
		u := uuids[i]
		_, err := os.Stat(filepath.Join(s.StateDir, "sparse", u))
		assert.NoError(t, err, "%s: sparse file kept", name)
		_, err = os.Stat(filepath.Join(s.StateDir, "volumes", u+".json"))
		assert.NoError(t, err, "%s: node record kept", name)
	}
	_, err = filepath.EvalSymlinks("/dev/disk/by-uuid/" + uuids[0])
	assert.NoError(t, err, "the filesystem volume's link still resolves")
	_, err = filepath.EvalSymlinks("/dev/disk/by-partuuid/" + uuids[1])
	assert.NoError(t, err, "the block volume's link still resolves")

	out, errs, code = p.CLI("node", "forget", "node-9", "--yes")
	assert.Equal(t, 0, code, errs)
	assert.Contains(t, out, "no volumes; nothing to forget")
}
