package nodeexec

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
)

// A snapshot never fills the filesystem the sparse volumes live on: the
// data it keeps counts against the overcommit ratio, a copy (no reflink)
// must fit the free space with room to spare, and a refused snapshot
// leaves nothing behind; a snapshot taken counts in the node's committed
// bytes.
func TestSnapshotRoom(t *testing.T) {
	// The state dir on a 320 MiB ext4 of its own: no reflink, little room.
	n, mnt := nodeOnOwnFS(t, "ext4", "mkfs.ext4", "-q", "-F")
	free := func() int64 {
		var st unix.Statfs_t
		require.NoError(t, unix.Statfs(mnt, &st))
		return int64(st.Bavail) * st.Bsize
	}
	ratio := []string{"SALT_VOLUMES_OVERCOMMIT_RATIO=3"}

	big := sparseSpec("room-big", n.newUUID(), "256Mi", nil)
	r := n.ok("prepare", big)
	mp := mount(t, r.str("persistentPath"))
	fill(t, mp, 120<<20)
	umount(t, mp)
	bigUUID := big["uuid"].(string)
	snapDir := filepath.Join(n.dir, "snapshots", bigUUID)
	nothingLeft := func(what string) {
		t.Helper()
		ents, _ := os.ReadDir(snapDir)
		assert.Empty(t, ents, "%s: nothing of the refused snapshot is left", what)
	}

	// 256Mi committed on ~300Mi, ratio 1: the 120Mi it would keep is past
	// the limit.
	before := free()
	r = n.do("snapshot", big, "--name", "s")
	assert.Equal(t, 3, r.Code, r.Stdout)
	assert.Equal(t, "no_room", r.errCode())
	assert.Contains(t, r.errMsg(), "past the overcommit ratio 1")
	nothingLeft("overcommit")

	// Ratio 3: within the rule, but a 120Mi copy does not fit the ~165Mi
	// free with 64Mi kept free.
	b, err := json.Marshal(big)
	require.NoError(t, err)
	r = n.exec(ratio, string(b), "snapshot", "--spec", "-", "--name", "s")
	assert.Equal(t, 3, r.Code, r.Stdout)
	assert.Equal(t, "no_room", r.errCode())
	assert.Contains(t, r.errMsg(), "free")
	assert.Contains(t, r.errMsg(), "reflink", "names the faster way")
	nothingLeft("free space")
	assert.InDelta(t, before, free(), float64(1<<20), "the refusals took no room")

	// A small one fits, and what it keeps is committed.
	small := sparseSpec("room-small", n.newUUID(), "32Mi", nil)
	r = n.ok("prepare", small)
	mp = mount(t, r.str("persistentPath"))
	fill(t, mp, 16<<20)
	umount(t, mp)
	list := func() map[string]any {
		r := n.exec(ratio, "", "list")
		require.Equal(t, 0, r.Code, r.Stdout)
		return r.Out["capacity"].(map[string]any)
	}
	committed := list()["committed"].(float64)
	assert.Equal(t, float64(288<<20), committed, "256Mi and 32Mi")
	b, err = json.Marshal(small)
	require.NoError(t, err)
	r = n.exec(ratio, string(b), "snapshot", "--spec", "-", "--name", "s")
	require.Equal(t, 0, r.Code, r.Stdout)
	kept := r.Out["allocated"].(float64)
	assert.Greater(t, kept, float64(16<<20))
	c := list()
	assert.Equal(t, committed+kept, c["committed"], "the snapshot's data is committed")
	assert.Equal(t, kept, c["snapshotBytes"])
	n.ok("snapshot-delete", small, "--name", "s")
	assert.Equal(t, committed, list()["committed"], "and uncommitted once deleted")

	// A snapshot killed after its reservation was recorded, taken again
	// with the limit between one reservation and two: the retry counts
	// its own earlier reservation once, and fits.
	// (No listing in between: a listing drops a take it finds abandoned.)
	var st unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(n.dir, "sparse", small["uuid"].(string)), &st))
	reserved := float64(st.Blocks * 512)
	killed := n.exec(append(ratio, failpoint.CrashEnv+"=snapshot-copying"), string(b), "snapshot", "--spec", "-", "--name", "s2")
	require.Equal(t, -1, killed.Code, "killed after snapshot-copying: %s", killed.Stderr)
	tight := fmt.Sprintf("SALT_VOLUMES_OVERCOMMIT_RATIO=%f", (committed+1.5*reserved)/c["size"].(float64))
	r = n.exec([]string{tight}, string(b), "snapshot", "--spec", "-", "--name", "s2")
	require.Equal(t, 0, r.Code, "the retry of a killed snapshot counts its reservation once: %s", r.Stdout)
	assert.Equal(t, committed+r.Out["allocated"].(float64), list()["committed"], "counted once")
	n.ok("snapshot-delete", small, "--name", "s2")
	n.ok("unprepare", small)
	n.ok("unprepare", big)
}

