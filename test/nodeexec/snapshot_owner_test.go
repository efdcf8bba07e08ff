package nodeexec

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
)

// A snapshot taken with --owner (the control plane's) is answered again
// only to that owner; a snapshot of that name Salt took (no owner, as a
// record of an older version has none) or another owner's is refused,
// name_taken, exit 3, and neither answered, deleted nor changed. Salt's
// own callers (no owner) keep answering whatever is there.
func TestSnapshotOwnerNeverTakesOver(t *testing.T) {
	n := newNode(t)
	u, spec, _ := n.prepareSparse("owner-1", "32Mi", nil)
	salt := n.ok("snapshot", spec, "--name", "before-upgrade")
	assert.Empty(t, salt.str("owner"))

	r := n.do("snapshot", spec, "--name", "before-upgrade", "--owner", "sv-a")
	require.Equal(t, 3, r.Code, "%s", r.Stdout)
	assert.Equal(t, "name_taken", r.errCode())
	assert.Contains(t, r.errMsg(), "through Salt")
	assert.Contains(t, r.errMsg(), "another name")
	r = n.do("snapshot-delete", spec, "--name", "before-upgrade", "--owner", "sv-a")
	require.Equal(t, 3, r.Code, "%s", r.Stdout)
	assert.Equal(t, "name_taken", r.errCode())
	_, err := os.Stat(filepath.Join(n.dir, "snapshots", u, "before-upgrade.img"))
	assert.NoError(t, err, "Salt's snapshot stays")
	again := n.ok("snapshot", spec, "--name", "before-upgrade")
	assert.Equal(t, salt.Out["takenAt"], again.Out["takenAt"], "Salt's callers answer it as before")

	mine := n.ok("snapshot", spec, "--name", "cp-1", "--owner", "sv-a")
	assert.Equal(t, "sv-a", mine.str("owner"))
	b, err := os.ReadFile(filepath.Join(n.dir, "snapshots", u, "cp-1.json"))
	require.NoError(t, err)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(b, &rec))
	assert.Equal(t, "sv-a", rec["owner"], "the owner is in the node's record")
	retry := n.ok("snapshot", spec, "--name", "cp-1", "--owner", "sv-a")
	assert.Equal(t, mine.Out["takenAt"], retry.Out["takenAt"], "a retry of the same owner is answered")
	r = n.do("snapshot", spec, "--name", "cp-1", "--owner", "sv-b")
	require.Equal(t, 3, r.Code, "%s", r.Stdout)
	assert.Equal(t, "name_taken", r.errCode())
	assert.Contains(t, r.errMsg(), "owner sv-a")
	r = n.do("snapshot", spec, "--name", "cp-2", "--owner", "a b")
	assert.Equal(t, 2, r.Code, "an owner id is checked")

	n.ok("snapshot-delete", spec, "--name", "cp-1", "--owner", "sv-a")
	n.ok("snapshot-delete", spec, "--name", "before-upgrade")
	n.ok("unprepare", spec)
}

// A restore killed once its copy was whole leaves the copy and a swapping
// record: until it is finished, a growth and a delete of its snapshot are
// refused, the copy counts in what the node commits, and a copy of a
// snapshot that is not the one of that name now (deleted and taken again,
// here by hand as an older version allowed) is not put back.
func TestSnapshotRestoreLeftoverCopyIsNotATrap(t *testing.T) {
	needDebugfs(t)
	n := newNode(t)
	u, spec, r := snapshotBetween(t, n, "restore-left", "32Mi")
	link, file := r.str("persistentPath"), r.str("backingFile")
	committed := func() float64 {
		c := n.exec(nil, "", "list").Out["capacity"].(map[string]any)
		return c["committed"].(float64)
	}
	before := committed()
	killed := n.exec([]string{failpoint.CrashEnv + "=restore-ready"}, mustJSON(t, spec), "snapshot-restore", "--spec", "-", "--name", "s1")
	require.Equal(t, -1, killed.Code, "%s", killed.Stdout)
	_, err := os.Stat(file + ".restore")
	require.NoError(t, err, "the whole copy is left")
	assert.Equal(t, before+float64(32<<20), committed(), "the leftover copy counts while it exists")

	grown := sparseSpec("restore-left", u, "48Mi", nil)
	g := n.do("prepare", grown)
	require.Equal(t, 3, g.Code, "%s", g.Stdout)
	assert.Equal(t, "restore_pending", g.errCode())
	assert.Contains(t, g.errMsg(), "snapshot-restore --name s1")
	d := n.do("snapshot-delete", spec, "--name", "s1")
	require.Equal(t, 3, d.Code, "%s", d.Stdout)
	assert.Equal(t, "restore_pending", d.errCode())
	n.ok("snapshot", spec, "--name", "other")
	n.ok("snapshot-delete", spec, "--name", "other") // another snapshot's delete goes on

	// s1 deleted and taken again behind the restore's back: the copy
	// left is of the old s1.
	require.NoError(t, os.Remove(filepath.Join(n.dir, "snapshots", u, "s1.img")))
	require.NoError(t, os.Remove(filepath.Join(n.dir, "snapshots", u, "s1.json")))
	writeHello(t, link, "middle\n")
	n.ok("snapshot", spec, "--name", "s1")
	writeHello(t, link, "after\n")
	done := n.ok("snapshot-restore", spec, "--name", "s1")
	assert.Contains(t, steps(done.Stderr), "restore-stale-copy-dropped")
	assert.Equal(t, "middle\n", debugfsCat(t, file, "/hello"), "the snapshot as it is now is restored, not the old copy")
	noRestoreLeft(t, n, u, "after the restore")
	assert.Less(t, committed(), before+float64(1<<20), "the copy no longer counts (s1 taken again pins a little more)")

	n.ok("prepare", grown) // and a growth goes on once it is finished
	n.ok("snapshot-delete", grown, "--name", "s1")
	n.ok("unprepare", grown)
}

// A detach that times out because someone opened the device meanwhile
// (LOOP_CLR_FD then only sets AUTOCLEAR) leaves the device attached for
// good: the flag is cleared again, so the device does not vanish when its
// user closes it.
func TestFailedDetachKeepsTheDeviceAttached(t *testing.T) {
	needLoop(t)
	f := filepath.Join(t.TempDir(), "backing")
	require.NoError(t, os.WriteFile(f, make([]byte, 1<<20), 0o600))
	d, err := loopdev.Attach(context.Background(), f)
	require.NoError(t, err)
	t.Cleanup(func() { _ = loopdev.Detach(context.Background(), d, 5*time.Second) })
	user, err := os.Open(d.Path)
	require.NoError(t, err)
	err = loopdev.Detach(context.Background(), d, 100*time.Millisecond)
	require.Error(t, err, "busy: not detached")
	assert.Contains(t, err.Error(), "stays attached")
	auto, err := loopdev.Autoclear(d)
	require.NoError(t, err)
	assert.False(t, auto, "AUTOCLEAR is cleared again")
	require.NoError(t, user.Close())
	time.Sleep(200 * time.Millisecond)
	_, err = os.Stat(filepath.Join("/sys/block", d.Name, "loop"))
	assert.NoError(t, err, "still attached once its user closed it")
	back, err := loopdev.BackingFile(d.Name)
	require.NoError(t, err)
	assert.Equal(t, f, back)
}
