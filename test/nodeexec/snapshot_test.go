package nodeexec

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
)

// Snapshots of sparse volumes: a point-in-time copy, taken with the
// volume's filesystem frozen while mounted, kept by the node beside the
// volume; a volume with snapshots is never removed with them unasked.
func TestSnapshotSparse(t *testing.T) {
	needDebugfs(t)
	n := newNode(t)
	u, spec, r := n.prepareSparse("snap-1", "64Mi", nil)
	mp := mount(t, r.str("persistentPath"))
	require.NoError(t, os.WriteFile(filepath.Join(mp, "hello"), []byte("before the snapshot\n"), 0o600))

	r = n.ok("snapshot", spec, "--name", "s1")
	assert.Equal(t, "taken", r.str("phase"))
	assert.Equal(t, true, r.Out["frozen"], "mounted: frozen for the copy")
	assert.Equal(t, "sparse-copy", r.str("method"), "the host's ext4 shares no extents")
	assert.Equal(t, float64(64<<20), r.Out["size"])
	assert.Less(t, r.Out["allocated"].(float64), float64(32<<20), "holes stay holes")
	st := steps(r.Stderr)
	assert.Contains(t, st, "frozen")
	assert.Contains(t, st, "snapshot-taken")
	// Its copy (made unfrozen, then brought up to date frozen) tells
	// its bytes.
	copiedAll(t, r.Stderr, "copying")
	img := r.str("image")
	takenAt := r.str("takenAt")

	require.NoError(t, os.WriteFile(filepath.Join(mp, "hello"), []byte("after the snapshot\n"), 0o600))
	umount(t, mp)
	assert.Equal(t, "before the snapshot\n", debugfsCat(t, img, "/hello"), "the snapshot keeps its moment")

	again := n.ok("snapshot", spec, "--name", "s1")
	assert.Equal(t, takenAt, again.str("takenAt"), "taking it again answers the one taken")
	r = n.do("snapshot", spec, "--name", "Bad/Name")
	assert.Equal(t, 2, r.Code)
	assert.Equal(t, "invalid_snapshot_name", r.errCode())
	r = n.do("snapshot", spec)
	assert.Equal(t, 2, r.Code, "--name is required")

	// Not mounted: no freeze, the loop device flushed instead.
	r = n.ok("snapshot", spec, "--name", "s2")
	assert.Equal(t, false, r.Out["frozen"])
	assert.Equal(t, "after the snapshot\n", debugfsCat(t, r.str("image"), "/hello"))
	copiedAll(t, r.Stderr, "copying")

	r = n.ok("snapshots", spec)
	list := r.Out["snapshots"].([]any)
	require.Len(t, list, 2)
	assert.Equal(t, "s1", list[0].(map[string]any)["name"])

	r = n.do("unprepare", spec)
	assert.Equal(t, 3, r.Code, "refused while it has snapshots")
	assert.Equal(t, "has_snapshots", r.errCode())
	assert.Contains(t, r.errMsg(), "(s1, s2)")
	_, err := os.Stat(n.dir + "/sparse/" + u)
	require.NoError(t, err, "nothing was removed")

	for _, s := range []string{"s1", "s2"} {
		n.ok("snapshot-delete", spec, "--name", s)
		n.ok("snapshot-delete", spec, "--name", s) // done already: fine
	}
	_, err = os.Stat(img)
	assert.True(t, os.IsNotExist(err), "the image is gone")
	n.ok("unprepare", spec)
}

// A crash in the middle of a copy leaves a record that says the partial
// image is ours: the next run removes it and copies again.
func TestSnapshotAfterCrashStartsOver(t *testing.T) {
	n := newNode(t)
	u := n.newUUID()
	spec := sparseSpec("snap-crash", u, "32Mi", nil)
	n.ok("prepare", spec)
	dir := filepath.Join(n.dir, "snapshots", u)
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "s1.json"),
		[]byte(`{"version":1,"name":"s1","volume":"snap-crash","volumeUUID":"`+u+`","phase":"taking","image":"`+filepath.Join(dir, "s1.img")+`"}`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "s1.img.part"), []byte("half a copy"), 0o600))
	r := n.ok("snapshot", spec, "--name", "s1")
	assert.Equal(t, "taken", r.str("phase"))
	assert.Equal(t, float64(32<<20), r.Out["size"])
	_, err := os.Stat(filepath.Join(dir, "s1.img.part"))
	assert.True(t, os.IsNotExist(err))
	n.ok("snapshot-delete", spec, "--name", "s1")
	n.ok("unprepare", spec)
}