// The snapshots dir is held to the state dir's rules: a symlink planted
// as a volume's snapshot dir, or in place of the volume's file, is never
// followed (everything here runs as root).
func TestSnapshotPlantedLinks(t *testing.T) {
	n := newNode(t)
	spec := sparseSpec("planted", n.newUUID(), "16Mi", map[string]any{"mode": "Block"})
	n.ok("prepare", spec)
	u := spec["uuid"].(string)
	elsewhere := t.TempDir()
	dir := filepath.Join(n.dir, "snapshots", u)
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.Symlink(elsewhere, dir))
	r := n.do("snapshot", spec, "--name", "s")
	assert.NotEqual(t, 0, r.Code, r.Stdout)
	assert.Contains(t, r.errMsg(), "not a directory (a symlink?)")
	ents, _ := os.ReadDir(elsewhere)
	assert.Empty(t, ents, "nothing written through the planted link")
	require.NoError(t, os.Remove(dir))
	st, err := os.Stat(filepath.Join(n.dir, "snapshots"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the snapshots dir is root-only")

	// The volume's file swapped for a link to someone else's file: the
	// copy refuses to read it.
	secret := filepath.Join(elsewhere, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("not yours"), 0o600))
	file := filepath.Join(n.dir, "sparse", u)
	require.NoError(t, os.Rename(file, file+".moved"))
	require.NoError(t, os.Symlink(secret, file))
	r = n.do("snapshot", spec, "--name", "s2")
	assert.NotEqual(t, 0, r.Code, r.Stdout)
	assert.Contains(t, r.Stdout, "symlink")
	imgs, _ := filepath.Glob(filepath.Join(dir, "*.img"))
	assert.Empty(t, imgs, "no image of the link's target")
	require.NoError(t, os.Remove(file))
	require.NoError(t, os.Rename(file+".moved", file))
	n.ok("unprepare", spec)
}

// A volume begun as a new one and killed before it was written may not be
// finished as a clone (a clone's LV skips the check for an earlier LV's
// leftovers), nor the other way round.
func TestSourceFixedUntilWritten(t *testing.T) {
	n := newNode(t)
	origin := sparseSpec("src-origin", n.newUUID(), "16Mi", nil)
	n.ok("prepare", origin)
	n.ok("snapshot", origin, "--name", "s")
	fresh := sparseSpec("src-fresh", n.newUUID(), "16Mi", nil)
	b, err := json.Marshal(fresh)
	require.NoError(t, err)
	r := n.exec([]string{"SALT_VOLUMES_CRASH_AFTER=recorded"}, string(b), "prepare", "--spec", "-")
	require.Equal(t, -1, r.Code, "killed after recorded: %s", r.Stderr)
	asClone := sparseSpec("src-fresh", fresh["uuid"].(string), "16Mi", map[string]any{"source": map[string]any{"volumeUUID": origin["uuid"], "snapshot": "s"}})
	r = n.do("prepare", asClone)
	assert.Equal(t, 3, r.Code, r.Stdout)
	assert.Equal(t, "conflict", r.errCode())
	assert.Contains(t, r.errMsg(), "begun as a new volume (no source)")
	n.ok("prepare", fresh)
	n.ok("unprepare", fresh)
	n.ok("snapshot-delete", origin, "--name", "s")
	n.ok("unprepare", origin)
}
