package nodeexec

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// growDisk makes a fake disk larger, as enlarging a virtual disk does: its
// image grows and the loop device is told.
func growDisk(t *testing.T, d loopdev.Device, size int64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", d.Name, "loop", "backing_file"))
	require.NoError(t, err)
	require.NoError(t, os.Truncate(strings.TrimSpace(string(b)), size))
	require.NoError(t, loopdev.SetCapacity(d))
}

// Raw volumes grow to what their device has become, once prepare runs
// again (salt-volumes resize NAME --to-device): nothing else about the
// device may have changed, and a copy of the volume on a larger device is
// still not the volume.
func TestGrowRaw(t *testing.T) {
	t.Run("whole disk, ext4, offline", func(t *testing.T) {
		n := newNode(t)
		disk := fakeDisk(t, 32<<20)
		s := rawSpec("grow-raw-ext4", n.newUUID(), disk.Path, nil)
		n.ok("prepare", s)
		mp := mount(t, disk.Path)
		require.NoError(t, os.WriteFile(filepath.Join(mp, "kept"), []byte("before"), 0o600))
		before := fsSize(t, mp)
		umount(t, mp)

		growDisk(t, disk, 64<<20)
		r := n.ok("prepare", s)
		assert.Equal(t, true, r.Out["changed"])
		assert.Contains(t, steps(r.Stderr), "fs-grown")
		assert.Contains(t, steps(r.Stderr), "grown")
		assert.Equal(t, float64(64<<20), r.Out["size"])
		assert.Equal(t, false, n.ok("prepare", s).Out["changed"], "grown once: converged")
		mp = mount(t, disk.Path)
		assert.Greater(t, fsSize(t, mp), before+28<<20, "the filesystem fills the grown disk")
		b, err := os.ReadFile(filepath.Join(mp, "kept"))
		require.NoError(t, err)
		assert.Equal(t, "before", string(b))
		umount(t, mp)
		out, err := exec.Command("e2fsck", "-f", "-n", disk.Path).CombinedOutput()
		assert.NoError(t, err, "%s", out)
		n.ok("unprepare", s, "--wipe")
	})

	t.Run("whole disk, xfs, mounted", func(t *testing.T) {
		n := newNode(t)
		disk := fakeDisk(t, 300<<20)
		s := rawSpec("grow-raw-xfs", n.newUUID(), disk.Path, map[string]any{"fsType": "xfs"})
		n.ok("prepare", s)
		mp := mount(t, disk.Path)
		before := fsSize(t, mp)
		growDisk(t, disk, 400<<20)
		r := n.ok("prepare", s)
		assert.Equal(t, float64(400<<20), r.Out["size"])
		assert.Greater(t, fsSize(t, mp), before+90<<20, "df shows the growth while mounted")
		umount(t, mp)
		n.ok("unprepare", s, "--wipe")
	})

	t.Run("whole disk, Block: our GPT to the new end, disk GUID kept", func(t *testing.T) {
		n := newNode(t)
		disk := fakeDisk(t, 32<<20)
		u := n.newUUID()
		s := rawSpec("grow-raw-blk", u, disk.Path, map[string]any{"mode": "Block"})
		r := n.ok("prepare", s)
		part := r.str("devicePath")
		guid := blkid(t, disk.Path)["PTUUID"]
		f, err := os.OpenFile(part, os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteAt([]byte("block data"), 4096)
		require.NoError(t, err)
		require.NoError(t, f.Close())

		growDisk(t, disk, 96<<20)
		r = n.ok("prepare", s)
		assert.Contains(t, steps(r.Stderr), "table-grown")
		assert.Equal(t, part, r.str("devicePath"))
		_, length, err := gpt.Extent(96<<20, 512)
		require.NoError(t, err)
		assert.Equal(t, float64(length), r.Out["size"], "the partition reaches the new end")
		out, err := exec.Command("sgdisk", "-v", disk.Path).CombinedOutput()
		require.NoError(t, err)
		assert.Contains(t, string(out), "No problems found", "backup table at the new end")
		assert.Equal(t, guid, blkid(t, disk.Path)["PTUUID"], "the disk GUID is kept")
		assert.Equal(t, u, blkid(t, part)["PART_ENTRY_UUID"])
		got := make([]byte, 10)
		f, err = os.Open(part)
		require.NoError(t, err)
		_, err = f.ReadAt(got, 4096)
		f.Close()
		require.NoError(t, err)
		assert.Equal(t, "block data", string(got))
		assert.Equal(t, false, n.ok("prepare", s).Out["changed"])
		info := n.ok("info", s)
		assert.Equal(t, "prepared", info.str("state"))
		n.ok("unprepare", s, "--wipe")
	})

	t.Run("a partition the operator grew, ext4", func(t *testing.T) {
		n := newNode(t)
		disk := fakeDisk(t, 64<<20, "-n", "1:2048:+16M")
		parts := addPartitions(t, disk, [2]int64{1 << 20, 16 << 20})
		s := rawSpec("grow-raw-part", n.newUUID(), parts[0], nil)
		n.ok("prepare", s)
		// What an operator does: the partition's end moved in the table
		// (same start), then the kernel told.
		out, err := exec.Command("sgdisk", "-d", "1", "-n", "1:2048:+40M", disk.Path).CombinedOutput()
		require.NoError(t, err, "%s", out)
		_, err = loopdev.EnsurePartition(disk.Name, 1, 1<<20, 40<<20)
		require.NoError(t, err)
		r := n.ok("prepare", s)
		assert.Contains(t, steps(r.Stderr), "fs-grown")
		assert.Equal(t, float64(40<<20), r.Out["size"])
		mp := mount(t, parts[0])
		assert.Greater(t, fsSize(t, mp), int64(36<<20))
		umount(t, mp)
		n.ok("unprepare", s, "--wipe")
	})

	t.Run("a copy on a larger disk is not the volume", func(t *testing.T) {
		n := newNode(t)
		disk := fakeDisk(t, 32<<20)
		s := rawSpec("grow-raw-copy", n.newUUID(), disk.Path, nil)
		n.ok("prepare", s)
		bigger := fakeDisk(t, 64<<20)
		out, err := exec.Command("dd", "if="+disk.Path, "of="+bigger.Path, "bs=1M", "conv=fsync", "status=none").CombinedOutput()
		require.NoError(t, err, "%s", out)
		moved := rawSpec("grow-raw-copy", s["uuid"].(string), bigger.Path, nil)
		before := sum(t, bigger.Path)
		r := n.do("prepare", moved)
		assert.Equal(t, 3, r.Code, r.Stdout)
		assert.Contains(t, []string{"device_changed", "uuid_in_use"}, r.errCode(), r.errMsg())
		assert.Equal(t, before, sum(t, bigger.Path), "nothing written to the copy")
		n.ok("unprepare", s, "--wipe")
	})
}

// A raw growth killed after any of its steps is finished by the next run.
func TestGrowRawKilledAtEveryStepConverges(t *testing.T) {
	for _, mode := range []string{"Filesystem", "Block"} {
		t.Run(mode, func(t *testing.T) {
			n := newNode(t)
			fresh := func() (map[string]any, loopdev.Device) {
				disk := fakeDisk(t, 32<<20)
				s := rawSpec("grow-raw-crash", n.newUUID(), disk.Path, map[string]any{"mode": mode})
				n.ok("prepare", s)
				growDisk(t, disk, 48<<20)
				return s, disk
			}
			s, _ := fresh()
			grow := steps(n.ok("prepare", s).Stderr)
			n.ok("unprepare", s, "--wipe")
			require.Contains(t, grow, "grown")
			t.Logf("steps of the growth: %v", grow)
			want := float64(48 << 20)
			if mode == "Block" {
				_, l, _ := gpt.Extent(48<<20, 512)
				want = float64(l)
			}
			for _, step := range grow {
				if step == "prepared" {
					continue
				}
				s, disk := fresh()
				killed := n.exec([]string{failpoint.CrashEnv + "=" + step}, mustJSON(t, s), "prepare", "--spec", "-")
				require.Equal(t, -1, killed.Code, "prepare must be killed after %s", step)
				r := n.ok("prepare", s)
				assert.Equal(t, want, r.Out["size"], "grown after a kill at %s", step)
				assert.Equal(t, false, n.ok("prepare", s).Out["changed"], "converged after a kill at %s", step)
				if mode == "Filesystem" {
					out, err := exec.Command("e2fsck", "-f", "-n", disk.Path).CombinedOutput()
					assert.NoError(t, err, "a clean filesystem after a kill at %s: %s", step, out)
				} else {
					out, err := exec.Command("sgdisk", "-v", disk.Path).CombinedOutput()
					require.NoError(t, err)
					assert.Contains(t, string(out), "No problems found", "after a kill at %s", step)
				}
				n.ok("unprepare", s, "--wipe")
			}
		})
	}
}
