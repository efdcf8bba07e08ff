package nodeexec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A loop device stands in for a raw disk.
func TestRawWholeDisk(t *testing.T) {
	for _, mode := range []string{"Filesystem", "Block"} {
		t.Run(mode, func(t *testing.T) {
			n := newNode(t)
			disk := fakeDisk(t, 64<<20)
			u := n.newUUID()
			spec := rawSpec("raw-"+strings.ToLower(mode), u, disk.Path, map[string]any{"mode": mode})

			r := n.ok("prepare", spec)
			assert.Equal(t, "rawBlockDevice", r.str("type"))
			dev := r.str("devicePath")
			resolves(t, r.str("persistentPath"), dev)
			if mode == "Block" {
				assert.Equal(t, disk.Path+"p1", dev)
				assert.Equal(t, u, blkid(t, dev)["PART_ENTRY_UUID"])
				out, err := exec.Command("sgdisk", "-v", disk.Path).CombinedOutput()
				require.NoError(t, err)
				assert.Contains(t, string(out), "No problems found")
			} else {
				assert.Equal(t, disk.Path, dev)
				assert.Equal(t, u, blkid(t, dev)["UUID"])
				assert.Equal(t, float64(64<<20), r.Out["size"])
			}
			assert.Equal(t, false, n.ok("prepare", spec).Out["changed"])

			// Delete keeps the data by default...
			n.ok("unprepare", spec)
			_, err := os.Lstat(r.str("persistentPath"))
			assert.True(t, os.IsNotExist(err))
			if mode == "Block" {
				assert.Equal(t, u, blkid(t, disk.Path+"p1")["PART_ENTRY_UUID"], "GPT kept without --wipe")
			} else {
				assert.Equal(t, u, blkid(t, disk.Path)["UUID"], "filesystem kept without --wipe")
			}
			// ...and it is no longer ours: neither a new volume nor the same
			// spec again may take it (a UUID in a spec proves nothing once
			// the record is gone).
			u2 := n.newUUID()
			spec2 := rawSpec("raw-again", u2, disk.Path, map[string]any{"mode": mode})
			before := sum(t, disk.Path)
			refused := n.do("prepare", spec2)
			assert.Equal(t, 3, refused.Code, refused.Stdout)
			assert.Equal(t, "foreign_data", refused.errCode())
			again := n.do("prepare", spec)
			assert.Equal(t, 3, again.Code, again.Stdout)
			assert.Equal(t, "uuid_in_use", again.errCode())
			assert.Equal(t, before, sum(t, disk.Path))
			// Unprepare without a record touches nothing, --wipe included.
			gone := n.ok("unprepare", spec, "--wipe")
			assert.Equal(t, "absent", gone.str("state"))
			assert.Equal(t, before, sum(t, disk.Path))
			// Wiping it is the owner's call: then the device is blank again.
			out, err := exec.Command("wipefs", "-a", disk.Path).CombinedOutput()
			require.NoError(t, err, "%s", out)
			if mode == "Block" {
				_ = loopdev.RemovePartition(disk.Name, 1)
			}
			back := n.ok("prepare", spec)
			assert.Equal(t, dev, back.str("devicePath"))

			// --wipe erases exactly this volume's signature; then a new
			// volume can be created on the device.
			n.ok("unprepare", spec, "--wipe")
			if mode == "Block" {
				_, err := os.Stat(disk.Path + "p1")
				assert.True(t, os.IsNotExist(err), "the kernel partition is gone")
				assert.Empty(t, blkid(t, disk.Path)["PTTYPE"])
			} else {
				assert.Empty(t, blkid(t, disk.Path)["TYPE"])
			}
			r2 := n.ok("prepare", spec2)
			resolves(t, r2.str("persistentPath"), r2.str("devicePath"))
			n.ok("unprepare", spec2, "--wipe")
		})
	}
}