// On a state dir on xfs with reflink, a snapshot shares the volume's
// extents: no copy at all.
func TestSnapshotReflinkOnXFS(t *testing.T) {
	n := reflinkNode(t)
	_, spec, _ := n.prepareSparse("snap-xfs", "64Mi", map[string]any{"mode": "Block"})
	r := n.ok("snapshot", spec, "--name", "s1")
	assert.Equal(t, "reflink", r.str("method"))
	assert.Equal(t, false, r.Out["frozen"], "a Block volume has no filesystem of ours to freeze")
	out, err := exec.Command("sgdisk", "-p", r.str("image")).CombinedOutput()
	require.NoError(t, err, string(out))
	assert.True(t, strings.Contains(string(out), "snap-xfs"), "the image carries the volume's GPT: %s", out)
	n.ok("snapshot-delete", spec, "--name", "s1")
	n.ok("unprepare", spec)
}

// Clones: a new volume from a snapshot, with an identity of its own, used
// beside its origin at once.
func TestCloneFromSnapshot(t *testing.T) {
	n := newNode(t)

	t.Run("ext4, larger than its snapshot", func(t *testing.T) {
		u1, u2 := n.newUUID(), n.newUUID()
		origin := sparseSpec("origin-ext4", u1, "64Mi", nil)
		r := n.ok("prepare", origin)
		mp1 := mount(t, r.str("persistentPath"))
		require.NoError(t, os.WriteFile(filepath.Join(mp1, "data"), []byte("old content\n"), 0o600))
		n.ok("snapshot", origin, "--name", "s1")
		require.NoError(t, os.WriteFile(filepath.Join(mp1, "data"), []byte("new content\n"), 0o600))

		clone := sparseSpec("clone-ext4", u2, "96Mi", map[string]any{"source": map[string]any{"volumeUUID": u1, "snapshot": "s1"}})
		r = n.ok("prepare", clone)
		st := steps(r.Stderr)
		assert.Contains(t, st, "cloned")
		assert.Contains(t, st, "clone-identity")
		// A copy (not a reflink: the state dir is the host's ext4) tells
		// its bytes from 0 to the snapshot's data.
		if cloned := stepRecords(r.Stderr, "cloned"); len(cloned) == 1 && cloned[0]["method"] == "sparse-copy" {
			copiedAll(t, r.Stderr, "copying")
		}
		assert.Equal(t, "/dev/disk/by-uuid/"+u2, r.str("persistentPath"))
		assert.Equal(t, u2, blkid(t, r.str("devicePath"))["UUID"], "the clone's filesystem has the clone's UUID")
		mp2 := mount(t, r.str("persistentPath"))
		got, err := os.ReadFile(filepath.Join(mp2, "data"))
		require.NoError(t, err)
		assert.Equal(t, "old content\n", string(got), "the snapshot's moment")
		got, err = os.ReadFile(filepath.Join(mp1, "data"))
		require.NoError(t, err)
		assert.Equal(t, "new content\n", string(got), "the origin goes on, mounted at the same time")
		assert.Greater(t, fsSize(t, mp2), int64(80<<20), "grown to the clone's 96Mi")
		assert.Equal(t, false, n.ok("prepare", clone).Out["changed"], "converged")
		umount(t, mp2)
		umount(t, mp1)
		n.ok("unprepare", clone)
		n.ok("snapshot-delete", origin, "--name", "s1")
		n.ok("unprepare", origin)
	})

	t.Run("xfs, both mounted at once", func(t *testing.T) {
		u1, u2 := n.newUUID(), n.newUUID()
		origin := sparseSpec("origin-xfs", u1, "300Mi", map[string]any{"fsType": "xfs"})
		r := n.ok("prepare", origin)
		mp1 := mount(t, r.str("persistentPath"))
		require.NoError(t, os.WriteFile(filepath.Join(mp1, "data"), []byte("xfs old\n"), 0o600))
		r = n.ok("snapshot", origin, "--name", "s1")
		assert.Equal(t, true, r.Out["frozen"])
		clone := sparseSpec("clone-xfs", u2, "300Mi", map[string]any{"fsType": "xfs", "source": map[string]any{"volumeUUID": u1, "snapshot": "s1"}})
		// Killed while the copy is mounted for its log replay: the loop
		// device (the origin's UUID on it) stays mounted; the next run
		// unmounts and detaches it before it starts over.
		killed := n.exec([]string{failpoint.CrashEnv + "=clone-log-mounted"}, mustJSON(t, clone), "prepare", "--spec", "-")
		require.Equal(t, -1, killed.Code, "killed after clone-log-mounted: %s", killed.Stderr)
		part := filepath.Join(n.dir, "sparse", u2+".clone")
		left, err := loopdev.Find(part)
		require.NoError(t, err)
		require.Len(t, left, 1, "the killed run's loop device, still mounted")
		r = n.ok("prepare", clone)
		bound, err := loopdev.Bound()
		require.NoError(t, err)
		for _, d := range bound {
			back, _ := loopdev.BackingFile(d.Name)
			assert.NotContains(t, back, u2+".clone", "the rerun detached what the killed run left (%s)", d.Path)
		}
		mounts, err := os.ReadFile("/proc/self/mountinfo")
		require.NoError(t, err)
		assert.NotContains(t, string(mounts), filepath.Join(n.dir, ".clone-"), "and unmounted it")
		// A snapshot of a mounted xfs carries a log to replay before
		// xfs_admin takes it (which exits 0 even when it refuses).
		assert.Contains(t, steps(r.Stderr), "clone-log-replayed")
		// xfs refuses to mount a second filesystem with a UUID already
		// mounted: this mount proves the new identity.
		mp2 := mount(t, r.str("persistentPath"))
		got, err := os.ReadFile(filepath.Join(mp2, "data"))
		require.NoError(t, err)
		assert.Equal(t, "xfs old\n", string(got))
		umount(t, mp2)
		umount(t, mp1)
		n.ok("unprepare", clone)
		n.ok("snapshot-delete", origin, "--name", "s1")
		n.ok("unprepare", origin)
	})

	t.Run("Block: the partition GUID changed, the data kept", func(t *testing.T) {
		u1, u2 := n.newUUID(), n.newUUID()
		origin := sparseSpec("origin-block", u1, "64Mi", map[string]any{"mode": "Block"})
		r := n.ok("prepare", origin)
		part, err := filepath.EvalSymlinks(r.str("persistentPath"))
		require.NoError(t, err)
		f, err := os.OpenFile(part, os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteAt([]byte("block data at the start"), 0)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		n.ok("snapshot", origin, "--name", "s1")
		clone := sparseSpec("clone-block", u2, "64Mi", map[string]any{"mode": "Block", "source": map[string]any{"volumeUUID": u1, "snapshot": "s1"}})
		r = n.ok("prepare", clone)
		p2, err := filepath.EvalSymlinks(r.str("persistentPath"))
		require.NoError(t, err)
		assert.NotEqual(t, part, p2)
		assert.Equal(t, u2, blkid(t, p2)["PART_ENTRY_UUID"], "the clone's partition has the clone's GUID")
		buf := make([]byte, 23)
		g, err := os.Open(p2)
		require.NoError(t, err)
		_, err = g.ReadAt(buf, 0)
		require.NoError(t, err)
		require.NoError(t, g.Close())
		assert.Equal(t, "block data at the start", string(buf))
		n.ok("unprepare", clone)
		n.ok("snapshot-delete", origin, "--name", "s1")
		n.ok("unprepare", origin)
	})

	t.Run("refusals change nothing", func(t *testing.T) {
		u1, u2 := n.newUUID(), n.newUUID()
		origin := sparseSpec("origin-r", u1, "64Mi", nil)
		n.ok("prepare", origin)
		n.ok("snapshot", origin, "--name", "s1")
		for _, tc := range []struct {
			extra map[string]any
			size  string
			code  string
			msg   string
		}{
			{map[string]any{"source": map[string]any{"volumeUUID": u1, "snapshot": "nope"}}, "64Mi", "snapshot_not_found", "snapshot nope of volume"},
			{map[string]any{"source": map[string]any{"volumeUUID": u1, "snapshot": "s1"}}, "32Mi", "source_mismatch", "smaller than snapshot s1"},
			{map[string]any{"fsType": "xfs", "source": map[string]any{"volumeUUID": u1, "snapshot": "s1"}}, "300Mi", "source_mismatch", "fsType must be ext4"},
		} {
			r := n.do("prepare", sparseSpec("clone-r", u2, tc.size, tc.extra))
			assert.Equal(t, 2, r.Code, tc.msg)
			assert.Equal(t, tc.code, r.errCode())
			assert.Contains(t, r.errMsg(), tc.msg)
			_, err := os.Stat(filepath.Join(n.dir, "sparse", u2))
			assert.True(t, os.IsNotExist(err), "no file made")
			n.do("unprepare", sparseSpec("clone-r", u2, tc.size, tc.extra))
		}
		r := n.do("prepare", sparseSpec("clone-r", u2, "64Mi", map[string]any{"source": map[string]any{"volumeUUID": u2, "snapshot": "s1"}}))
		assert.Equal(t, "invalid_spec", r.errCode())
		assert.Contains(t, r.errMsg(), "source.volumeUUID")
		n.ok("snapshot-delete", origin, "--name", "s1")
		n.ok("unprepare", origin)
	})
}

// A snapshot or a clone killed after any of its steps converges on the
// next run: the snapshot is taken, the clone has the snapshot's content
// and its own UUID.
func TestSnapshotAndCloneKilledAtEveryStepConverge(t *testing.T) {
	n := newNode(t)
	u1 := n.newUUID()
	origin := sparseSpec("crash-origin", u1, "32Mi", nil)
	r := n.ok("prepare", origin)
	mp := mount(t, r.str("persistentPath"))
	require.NoError(t, os.WriteFile(filepath.Join(mp, "data"), []byte("kept\n"), 0o600))

	probe := steps(n.ok("snapshot", origin, "--name", "probe").Stderr)
	n.ok("snapshot-delete", origin, "--name", "probe")
	require.Contains(t, probe, "snapshot-taken")
	require.Contains(t, probe, "frozen")
	thawOnCleanup(t, mp)
	for i, step := range probe {
		name := "k" + string(rune('a'+i))
		killed := n.exec([]string{failpoint.CrashEnv + "=" + step}, mustJSON(t, origin), "snapshot", "--spec", "-", "--name", name)
		require.Equal(t, -1, killed.Code, "snapshot must be killed after %s", step)
		// Killed while frozen, the run's watchdog thaws at once (the
		// kernel never would): writes go on before any further run,
		// which reports the watchdog's thaw.
		blocked, wrote := writeBlocks(mp, 2*time.Second)
		require.False(t, blocked, "writable after a kill at %s, before any further run", step)
		require.NoError(t, <-wrote)
		r := n.ok("snapshot", origin, "--name", name)
		assert.Equal(t, "taken", r.str("phase"), "taken after a kill at %s", step)
		if step == "frozen" {
			assert.Contains(t, steps(r.Stderr), "thawed-by-watchdog", "after a kill at %s", step)
		}
		require.NoError(t, os.WriteFile(filepath.Join(mp, "after-"+step), []byte("x"), 0o600), "writable again after a kill at %s", step)
		assert.Equal(t, "kept\n", debugfsCat(t, r.str("image"), "/data"), "after a kill at %s", step)
	}
	umount(t, mp)

	u := n.newUUID()
	clone := func(u string) map[string]any {
		return sparseSpec("crash-clone", u, "48Mi", map[string]any{"source": map[string]any{"volumeUUID": u1, "snapshot": "ka"}})
	}
	cloneSteps := steps(n.ok("prepare", clone(u)).Stderr)
	n.ok("unprepare", clone(u))
	require.Contains(t, cloneSteps, "clone-identity")
	for _, step := range cloneSteps {
		if step == "prepared" {
			continue
		}
		u := n.newUUID()
		killed := n.exec([]string{failpoint.CrashEnv + "=" + step}, mustJSON(t, clone(u)), "prepare", "--spec", "-")
		require.Equal(t, -1, killed.Code, "prepare must be killed after %s", step)
		r := n.ok("prepare", clone(u))
		assert.Equal(t, u, blkid(t, r.str("devicePath"))["UUID"], "the clone's UUID after a kill at %s", step)
		assert.Equal(t, "kept\n", debugfsCat(t, r.str("devicePath"), "/data"), "the snapshot's content after a kill at %s", step)
		assert.Equal(t, false, n.ok("prepare", clone(u)).Out["changed"], "converged after a kill at %s", step)
		n.ok("unprepare", clone(u))
	}
	for i := range probe {
		n.ok("snapshot-delete", origin, "--name", "k"+string(rune('a'+i)))
	}
	n.ok("unprepare", origin)
}
