package nodeexec

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
)

// fsSize is what df shows for the filesystem mounted at mp.
func fsSize(t *testing.T, mp string) int64 {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(mp, &st))
	return int64(st.Blocks) * st.Bsize
}

// Growing a sparse volume: prepare with the larger size. ext4 while
// mounted, xfs while not, Block with the partition grown in table and
// kernel; what was written stays; shrinking is refused.
func TestGrowSparse(t *testing.T) {
	n := newNode(t)

	// Online ext4 growth needs CAP_SYS_RESOURCE, which this machine's root
	// lacks (CapEff bit 24): ext4 grows offline here, xfs online, and the
	// booted guest grows a mounted ext4 (test/booted).
	t.Run("xfs, mounted", func(t *testing.T) {
		u := n.newUUID()
		spec := func(size string) map[string]any {
			return sparseSpec("grow-xfs", u, size, map[string]any{"fsType": "xfs"})
		}
		r := n.ok("prepare", spec("300Mi"))
		mp := mount(t, r.str("persistentPath"))
		data := make([]byte, 1<<20)
		_, _ = rand.Read(data)
		require.NoError(t, os.WriteFile(filepath.Join(mp, "kept"), data, 0o600))
		before := fsSize(t, mp)

		r = n.ok("prepare", spec("400Mi"))
		assert.Equal(t, float64(400<<20), r.Out["size"])
		assert.Equal(t, true, r.Out["changed"])
		st := steps(r.Stderr)
		for _, s := range []string{"file-grown", "loop-grown", "fs-grown", "grown"} {
			assert.Contains(t, st, s)
		}
		assert.Greater(t, fsSize(t, mp), before+90<<20, "df shows the new size at once (online)")
		got, err := os.ReadFile(filepath.Join(mp, "kept"))
		require.NoError(t, err)
		assert.Equal(t, data, got, "the file written before is intact")
		assert.Equal(t, false, n.ok("prepare", spec("400Mi")).Out["changed"], "converged")
		r = n.do("prepare", spec("300Mi"))
		assert.Equal(t, "conflict", r.errCode())
		assert.Contains(t, r.errMsg(), "shrinking is refused")
		umount(t, mp)
		n.ok("unprepare", spec("400Mi"))
	})

	t.Run("ext4, not mounted", func(t *testing.T) {
		u := n.newUUID()
		r := n.ok("prepare", sparseSpec("grow-ext4", u, "32Mi", nil))
		mp := mount(t, r.str("persistentPath"))
		require.NoError(t, os.WriteFile(filepath.Join(mp, "kept"), []byte("ext4 data"), 0o600))
		umount(t, mp)

		r = n.ok("prepare", sparseSpec("grow-ext4", u, "64Mi", nil))
		assert.Equal(t, float64(64<<20), r.Out["size"])
		mp = mount(t, r.str("persistentPath"))
		assert.Greater(t, fsSize(t, mp), int64(48<<20), "about 64Mi less ext4 overhead (it was under 32Mi)")
		got, err := os.ReadFile(filepath.Join(mp, "kept"))
		require.NoError(t, err)
		assert.Equal(t, "ext4 data", string(got))
		umount(t, mp)
		n.ok("unprepare", sparseSpec("grow-ext4", u, "64Mi", nil))
	})

	t.Run("Block: table and kernel agree", func(t *testing.T) {
		u := n.newUUID()
		spec := func(size string) map[string]any {
			return sparseSpec("grow-blk", u, size, map[string]any{"mode": "Block"})
		}
		r := n.ok("prepare", spec("16Mi"))
		part := r.str("devicePath")
		data := make([]byte, 1<<20)
		_, _ = rand.Read(data)
		f, err := os.OpenFile(part, os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteAt(data, 8<<20)
		require.NoError(t, err)
		require.NoError(t, f.Close())

		r = n.ok("prepare", spec("48Mi"))
		assert.Contains(t, steps(r.Stderr), "table-grown")
		start, length, err := gpt.Extent(48<<20, 512)
		require.NoError(t, err)
		assert.Equal(t, float64(length), r.Out["size"])
		assert.Equal(t, part, r.str("devicePath"), "the same partition, grown in place")
		p, isPart, err := blockdev.Partition(filepath.Base(part))
		require.NoError(t, err)
		require.True(t, isPart)
		assert.Equal(t, start, p.Start)
		assert.Equal(t, length, p.Size, "the kernel's partition has the table's new size")
		out, err := exec.Command("sgdisk", "-v", r.str("backingFile")).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Contains(t, string(out), "No problems found", "both tables consistent, the backup at the new end")
		got := make([]byte, len(data))
		f, err = os.Open(part)
		require.NoError(t, err)
		_, err = f.ReadAt(got, 8<<20)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		assert.Equal(t, data, got)
		n.ok("unprepare", spec("48Mi"))
	})
}

// A grow killed after each of its steps is finished by the next run.
func TestGrowKilledAtEveryStepConverges(t *testing.T) {
	for _, mode := range []string{"Filesystem", "Block"} {
		t.Run(mode, func(t *testing.T) {
			n := newNode(t)
			spec := func(u, size string) map[string]any {
				return sparseSpec("grow-crash", u, size, map[string]any{"mode": mode})
			}
			probe := n.newUUID()
			n.ok("prepare", spec(probe, "16Mi"))
			grow := steps(n.ok("prepare", spec(probe, "32Mi")).Stderr)
			n.ok("unprepare", spec(probe, "32Mi"))
			require.Contains(t, grow, "grown")
			for _, step := range grow {
				if step == "prepared" {
					continue
				}
				u := n.newUUID()
				n.ok("prepare", spec(u, "16Mi"))
				killed := n.exec([]string{failpoint.CrashEnv + "=" + step}, mustJSON(t, spec(u, "32Mi")), "prepare", "--spec", "-")
				require.Equal(t, -1, killed.Code, "prepare must be killed after %s", step)
				r := n.ok("prepare", spec(u, "32Mi"))
				want := int64(32 << 20)
				if mode == "Block" {
					_, want, _ = gpt.Extent(32<<20, 512)
				}
				assert.Equal(t, float64(want), r.Out["size"], "grown after a kill at %s", step)
				assert.Equal(t, false, n.ok("prepare", spec(u, "32Mi")).Out["changed"], "converged after a kill at %s", step)
				if mode == "Filesystem" {
					out, err := exec.Command("e2fsck", "-f", "-n", r.str("devicePath")).CombinedOutput()
					assert.NoError(t, err, "a clean filesystem after a kill at %s: %s", step, out)
					assert.True(t, strings.Contains(string(out), "/8192 blocks") || strings.Contains(string(out), "/32768 blocks"), "%s", out)
				}
				n.ok("unprepare", spec(u, "32Mi"))
			}
		})
	}
}
