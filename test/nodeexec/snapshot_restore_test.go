package nodeexec

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
)

// writeHello mounts the volume, writes content into /hello and unmounts it.
func writeHello(t *testing.T, link, content string) {
	t.Helper()
	mp := mount(t, link)
	require.NoError(t, os.WriteFile(filepath.Join(mp, "hello"), []byte(content), 0o600))
	umount(t, mp)
}

// snapshotBetween prepares a sparse volume of size whose /hello says
// "before" in snapshot s1 and "after" on the volume: its UUID, spec and
// prepare's answer.
func snapshotBetween(t *testing.T, n *node, name, size string) (string, map[string]any, run) {
	t.Helper()
	u, spec, r := n.prepareSparse(name, size, nil)
	writeHello(t, r.str("persistentPath"), "before\n")
	n.ok("snapshot", spec, "--name", "s1")
	writeHello(t, r.str("persistentPath"), "after\n")
	return u, spec, r
}

// noRestoreLeft checks that no restore record or copy is left beside the
// volume's file.
func noRestoreLeft(t *testing.T, n *node, u, when string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(n.dir, "sparse", u+".*"))
	assert.Empty(t, left, "no restore record or copy left %s", when)
}

// Restore in place: the volume's content goes back to the snapshot's, its
// UUID, loop device and persistent path stay, the snapshot stays; refused,
// with nothing changed, while anything uses the volume.
func TestSnapshotRestoreSparse(t *testing.T) {
	needDebugfs(t)
	n := newNode(t)
	u, spec, r := n.prepareSparse("restore-1", "64Mi", nil)
	dev, link, file := r.str("devicePath"), r.str("persistentPath"), r.str("backingFile")
	mp := mount(t, link)
	require.NoError(t, os.WriteFile(filepath.Join(mp, "hello"), []byte("before\n"), 0o600))
	n.ok("snapshot", spec, "--name", "s1")
	require.NoError(t, os.WriteFile(filepath.Join(mp, "hello"), []byte("after\n"), 0o600))

	// Mounted: refused, naming the mount.
	r = n.do("snapshot-restore", spec, "--name", "s1")
	assert.Equal(t, 3, r.Code, "%s", r.Stdout)
	assert.Equal(t, "in_use", r.errCode())
	assert.Contains(t, r.errMsg(), "mounted on "+mp)
	assert.Contains(t, r.errMsg(), "nothing was changed")
	umount(t, mp)
	assert.Equal(t, "after\n", debugfsCat(t, dev, "/hello"), "nothing changed while it was mounted")

	// Held open by a process (here, this test): refused, naming it.
	f, err := os.Open(dev)
	require.NoError(t, err)
	r = n.do("snapshot-restore", spec, "--name", "s1")
	f.Close()
	assert.Equal(t, 3, r.Code, "%s", r.Stdout)
	assert.Equal(t, "in_use", r.errCode())
	assert.Contains(t, r.errMsg(), "open by pid "+strconv.Itoa(os.Getpid()))
	devs, err := loopdev.Find(file)
	require.NoError(t, err)
	require.Len(t, devs, 1)
	assert.Equal(t, dev, devs[0].Path, "the loop device is the same")
	assert.Equal(t, "after\n", debugfsCat(t, dev, "/hello"), "nothing changed while it was open")

	// Names that are not snapshots of this volume.
	r = n.do("snapshot-restore", spec, "--name", "nope")
	assert.Equal(t, 2, r.Code, "%s", r.Stdout)
	assert.Equal(t, "snapshot_not_found", r.errCode())
	assert.Contains(t, r.errMsg(), "snapshot nope")
	r = n.do("snapshot-restore", spec)
	assert.Equal(t, 2, r.Code, "--name is required")

	start := time.Now()
	r = n.ok("snapshot-restore", spec, "--name", "s1")
	t.Logf("restore of a 64 MiB volume took %s (%s)", time.Since(start), r.str("took"))
	vol := r.Out["volume"].(map[string]any)
	assert.Equal(t, dev, vol["devicePath"], "the same loop device")
	assert.Equal(t, true, r.Out["sameDevice"])
	assert.Equal(t, "s1", r.str("snapshot"))
	st := steps(r.Stderr)
	assert.Contains(t, st, "restore-swapped")
	assert.Contains(t, st, "restored")
	assert.Equal(t, "sparse-copy", r.str("method"), "the host's ext4 shares no extents")
	copiedAll(t, r.Stderr, "copying")
	resolves(t, link, dev)
	assert.Equal(t, u, blkid(t, dev)["UUID"], "the volume keeps its UUID")
	noRestoreLeft(t, n, u, "after a restore")

	mp = mount(t, link)
	b, err := os.ReadFile(filepath.Join(mp, "hello"))
	require.NoError(t, err)
	assert.Equal(t, "before\n", string(b))
	umount(t, mp)
	list := n.ok("snapshots", spec).Out["snapshots"].([]any)
	require.Len(t, list, 1, "the snapshot stays")
	assert.Equal(t, "s1", list[0].(map[string]any)["name"])
	assert.Equal(t, "prepared", n.ok("info", spec).str("state"))

	// Again: a restore can be repeated.
	writeHello(t, link, "after again\n")
	n.ok("snapshot-restore", spec, "--name", "s1")
	assert.Equal(t, "before\n", debugfsCat(t, dev, "/hello"))

	// LVM volumes are restored by LVM's merge (test/booted): one not
	// prepared on this node is refused as any other, nothing read of LVM.
	lvm := map[string]any{"name": "restore-lvm", "uuid": n.newUUID(), "lvmLogicalVolume": map[string]any{"vgName": "vg0", "size": "64Mi"}}
	r = n.do("snapshot-restore", lvm, "--name", "s1")
	assert.Equal(t, 3, r.Code, "%s", r.Stdout)
	assert.Equal(t, "not_prepared", r.errCode())
	assert.Contains(t, r.errMsg(), "is not prepared on this node")

	n.ok("snapshot-delete", spec, "--name", "s1")
	n.ok("unprepare", spec)
}