// A partition of a disk with other partitions: we touch only ours.
func TestRawPartitions(t *testing.T) {
	n := newNode(t)
	disk := fakeDisk(t, 96<<20, "-n", "1:2048:+32M", "-n", "2:0:+32M", "-n", "3:0:0")
	parts := addPartitions(t, disk, [2]int64{2048 * 512, 32 << 20}, [2]int64{(2048 + 65536) * 512, 32 << 20})
	p1, p2 := parts[0], parts[1]
	require.Equal(t, disk.Path+"p1", p1)

	// Partition 1 as a filesystem volume.
	u1 := n.newUUID()
	fs := rawSpec("part-fs", u1, p1, nil)
	r := n.ok("prepare", fs)
	assert.Equal(t, p1, r.str("devicePath"))
	assert.Equal(t, "loop", filepath.Base(r.str("deviceName"))[:4])
	resolves(t, "/dev/disk/by-uuid/"+u1, p1)
	p1sum := sum(t, p1)

	// Partition 2 as a block volume: only its GUID changes.
	u2 := n.newUUID()
	blk := rawSpec("part-blk", u2, p2, map[string]any{"mode": "Block"})
	before, err := exec.Command("sgdisk", "-p", disk.Path).Output()
	require.NoError(t, err)
	r = n.ok("prepare", blk)
	assert.Equal(t, p2, r.str("devicePath"))
	assert.Equal(t, float64(32<<20), r.Out["size"])
	resolves(t, "/dev/disk/by-partuuid/"+u2, p2)
	info, err := exec.Command("sgdisk", "-i", "2", disk.Path).Output()
	require.NoError(t, err)
	assert.Contains(t, string(info), "Partition unique GUID: "+strings.ToUpper(u2))
	after, err := exec.Command("sgdisk", "-p", disk.Path).Output()
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after), "layout, names and types unchanged")
	v, err := exec.Command("sgdisk", "-v", disk.Path).CombinedOutput()
	require.NoError(t, err)
	assert.Contains(t, string(v), "No problems found", "both GPT copies stay consistent")
	assert.Equal(t, p1sum, sum(t, p1), "the neighbouring volume is untouched")

	// --wipe on a partition volume resets its GUID; the table stays.
	n.ok("unprepare", blk, "--wipe")
	assert.NotEqual(t, u2, blkid(t, p2)["PART_ENTRY_UUID"])
	assert.NotEmpty(t, blkid(t, p2)["PART_ENTRY_UUID"])
	after, _ = exec.Command("sgdisk", "-p", disk.Path).Output()
	assert.Equal(t, string(before), string(after))
	n.ok("unprepare", fs, "--wipe")
	assert.Empty(t, blkid(t, p1)["TYPE"])
}

// Block volumes on sibling partitions of one disk, prepared at once: each
// gets its GUID (the table is rewritten by one prepare at a time, none
// lost), and the whole disk is still refused.
func TestSiblingPartitions(t *testing.T) {
	n := newNode(t)
	disk := fakeDisk(t, 64<<20, "-n", "1:2048:+8M", "-n", "2:0:+8M", "-n", "3:0:+8M", "-n", "4:0:+8M")
	const mib = 1 << 20
	parts := addPartitions(t, disk, [2]int64{1 * mib, 8 * mib}, [2]int64{9 * mib, 8 * mib}, [2]int64{17 * mib, 8 * mib}, [2]int64{25 * mib, 8 * mib})
	specs := make([]map[string]any, len(parts))
	uuids := make([]string, len(parts))
	for i, p := range parts {
		uuids[i] = n.newUUID()
		specs[i] = rawSpec(fmt.Sprintf("sib-%d", i+1), uuids[i], p, map[string]any{"mode": "Block"})
	}
	results := make([]run, len(parts))
	var wg sync.WaitGroup
	for i := range parts {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = n.do("prepare", specs[i]) }()
	}
	wg.Wait()
	for i, r := range results {
		require.Equal(t, 0, r.Code, "sib-%d: %s %s", i+1, r.Stdout, r.Stderr)
	}
	for i, p := range parts {
		assert.Equal(t, uuids[i], blkid(t, p)["PART_ENTRY_UUID"], "partition %d carries its volume's GUID", i+1)
		resolves(t, "/dev/disk/by-partuuid/"+uuids[i], p)
	}
	v, err := exec.Command("sgdisk", "-v", disk.Path).CombinedOutput()
	require.NoError(t, err)
	assert.Contains(t, string(v), "No problems found")
	refuse(t, n, rawSpec("whole", n.newUUID(), disk.Path, map[string]any{"mode": "Block"}), disk.Path, "device_conflict", "sib-")
	for _, sp := range specs {
		n.ok("unprepare", sp, "--wipe")
	}
}

