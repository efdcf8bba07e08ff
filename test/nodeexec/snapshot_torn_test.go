package nodeexec

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
)

// Snapshots that would be torn copies (#49 item 3): a filesystem mounted
// only in another mount namespace is frozen through that mount; a device
// somebody holds is copied only by reflink, else refused.

// mountNamespace starts a process in a mount namespace of its own, whose
// mounts the host does not see, and returns its pid; it is killed when
// the test ends, after the cleanups registered later (its mounts' own).
func mountNamespace(t *testing.T) int {
	t.Helper()
	needTools(t, "util-linux", "unshare", "nsenter")
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sleep", "600")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	pid := cmd.Process.Pid
	self, err := os.Readlink("/proc/self/ns/mnt")
	require.NoError(t, err)
	// unshare execs sleep once the namespace is made and private.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		ns, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
		if strings.TrimSpace(string(comm)) == "sleep" && ns != "" && ns != self {
			return pid
		}
	}
	t.Fatal("unshare did not start sleep in a mount namespace of its own")
	return 0
}

// nsenter runs a command in the mount namespace of pid, bounded in time
// (a command on a filesystem left frozen would wait for ever).
func nsenter(pid int, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(pid), "-m", "--"}, args...)...).CombinedOutput()
}

// A Filesystem volume mounted only in another mount namespace (a
// container's, a pod's): the snapshot finds the mount there, freezes the
// filesystem through it (data written but not synced is in the image),
// and thaws it.
func TestSnapshotFreezesMountInAnotherNamespace(t *testing.T) {
	needDebugfs(t)
	needTools(t, "util-linux", "fsfreeze")
	n := newNode(t)
	_, spec, r := n.prepareSparse("ns-mounted", "64Mi", nil)
	dev := r.str("devicePath")
	pid := mountNamespace(t)
	mp := t.TempDir()
	out, err := nsenter(pid, "mount", dev, mp)
	require.NoError(t, err, "mount in the namespace: %s", out)
	t.Cleanup(func() {
		_, _ = nsenter(pid, "fsfreeze", "-u", mp) // whatever a failing run left
		_, _ = nsenter(pid, "umount", mp)         // not mounted any more: fine
	})
	bd, err := blockdev.Stat(dev)
	require.NoError(t, err)
	host, err := blockdev.Mountpoints(bd)
	require.NoError(t, err)
	require.Empty(t, host, "the host's mount table must not show the namespace's mount")

	inNS := "/proc/" + strconv.Itoa(pid) + "/root" + mp
	// Not synced: only the freeze (FIFREEZE writes the filesystem out)
	// puts it in the volume's file before the copy.
	require.NoError(t, os.WriteFile(filepath.Join(inNS, "data"), []byte("written in the namespace\n"), 0o600))

	r = n.ok("snapshot", spec, "--name", "s1")
	assert.Equal(t, "taken", r.str("phase"))
	assert.Equal(t, true, r.Out["frozen"], "mounted in another namespace: frozen through that mount")
	st := steps(r.Stderr)
	assert.Contains(t, st, "frozen")
	assert.Contains(t, st, "thawed")
	assert.Contains(t, r.Stderr, inNS, "the step log names the mount it froze through")

	// Thawed: a write in the namespace goes on at once.
	blocked, wrote := writeBlocks(inNS, 2*time.Second)
	require.False(t, blocked, "a write in the namespace must not wait after the snapshot")
	require.NoError(t, <-wrote)
	out, err = nsenter(pid, "touch", filepath.Join(mp, "after"))
	require.NoError(t, err, "a write from inside the namespace: %s", out)

	assert.Equal(t, "written in the namespace\n", debugfsCat(t, r.str("image"), "/data"), "the image holds what was written before the freeze")
	n.ok("snapshot-delete", spec, "--name", "s1")
	out, err = nsenter(pid, "umount", mp)
	require.NoError(t, err, "umount in the namespace: %s", out)
	n.ok("unprepare", spec)
}

// snapshotDirEmpty checks that a refused snapshot left nothing in the
// volume's snapshot directory.
func snapshotDirEmpty(t *testing.T, n *node, u string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(n.dir, "snapshots", u))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	assert.Empty(t, names, "a refused snapshot leaves nothing")
}

// noReflink skips a test whose state dir (under TMPDIR) could reflink.
func noReflink(t *testing.T) {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(os.TempDir(), &st))
	if st.Type == unix.XFS_SUPER_MAGIC || st.Type == unix.BTRFS_SUPER_MAGIC {
		t.Skip("needs a state dir without reflink (TMPDIR is on xfs or btrfs)")
	}
}

// heldBlockVolume prepares a sparse Block volume of 64 MiB on n and holds
// its partition open (holdDevice): its UUID, spec, partition and holder.
func heldBlockVolume(t *testing.T, n *node, name string) (string, map[string]any, string, *os.File) {
	t.Helper()
	u, spec, r := n.prepareSparse(name, "64Mi", map[string]any{"mode": "Block"})
	part, err := filepath.EvalSymlinks(r.str("persistentPath"))
	require.NoError(t, err)
	return u, spec, part, holdDevice(t, part)
}