// A volume grown since its snapshot keeps its size; a Block volume's table
// is laid out to its end again, its partition's bytes the snapshot's.
func TestSnapshotRestoreGrownBlock(t *testing.T) {
	n := newNode(t)
	u := n.newUUID()
	spec := func(size string) map[string]any {
		return sparseSpec("restore-blk", u, size, map[string]any{"mode": "Block"})
	}
	r := n.ok("prepare", spec("32Mi"))
	link := r.str("persistentPath")
	pattern := []byte(strings.Repeat("before-", 100))
	writeAt(t, link, 1<<20, pattern)
	n.ok("snapshot", spec("32Mi"), "--name", "s1")
	r = n.ok("prepare", spec("48Mi"))
	dev := r.str("devicePath")
	writeAt(t, link, 1<<20, []byte(strings.Repeat("after--", 100)))

	r = n.ok("snapshot-restore", spec("48Mi"), "--name", "s1")
	vol := r.Out["volume"].(map[string]any)
	_, want, _ := gpt.Extent(48<<20, 512)
	assert.Equal(t, float64(want), vol["size"], "the partition spans the grown volume")
	assert.Equal(t, dev, vol["devicePath"])
	resolves(t, link, dev)
	assert.Equal(t, u, blkid(t, link)["PART_ENTRY_UUID"])
	st, err := os.Stat(vol["backingFile"].(string))
	require.NoError(t, err)
	assert.Equal(t, int64(48<<20), st.Size(), "the volume keeps its grown size")
	got := make([]byte, len(pattern))
	f, err := os.Open(link)
	require.NoError(t, err)
	_, err = f.ReadAt(got, 1<<20)
	f.Close()
	require.NoError(t, err)
	assert.Equal(t, string(pattern), string(got))
	out, err := exec.Command("sgdisk", "-v", vol["backingFile"].(string)).CombinedOutput()
	assert.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "No problems found", "the table is whole at the new size")
	n.ok("snapshot-delete", spec("48Mi"), "--name", "s1")
	n.ok("unprepare", spec("48Mi"))
}

