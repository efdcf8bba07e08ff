package nodeexec

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// debugfsCat reads a file out of an ext4 image without mounting it.
func debugfsCat(t *testing.T, img, path string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat "+path, img).Output()
	require.NoError(t, err)
	return string(out)
}

// Snapshots of sparse volumes: a point-in-time copy, taken with the
// volume's filesystem frozen while mounted, kept by the node beside the
// volume; a volume with snapshots is never removed with them unasked.
func TestSnapshotSparse(t *testing.T) {
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("needs debugfs (e2fsprogs)")
	}
	n := newNode(t)
	u := n.newUUID()
	spec := sparseSpec("snap-1", u, "64Mi", nil)
	r := n.ok("prepare", spec)
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
	needLoop(t)
	d := testenv.FakeDiskWith(t, 320<<20, func(img string) error {
		return exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", img).Run()
	})
	mnt := t.TempDir()
	require.NoError(t, unix.Mount(d.Path, mnt, "xfs", 0, ""))
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	n := &node{t: t, dir: filepath.Join(mnt, "state")}
	t.Cleanup(n.cleanup)
	u := n.newUUID()
	spec := sparseSpec("snap-xfs", u, "64Mi", map[string]any{"mode": "Block"})
	n.ok("prepare", spec)
	r := n.ok("snapshot", spec, "--name", "s1")
	assert.Equal(t, "reflink", r.str("method"))
	assert.Equal(t, false, r.Out["frozen"], "a Block volume has no filesystem of ours to freeze")
	out, err := exec.Command("sgdisk", "-p", r.str("image")).CombinedOutput()
	require.NoError(t, err, string(out))
	assert.True(t, strings.Contains(string(out), "snap-xfs"), "the image carries the volume's GPT: %s", out)
	n.ok("snapshot-delete", spec, "--name", "s1")
	n.ok("unprepare", spec)
}