// udev has the kernel read a disk's table again a moment after a write to
// it, and the disk's partitions are away meanwhile (seen on a booted
// guest: a Block volume on sda2 failed with "reading the size of sda2: no
// such device" right after its own GUID was written). The binary is
// stopped after the GUID step, the table is read again (this kernel has
// no GPT parser, so the partitions go), it goes on, and the partitions
// come back 300 ms later, as a udev re-read brings them back: the prepare
// waits for its partition instead of failing.
func TestPartitionAwayAfterItsGUIDIsSet(t *testing.T) {
	n := newNode(t)
	disk := fakeDisk(t, 64<<20, "-n", "1:2048:+16M", "-n", "2:0:+16M")
	const mib = 1 << 20
	layout := [][2]int64{{1 * mib, 16 * mib}, {17 * mib, 16 * mib}}
	p2 := addPartitions(t, disk, layout...)[1]
	u := n.newUUID()
	spec := rawSpec("away-blk", u, p2, map[string]any{"mode": "Block"})

	var out, errb bytes.Buffer
	cmd := n.start([]string{failpoint.PauseEnv + "=guid-set"}, spec, &out, &errb, "prepare", "--spec", "-")
	stopped := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		s := string(b)
		return err == nil && strings.HasPrefix(s[strings.LastIndex(s, ")")+1:], " T")
	}
	testenv.Eventually(t, 30*time.Second, "the prepare stops after guid-set", func() (bool, string) {
		return stopped(), "not stopped yet"
	})
	require.NoError(t, loopdev.Reread(disk.Name))
	_, err := os.Stat("/sys/class/block/" + filepath.Base(p2))
	require.ErrorIs(t, err, os.ErrNotExist, "the table read again: the partitions are away")
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	time.Sleep(300 * time.Millisecond)
	addPartitions(t, disk, layout...)
	require.NoError(t, cmd.Wait(), "prepare: %s %s", out.String(), errb.String())
	var res struct{ DevicePath string }
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	assert.Equal(t, p2, res.DevicePath)
	assert.Equal(t, u, blkid(t, p2)["PART_ENTRY_UUID"])
	n.ok("unprepare", spec, "--wipe")
}

// The kernel numbers a disk's partitions anew when it reads the table
// again (udev has it do so after a table is written): a volume on one
// partition is still found by its disk and index, and the sibling that
// took its old device number is not mistaken for it.
func TestPartitionsRenumbered(t *testing.T) {
	n := newNode(t)
	disk := fakeDisk(t, 48<<20, "-n", "1:2048:+16M", "-n", "2:0:+16M")
	ext := [][2]int64{{1 << 20, 16 << 20}, {17 << 20, 16 << 20}}
	parts := addPartitions(t, disk, ext...)
	fs := rawSpec("renum-fs", n.newUUID(), parts[1], nil)
	n.ok("prepare", fs)
	// What a re-read leaves: the number recorded for partition 2 now names
	// partition 1 (the kernel gave it out again). Numbers are not handed
	// out again at will here, so the record is made to say it.
	p1num, err := os.ReadFile("/sys/class/block/" + filepath.Base(parts[0]) + "/dev")
	require.NoError(t, err)
	recPath := filepath.Join(n.dir, "volumes", fs["uuid"].(string)+".json")
	b, err := os.ReadFile(recPath)
	require.NoError(t, err)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(b, &rec))
	require.Equal(t, float64(2), rec["partNumber"], "a partition is recorded with its index")
	rec["deviceNum"] = strings.TrimSpace(string(p1num))
	b, err = json.Marshal(rec)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(recPath, b, 0o600))

	blk := rawSpec("renum-blk", n.newUUID(), parts[0], map[string]any{"mode": "Block"})
	r := n.ok("prepare", blk)
	assert.Equal(t, parts[0], r.str("devicePath"))
	info := n.ok("info", fs)
	assert.Equal(t, "prepared", info.str("state"))
	assert.Equal(t, parts[1], info.str("devicePath"), "found by its disk and index")
	assert.Equal(t, false, n.ok("prepare", fs).Out["changed"])
	n.ok("unprepare", blk, "--wipe")
	n.ok("unprepare", fs, "--wipe")
}