// A restore killed after each of its steps leaves the volume as before or
// as the snapshot, never a mix, and the next run finishes it.
func TestSnapshotRestoreKilledAtEveryStepConverges(t *testing.T) {
	needDebugfs(t)
	n := newNode(t)
	u, spec, r := snapshotBetween(t, n, "restore-crash", "32Mi")
	dev, link, file := r.str("devicePath"), r.str("persistentPath"), r.str("backingFile")
	all := steps(n.ok("snapshot-restore", spec, "--name", "s1").Stderr)
	t.Logf("steps: %v", all)
	require.Contains(t, all, "restore-recorded")
	require.Contains(t, all, "restored")
	for _, step := range all {
		writeHello(t, link, "after\n")
		killed := n.exec([]string{failpoint.CrashEnv + "=" + step}, mustJSON(t, spec), "snapshot-restore", "--spec", "-", "--name", "s1")
		require.Equal(t, -1, killed.Code, "snapshot-restore must be killed after %s: %s", step, killed.Stdout)
		// The volume's file is always one whole filesystem.
		got := debugfsCat(t, file, "/hello")
		assert.Contains(t, []string{"before\n", "after\n"}, got, "after a kill at %s", step)

		// The node reboots before anyone runs the restore again: the
		// boot's restore brings the volume back and names the unfinished
		// restore, whose record is still there.
		_, recErr := os.Stat(filepath.Join(n.dir, "sparse", u+".restore.json"))
		boot := n.ok("restore", nil)
		var warned []string
		for _, v := range boot.Out["volumes"].([]any) {
			if vol := v.(map[string]any); vol["uuid"] == u {
				ws, _ := vol["warnings"].([]any)
				for _, w := range ws {
					warned = append(warned, w.(string))
				}
			}
		}
		if recErr == nil {
			assert.Contains(t, strings.Join(warned, "\n"), "a restore from snapshot s1", "the boot's restore after a kill at %s", step)
		} else {
			assert.NotContains(t, strings.Join(warned, "\n"), "restore from snapshot", "the boot's restore after a kill at %s (no record left)", step)
		}

		r := n.ok("snapshot-restore", spec, "--name", "s1")
		t.Logf("killed after %s: the file said %q; the rerun finished %q with steps %v", step, got, r.str("finished"), steps(r.Stderr))
		vol := r.Out["volume"].(map[string]any)
		assert.Equal(t, dev, vol["devicePath"], "the same loop device after a kill at %s", step)
		resolves(t, link, dev)
		assert.Equal(t, u, blkid(t, dev)["UUID"])
		assert.Equal(t, "before\n", debugfsCat(t, dev, "/hello"), "restored after a kill at %s", step)
		devs, err := loopdev.Find(file)
		require.NoError(t, err)
		assert.Len(t, devs, 1, "one loop device after a kill at %s", step)
		noRestoreLeft(t, n, u, "after a kill at "+step)
		assert.Equal(t, "prepared", n.ok("info", spec).str("state"))
	}
	assert.Len(t, n.ok("snapshots", spec).Out["snapshots"].([]any), 1, "the snapshot stays")
	n.ok("snapshot-delete", spec, "--name", "s1")
	n.ok("unprepare", spec)
}

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

// A mount in another mount namespace, which this one's table does not
// show, refuses the restore too, naming the process whose namespace holds
// it.
func TestSnapshotRestoreMountedElsewhere(t *testing.T) {
	needDebugfs(t)
	n := newNode(t)
	_, spec, r := snapshotBetween(t, n, "restore-ns", "32Mi")
	dev, file := r.str("devicePath"), r.str("backingFile")
	holdOpen(t, mountAndWait, dev, t.TempDir())
	r = n.do("snapshot-restore", spec, "--name", "s1")
	assert.Equal(t, 3, r.Code, "%s", r.Stdout)
	assert.Equal(t, "in_use", r.errCode())
	assert.Contains(t, r.errMsg(), "in the mount namespace of pid")
	t.Logf("refused: %s", r.errMsg())
	assert.Equal(t, "after\n", debugfsCat(t, file, "/hello"))
	assert.Equal(t, "after\n", debugfsCat(t, dev, "/hello"), "nothing changed")
}

// A Filesystem volume grown since its snapshot keeps its size, and its
// filesystem (the snapshot's) is grown to it, ext4 and xfs, with the
// snapshot's data.
func TestSnapshotRestoreGrownFilesystem(t *testing.T) {
	n := newNode(t)
	for _, c := range []struct {
		fs         string
		small, big string
		bigB       int64
	}{{"ext4", "32Mi", "48Mi", 48 << 20}, {"xfs", "320Mi", "400Mi", 400 << 20}} {
		t.Run(c.fs, func(t *testing.T) {
			u := n.newUUID()
			spec := func(size string) map[string]any {
				return sparseSpec("restore-"+c.fs, u, size, map[string]any{"fsType": c.fs})
			}
			r := n.ok("prepare", spec(c.small))
			mp := mount(t, r.Out["persistentPath"].(string))
			require.NoError(t, os.WriteFile(filepath.Join(mp, "hello"), []byte("before\n"), 0o644))
			umount(t, mp)
			n.ok("snapshot", spec(c.small), "--name", "s1")
			r = n.ok("prepare", spec(c.big))
			mp = mount(t, r.Out["persistentPath"].(string))
			grown := fsSize(t, mp)
			umount(t, mp)
			r = n.ok("snapshot-restore", spec(c.big), "--name", "s1")
			vol := r.Out["volume"].(map[string]any)
			assert.Equal(t, float64(c.bigB), vol["size"], "the volume keeps its grown size")
			assert.Empty(t, r.Out["warnings"], "%s", r.Stdout)
			mp = mount(t, vol["persistentPath"].(string))
			assert.InEpsilon(t, grown, fsSize(t, mp), 0.02, "the filesystem is grown as a growth grows it")
			b, err := os.ReadFile(filepath.Join(mp, "hello"))
			require.NoError(t, err)
			assert.Equal(t, "before\n", string(b), "the snapshot's data")
			umount(t, mp)
			n.ok("snapshot-delete", spec(c.big), "--name", "s1")
			n.ok("unprepare", spec(c.big))
		})
	}
}