// holdDevice opens a device read-write as a database on a raw device would,
// and writes to it.
func holdDevice(t *testing.T, dev string) *os.File {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	_, err = f.WriteAt([]byte("written by the holder"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	return f
}

// A Block volume somebody holds open, on a state dir without reflink: a
// copy would be torn, so the snapshot is refused before anything is
// copied; once it is closed, the snapshot is taken. On a state dir with
// reflink, one held is taken at once, by reflink.
func TestSnapshotBlockInUse(t *testing.T) {
	t.Run("without reflink: refused, then taken once closed", func(t *testing.T) {
		noReflink(t)
		n := newNode(t)
		u, spec, part, f := heldBlockVolume(t, n, "blk-held")

		r := n.do("snapshot", spec, "--name", "s1")
		assert.Equal(t, 3, r.Code, r.Stdout)
		assert.Equal(t, "in_use_not_atomic", r.errCode())
		for _, want := range []string{"pid " + strconv.Itoa(os.Getpid()), "torn", "Refused before anything was copied", "Stop its user", "xfs with reflink, btrfs", "LVM volume"} {
			assert.Contains(t, r.errMsg(), want)
		}
		assert.Empty(t, steps(r.Stderr), "refused before copying anything")
		snapshotDirEmpty(t, n, u)

		require.NoError(t, f.Close())
		r = n.ok("snapshot", spec, "--name", "s1")
		assert.Equal(t, "taken", r.str("phase"))
		assert.Equal(t, "sparse-copy", r.str("method"))
		assert.Equal(t, false, r.Out["frozen"])
		// The holder's write is in the image, at the partition's start.
		start, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(part), "start"))
		require.NoError(t, err)
		sector, err := strconv.ParseInt(strings.TrimSpace(string(start)), 10, 64)
		require.NoError(t, err)
		img, err := os.Open(r.str("image"))
		require.NoError(t, err)
		buf := make([]byte, len("written by the holder"))
		_, err = img.ReadAt(buf, sector*512)
		img.Close()
		require.NoError(t, err)
		assert.Equal(t, "written by the holder", string(buf))
		n.ok("snapshot-delete", spec, "--name", "s1")
		n.ok("unprepare", spec)
	})

	t.Run("with reflink: taken by reflink while held", func(t *testing.T) {
		n := reflinkNode(t)
		_, spec, _, f := heldBlockVolume(t, n, "blk-held-xfs")
		r := n.ok("snapshot", spec, "--name", "s1")
		assert.Equal(t, "reflink", r.str("method"))
		assert.Contains(t, r.Stderr, "pid "+strconv.Itoa(os.Getpid()), "the step log says who held it")
		require.NoError(t, f.Close())
		n.ok("snapshot-delete", spec, "--name", "s1")
		n.ok("unprepare", spec)
	})
}

// A Filesystem volume unmounted lazily while a file in it is open: no
// mount table shows it, yet it is live and written. Without reflink the
// snapshot is refused; once the last file is closed it is taken.
func TestSnapshotLazilyUnmountedInUse(t *testing.T) {
	noReflink(t)
	n := newNode(t)
	u, spec, r := n.prepareSparse("lazy-unmounted", "64Mi", nil)
	dev := r.str("devicePath")
	mp := mount(t, dev)
	f, err := os.Create(filepath.Join(mp, "open"))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	out, err := exec.Command("umount", "-l", mp).CombinedOutput()
	require.NoError(t, err, "umount -l: %s", out)

	r = n.do("snapshot", spec, "--name", "s1")
	assert.Equal(t, 3, r.Code, r.Stdout)
	assert.Equal(t, "in_use_not_atomic", r.errCode())
	assert.Contains(t, r.errMsg(), "unmounted lazily")
	snapshotDirEmpty(t, n, u)

	require.NoError(t, f.Close())
	// The filesystem goes once its last file is closed; the kernel lets
	// go of the device a moment later.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if blockdev.CheckExclusive(dev) == nil {
			break
		}
	}
	r = n.ok("snapshot", spec, "--name", "s1")
	assert.Equal(t, false, r.Out["frozen"])
	n.ok("snapshot-delete", spec, "--name", "s1")
	n.ok("unprepare", spec)
}

// A volume whose file somebody holds open may be written through it: on
// a state dir without reflink its snapshot is refused, as its restore is,
// both naming the process; once the file is closed both go ahead.
func TestSnapshotFileHeldOpen(t *testing.T) {
	noReflink(t)
	n := newNode(t)
	_, spec, r := n.prepareSparse("file-held", "32Mi", map[string]any{"mode": "Block"})
	file := r.str("backingFile")
	n.ok("snapshot", spec, "--name", "s1")
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	pid := "pid " + strconv.Itoa(os.Getpid())

	r = n.do("snapshot", spec, "--name", "s2")
	assert.Equal(t, 3, r.Code, r.Stdout)
	assert.Equal(t, "in_use_not_atomic", r.errCode())
	assert.Contains(t, r.errMsg(), "its file "+file+", open by "+pid)
	t.Logf("snapshot refused: %s", r.errMsg())
	r = n.do("snapshot-restore", spec, "--name", "s1")
	assert.Equal(t, 3, r.Code, r.Stdout)
	assert.Equal(t, "in_use", r.errCode())
	assert.Contains(t, r.errMsg(), "its file "+file+" open by "+pid)
	t.Logf("restore refused: %s", r.errMsg())

	require.NoError(t, f.Close())
	n.ok("snapshot", spec, "--name", "s2")
	n.ok("snapshot-restore", spec, "--name", "s1")
	for _, s := range []string{"s1", "s2"} {
		n.ok("snapshot-delete", spec, "--name", s)
	}
	n.ok("unprepare", spec)
}
