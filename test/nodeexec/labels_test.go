package nodeexec

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A label that the node's fstab may mount by (LABEL=, PARTLABEL=) is not
// handed to a new volume when another device already carries it: udev
// links whichever device it saw last, so the volume could be mounted in
// place of the node's own filesystem at the next boot. The refusal names
// the field, writes nothing, and a free label still works.
func TestLabelsOfTheNodeAreNotShadowed(t *testing.T) {
	n := newNode(t)
	// Labels unique to this run: the machine's loop devices are shared.
	tag := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	fsLabel, partName := "fs"+tag, "part-"+tag

	// The node's own filesystem and partition, which its fstab could name.
	own := fakeDisk(t, 32<<20)
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", fsLabel, own.Path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	fakeDisk(t, 32<<20, "-n", "1:0:0", "-c", "1:"+partName)

	t.Run("a filesystem label another device carries", func(t *testing.T) {
		u := n.newUUID()
		spec := sparseSpec("shadow-fs", u, "32Mi", map[string]any{"mkfsOptions": []string{"-L", fsLabel}})
		r := n.do("prepare", spec)
		require.Equal(t, 3, r.Code, "%s", r.Stdout)
		assert.Equal(t, "label_in_use", r.errCode())
		assert.Contains(t, r.errMsg(), "mkfsOptions: LABEL="+fsLabel+" is already carried by "+own.Path)
		assert.Contains(t, r.errMsg(), "choose another -L label")
		assertNothingWritten(t, n, u)

		// The same label in the attached form -Lvalue.
		spec["mkfsOptions"] = []string{"-L" + fsLabel}
		assert.Equal(t, "label_in_use", n.do("prepare", spec).errCode())
		assertNothingWritten(t, n, u)
	})

	t.Run("a GPT partition name another disk carries", func(t *testing.T) {
		disk := fakeDisk(t, 32<<20)
		before := sum(t, disk.Path)
		u := n.newUUID()
		spec := rawSpec(partName, u, disk.Path, map[string]any{"mode": "Block"})
		r := n.do("prepare", spec)
		require.Equal(t, 3, r.Code, "%s", r.Stdout)
		assert.Equal(t, "label_in_use", r.errCode())
		assert.Contains(t, r.errMsg(), "name: PARTLABEL="+partName+" is already carried by /dev/")
		assert.Equal(t, before, sum(t, disk.Path), "the refused disk was written")
		assertNothingWritten(t, n, u)
	})

	t.Run("free labels are used", func(t *testing.T) {
		u := n.newUUID()
		spec := sparseSpec("free-fs", u, "32Mi", map[string]any{"mkfsOptions": []string{"-L", "free" + tag}})
		r := n.ok("prepare", spec)
		assert.Equal(t, "free"+tag, blkid(t, r.str("devicePath"))["LABEL"])
		// A rerun finds the label on the volume's own device: not a conflict.
		n.ok("prepare", spec)
		n.ok("unprepare", spec)

		disk := fakeDisk(t, 32<<20)
		u = n.newUUID()
		blk := rawSpec("free-"+tag, u, disk.Path, map[string]any{"mode": "Block"})
		n.ok("prepare", blk)
		n.ok("prepare", blk)
		n.ok("unprepare", blk, "--wipe")
	})
}

// assertNothingWritten: no record, staged record or sparse file of u.
func assertNothingWritten(t *testing.T, n *node, u string) {
	t.Helper()
	_, err := os.Stat(filepath.Join(n.dir, "volumes", u+".json"))
	assert.ErrorIs(t, err, os.ErrNotExist, "a record was written")
	staged, _ := filepath.Glob(filepath.Join(n.dir, "volumes", ".*"))
	assert.Empty(t, staged, "a staged record was left")
	left, _ := filepath.Glob(filepath.Join(n.dir, "sparse", u+"*"))
	assert.Empty(t, left, "a sparse file was made")
}
