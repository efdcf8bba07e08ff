package nodeexec

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allZero reads the whole device and tells where the first non-zero byte
// is (-1: none).
func allZero(t *testing.T, dev string) int64 {
	t.Helper()
	f, err := os.Open(dev)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, err := f.Read(buf)
		if i := bytes.IndexFunc(buf[:n], func(r rune) bool { return r != 0 }); i >= 0 {
			return off + int64(i)
		}
		off += int64(n)
		if err == io.EOF {
			return -1
		}
		require.NoError(t, err)
	}
}

// --wipe zeroes the whole volume and proves it: the first, the last and
// sixteen drawn blocks read back, the seed and offsets reported; every
// byte of the device really is zero afterwards, and a neighbouring
// partition is untouched.
func TestVerifiedWipe(t *testing.T) {
	n := newNode(t)
	for _, mode := range []string{"Filesystem", "Block"} {
		t.Run(mode, func(t *testing.T) {
			disk := fakeDisk(t, 48<<20)
			spec := rawSpec("wipe-"+map[string]string{"Filesystem": "fs", "Block": "blk"}[mode], n.newUUID(), disk.Path, map[string]any{"mode": mode})
			r := n.ok("prepare", spec)
			dev := r.str("devicePath")
			// A tenant's data: a file in the filesystem, bytes on the device.
			junk := make([]byte, 4<<20)
			_, _ = rand.Read(junk)
			if mode == "Filesystem" {
				mp := mount(t, dev)
				require.NoError(t, os.WriteFile(filepath.Join(mp, "data"), junk, 0o600))
				umount(t, mp)
			} else {
				f, err := os.OpenFile(dev, os.O_WRONLY, 0)
				require.NoError(t, err)
				_, err = f.WriteAt(junk, 8<<20)
				require.NoError(t, err)
				require.NoError(t, f.Close())
			}
			require.GreaterOrEqual(t, allZero(t, disk.Path), int64(0))

			r = n.ok("unprepare", spec, "--wipe")
			w, _ := r.Out["wiped"].(map[string]any)
			require.NotNil(t, w, "the wipe's evidence is reported: %s", r.Stdout)
			assert.Equal(t, disk.Path, w["device"], "the whole disk was the volume's")
			assert.Equal(t, float64(48<<20), w["bytes"])
			assert.NotZero(t, w["seed"])
			offs, _ := w["offsets"].([]any)
			require.Len(t, offs, 18)
			assert.Equal(t, float64(0), offs[0])
			assert.Equal(t, float64(48<<20-4096), offs[1])
			assert.Contains(t, steps(r.Stderr), "zero-verified")
			// The zeroing tells its bytes, from none to the whole device.
			p := progressOf(t, r.Stderr, "zeroing")
			require.GreaterOrEqual(t, len(p), 2, "%v", p)
			assert.Equal(t, [2]int64{0, 48 << 20}, p[0])
			assert.Equal(t, [2]int64{48 << 20, 48 << 20}, p[len(p)-1])
			assert.Equal(t, int64(-1), allZero(t, disk.Path), "every byte of the device reads zero")
		})
	}

	t.Run("a partition: only it", func(t *testing.T) {
		disk := fakeDisk(t, 64<<20, "-n", "1:2048:+16M", "-n", "2:0:+16M")
		parts := addPartitions(t, disk, [2]int64{1 << 20, 16 << 20}, [2]int64{17 << 20, 16 << 20})
		// The neighbour holds someone's bytes; the volume's partition
		// is blank when prepared, then a tenant writes on it.
		junk := make([]byte, 16<<20)
		_, _ = rand.Read(junk)
		f, err := os.OpenFile(parts[0], os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.Write(junk)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		neighbour := sum(t, parts[0])
		spec := rawSpec("wipe-part", n.newUUID(), parts[1], map[string]any{"mode": "Block"})
		n.ok("prepare", spec)
		f, err = os.OpenFile(parts[1], os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteAt(junk[:8<<20], 4<<20)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.GreaterOrEqual(t, allZero(t, parts[1]), int64(0))
		r := n.ok("unprepare", spec, "--wipe")
		w, _ := r.Out["wiped"].(map[string]any)
		require.NotNil(t, w, r.Stdout)
		assert.Equal(t, parts[1], w["device"], "the partition, not its disk")
		assert.Equal(t, int64(-1), allZero(t, parts[1]))
		assert.Equal(t, neighbour, sum(t, parts[0]), "the neighbouring partition untouched")
	})

	t.Run("a device that cannot be written: WipeUnverified, record kept", func(t *testing.T) {
		disk := fakeDisk(t, 32<<20)
		spec := rawSpec("wipe-ro", n.newUUID(), disk.Path, nil)
		n.ok("prepare", spec)
		require.NoError(t, exec.Command("blockdev", "--setro", disk.Path).Run())
		t.Cleanup(func() { _ = exec.Command("blockdev", "--setrw", disk.Path).Run() })
		before := sum(t, disk.Path)
		r := n.do("unprepare", spec, "--wipe")
		assert.Equal(t, 1, r.Code, r.Stdout)
		assert.Equal(t, "wipe_unverified", r.errCode())
		assert.Contains(t, r.errMsg(), "WipeUnverified: "+disk.Path)
		assert.Contains(t, r.errMsg(), "blockdev --setrw")
		assert.Equal(t, before, sum(t, disk.Path), "nothing written")
		assert.Equal(t, "prepared", n.ok("info", spec).str("state"), "the record stays: the device is still the volume's")
		other := rawSpec("wipe-other", n.newUUID(), disk.Path, nil)
		r = n.do("prepare", other)
		assert.Equal(t, "device_conflict", r.errCode(), "not offered to another volume")

		require.NoError(t, exec.Command("blockdev", "--setrw", disk.Path).Run())
		n.ok("unprepare", spec, "--wipe")
		assert.Equal(t, int64(-1), allZero(t, disk.Path))
	})
}
