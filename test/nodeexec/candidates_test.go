package nodeexec

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The report offers the devices a raw volume could take (#51): a blank
// partition is listed with its size and disk; one with a filesystem, one
// mounted, one a volume of ours, and the loop device carrying the
// partitions are not. Listing writes nothing.
func TestReportListsCandidateDisks(t *testing.T) {
	needLoop(t)
	n := newNode(t)
	disk := fakeDisk(t, 128<<20, "-n", "1:2048:+24M", "-n", "2:0:+24M", "-n", "3:0:+24M", "-n", "4:0:+24M")
	parts := addPartitions(t, disk,
		[2]int64{2048 * 512, 24 << 20}, [2]int64{2048*512 + 24<<20, 24 << 20},
		[2]int64{2048*512 + 48<<20, 24 << 20}, [2]int64{2048*512 + 72<<20, 24 << 20})
	blank, formatted, mounted, ours := parts[0], parts[1], parts[2], parts[3]
	for _, p := range []string{formatted, mounted} {
		out, err := exec.Command("mkfs.ext4", "-q", "-F", p).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	mount(t, mounted)
	n.ok("prepare", rawSpec("cand", n.newUUID(), ours, map[string]any{"mode": "Block"}))
	before := sum(t, disk.Path)

	disks := func() map[string]map[string]any {
		t.Helper()
		r := n.exec(nil, "", "list")
		require.Equal(t, 0, r.Code, r.Stderr)
		c, _ := r.Out["capacity"].(map[string]any)
		require.NotNil(t, c, r.Stdout)
		out := map[string]map[string]any{}
		list, _ := c["disks"].([]any)
		for _, d := range list {
			m := d.(map[string]any)
			if p, _ := m["path"].(string); strings.HasPrefix(p, disk.Path) {
				out[p] = m
			}
		}
		return out
	}
	got := disks()
	require.Contains(t, got, blank, "the blank partition is offered")
	assert.Equal(t, float64(24<<20), got[blank]["size"])
	assert.Equal(t, "partition of "+strings.TrimPrefix(disk.Path, "/dev/"), got[blank]["model"])
	for _, p := range []string{disk.Path, formatted, mounted, ours} {
		assert.NotContains(t, got, p)
	}
	assert.Len(t, got, 1)
	assert.Equal(t, before, sum(t, disk.Path), "listing wrote nothing")

	// Taken for a volume, it is offered no more.
	n.ok("prepare", rawSpec("cand2", n.newUUID(), blank, nil))
	assert.Empty(t, disks())
}