func TestRefusalsWriteNothing(t *testing.T) {
	n := newNode(t)

	t.Run("foreign filesystem", func(t *testing.T) {
		disk := fakeDisk(t, 32<<20)
		out, err := exec.Command("mkfs.ext4", "-q", "-F", disk.Path).CombinedOutput()
		require.NoError(t, err, string(out))
		refuse(t, n, rawSpec("f", n.newUUID(), disk.Path, nil), disk.Path, "foreign_data", "ext4")
	})
	t.Run("foreign partition table", func(t *testing.T) {
		disk := fakeDisk(t, 32<<20, "-n", "1:0:0")
		refuse(t, n, rawSpec("f", n.newUUID(), disk.Path, map[string]any{"mode": "Block"}), disk.Path, "foreign_data", "gpt")
		refuse(t, n, rawSpec("f", n.newUUID(), disk.Path, nil), disk.Path, "foreign_data", "gpt")
	})
	t.Run("dos partition table", func(t *testing.T) {
		disk := fakeDisk(t, 32<<20)
		f, err := os.OpenFile(disk.Path, os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteAt([]byte{0x80, 0, 0, 0, 0x83}, 446)
		require.NoError(t, err)
		_, err = f.WriteAt([]byte{0x55, 0xAA}, 510)
		require.NoError(t, err)
		f.Close()
		refuse(t, n, rawSpec("f", n.newUUID(), disk.Path, nil), disk.Path, "foreign_data", "dos")
	})
	t.Run("mounted", func(t *testing.T) {
		disk := fakeDisk(t, 32<<20)
		out, err := exec.Command("mkfs.ext4", "-q", "-F", disk.Path).CombinedOutput()
		require.NoError(t, err, string(out))
		mp := mount(t, disk.Path)
		r := n.do("prepare", rawSpec("f", n.newUUID(), disk.Path, nil))
		assert.Equal(t, 3, r.Code)
		assert.Equal(t, "in_use", r.errCode())
		assert.Contains(t, r.errMsg(), mp)
	})
	t.Run("partition of a disk with a foreign filesystem", func(t *testing.T) {
		disk := fakeDisk(t, 64<<20, "-n", "1:2048:+16M", "-n", "2:0:+16M")
		parts := addPartitions(t, disk, [2]int64{2048 * 512, 16 << 20})
		out, err := exec.Command("mkfs.ext4", "-q", "-F", parts[0]).CombinedOutput()
		require.NoError(t, err, string(out))
		refuse(t, n, rawSpec("f", n.newUUID(), parts[0], map[string]any{"mode": "Block"}), disk.Path, "foreign_data", "ext4")
	})
	t.Run("whole disk that has partitions", func(t *testing.T) {
		disk := fakeDisk(t, 64<<20, "-n", "1:2048:+16M")
		addPartitions(t, disk, [2]int64{2048 * 512, 16 << 20})
		refuse(t, n, rawSpec("f", n.newUUID(), disk.Path, nil), disk.Path, "foreign_data", "")
	})
	t.Run("not a block device", func(t *testing.T) {
		r := n.do("prepare", rawSpec("f", n.newUUID(), "/dev/null", nil))
		assert.Equal(t, 3, r.Code)
		assert.Equal(t, "not_block_device", r.errCode())
	})
	t.Run("symlink escaping /dev", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "disk.img")
		require.NoError(t, os.WriteFile(target, make([]byte, 4<<20), 0o600))
		link := "/dev/sv-test-escape-" + n.newUUID()[:8]
		require.NoError(t, os.Symlink(target, link))
		t.Cleanup(func() { os.Remove(link) })
		before := sum(t, target)
		r := n.do("prepare", rawSpec("f", n.newUUID(), link, nil))
		assert.Equal(t, 3, r.Code)
		assert.Equal(t, "symlink_escape", r.errCode())
		assert.Equal(t, before, sum(t, target))
	})
	t.Run("device held by another device", func(t *testing.T) {
		// A loop device backed by our disk does not register as a holder; a
		// device-mapper table does.
		if _, err := exec.LookPath("dmsetup"); err != nil {
			t.Skip("needs dmsetup (package dmsetup) to stack a device-mapper device")
		}
		if _, err := os.Stat("/dev/mapper/control"); err != nil {
			t.Skip("needs device-mapper in the kernel (/dev/mapper/control)")
		}
		disk := fakeDisk(t, 32<<20)
		name := "sv-test-" + n.newUUID()[:8]
		table := "0 65536 linear " + disk.Path + " 0"
		out, err := exec.Command("dmsetup", "create", name, "--table", table).CombinedOutput()
		if err != nil {
			t.Skipf("dmsetup create failed (%s): cannot stack a device here", strings.TrimSpace(string(out)))
		}
		t.Cleanup(func() { _ = exec.Command("dmsetup", "remove", name).Run() })
		r := n.do("prepare", rawSpec("f", n.newUUID(), disk.Path, nil))
		assert.Equal(t, 3, r.Code)
		assert.Equal(t, "in_use", r.errCode())
		assert.Contains(t, r.errMsg(), "held by")
	})
	_, err := os.ReadDir(filepath.Join(n.dir, "volumes"))
	if err == nil {
		recs, _ := filepath.Glob(filepath.Join(n.dir, "volumes", "*.json"))
		assert.Empty(t, recs, "refused prepares leave no state behind")
	}
}

// refuse asserts a refusal (exit 3) that leaves the device byte for byte.
func refuse(t *testing.T, n *node, spec map[string]any, dev, code, mention string) {
	t.Helper()
	before := sum(t, dev)
	r := n.do("prepare", spec)
	assert.Equal(t, 3, r.Code, r.Stdout)
	assert.Equal(t, code, r.errCode())
	assert.Contains(t, r.errMsg(), mention)
	assert.Contains(t, r.errMsg(), "rawBlockDevice.devicePath", "the message names the field")
	assert.Equal(t, before, sum(t, dev), "a refusal writes nothing")
}
