package filecopy

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/freeze"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// sparseFile is a 64 MiB file with data at 1 MiB and at 40 MiB, holes
// around them.
func sparseFile(t *testing.T, dir string) (string, []byte) {
	p := filepath.Join(dir, "src")
	f, err := os.Create(p)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(64<<20))
	data := bytes.Repeat([]byte("salt-volumes "), 80_000) // ~1 MiB
	_, err = f.WriteAt(data, 1<<20)
	require.NoError(t, err)
	_, err = f.WriteAt(data, 40<<20)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	return p, data
}

func sameContent(t *testing.T, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	require.NoError(t, err)
	y, err := os.ReadFile(b)
	require.NoError(t, err)
	require.Equal(t, len(x), len(y), "size")
	assert.True(t, bytes.Equal(x, y), "content")
}

// On a filesystem without shared extents (the host's ext4): the data
// extents copied, the holes kept.
func TestSparseCopyKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src, data := sparseFile(t, dir)
	dst := filepath.Join(dir, "dst")
	m, err := Copy(src, dst)
	require.NoError(t, err)
	if m == Reflink {
		t.Skip("this filesystem shares extents: the sparse path is tested where it cannot")
	}
	assert.Equal(t, Sparse, m)
	sameContent(t, src, dst)
	used, err := Allocated(dst)
	require.NoError(t, err)
	assert.Less(t, used, int64(8<<20), "about the 2 MiB written, not the 64 MiB size: %d", used)
	assert.GreaterOrEqual(t, used, int64(2*len(data)))

	_, err = Copy(src, dst)
	assert.ErrorIs(t, err, os.ErrExist, "never over an existing file")
	sameContent(t, src, dst)
}

// On xfs with reflink (mkfs.xfs's default): the copy shares the extents,
// and writing to the source afterwards leaves the copy as it was.
func TestReflinkOnXFS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a loop device and a mount")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Skip("no mkfs.xfs (make setup installs xfsprogs)")
	}
	mnt := mountXFS(t, "1")

	src, _ := sparseFile(t, mnt)
	dst := filepath.Join(mnt, "dst")
	m, err := Copy(src, dst)
	require.NoError(t, err)
	assert.Equal(t, Reflink, m)
	sameContent(t, src, dst)
	assert.True(t, CanReflink(src, filepath.Join(mnt, "probe")), "the probe finds what the copy did")
	before, err := os.ReadFile(dst)
	require.NoError(t, err)
	f, err := os.OpenFile(src, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("changed after the copy"), 1<<20)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	after, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before, after), "the copy keeps the content of its moment")

	// Freezing the filesystem holds writes until the thaw.
	root, err := freeze.OpenRoot(mnt)
	require.NoError(t, err)
	defer root.Close()
	require.NoError(t, freeze.Freeze(root))
	wrote := make(chan error, 1)
	go func() { wrote <- os.WriteFile(filepath.Join(mnt, "while-frozen"), []byte("x"), 0o600) }()
	select {
	case err := <-wrote:
		t.Fatalf("a write went through a frozen filesystem: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, freeze.Thaw(root))
	require.NoError(t, <-wrote, "the write goes on after the thaw")
	assert.ErrorIs(t, freeze.Thaw(root), freeze.ErrNotFrozen, "a thaw of a filesystem not frozen says so")
}

// On xfs the filesystem's geometry answers CanReflink, with nothing
// written: yes with reflink=1 even where no probe file could be made (a
// directory of the probe's name, not empty), no with reflink=0; a probe
// on another filesystem than the source is asked the slow way (no: a
// reflink never crosses filesystems).
func TestCanReflinkFromXFSGeometry(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a loop device and a mount")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Skip("no mkfs.xfs (make setup installs xfsprogs)")
	}
	with, without := mountXFS(t, "1"), mountXFS(t, "0")

	src, _ := sparseFile(t, with)
	blocked := filepath.Join(with, "probe")
	require.NoError(t, os.MkdirAll(filepath.Join(blocked, "in-the-way"), 0o700))
	assert.True(t, CanReflink(src, blocked), "reflink=1: the geometry says yes, no probe made")
	_, err := os.Stat(filepath.Join(blocked, "in-the-way"))
	assert.NoError(t, err, "the probe's path was left alone")

	other, _ := sparseFile(t, without)
	assert.False(t, CanReflink(other, filepath.Join(without, "probe")), "reflink=0")
	m, err := Copy(other, filepath.Join(without, "dst"))
	require.NoError(t, err)
	assert.Equal(t, Sparse, m, "and the copy agrees")

	assert.False(t, CanReflink(src, filepath.Join(t.TempDir(), "probe")), "another filesystem")
}

// mountXFS mounts a fresh xfs, reflink=1 or 0, on a loop device of its
// own (mkfs.xfs refuses devices under 300 MB), unmounted at the end.
func mountXFS(t *testing.T, reflink string) string {
	t.Helper()
	d := testenv.FakeDiskWith(t, 320<<20, func(img string) error {
		out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink="+reflink, img).CombinedOutput()
		if err != nil {
			t.Logf("mkfs.xfs: %s", out)
		}
		return err
	})
	mnt := t.TempDir()
	require.NoError(t, unix.Mount(d.Path, mnt, "xfs", 0, ""))
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}

// Update brings an earlier copy up to date: only the blocks that differ
// are rewritten, data the source discarded becomes a hole again, and the
// size follows the source's.
func TestUpdateRewritesOnlyWhatChanged(t *testing.T) {
	dir := t.TempDir()
	src, data := sparseFile(t, dir)
	dst := filepath.Join(dir, "dst")
	require.NoError(t, CopySparse(context.Background(), src, dst))
	p, err := Update(context.Background(), src, dst)
	require.NoError(t, err)
	assert.Zero(t, p.Rewritten, "nothing changed")
	assert.GreaterOrEqual(t, p.Data, int64(2*len(data)))

	f, err := os.OpenFile(src, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("changed"), 1<<20+100) // inside the first extent
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("new data in a hole"), 20<<20) // a new extent
	require.NoError(t, err)
	// The volume discards its second extent: a hole again.
	require.NoError(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 40<<20, int64(len(data))))
	require.NoError(t, f.Truncate(80<<20))
	require.NoError(t, f.Close())

	p, err = Update(context.Background(), src, dst)
	require.NoError(t, err)
	sameContent(t, src, dst)
	assert.Positive(t, p.Rewritten)
	assert.LessOrEqual(t, p.Rewritten, int64(2*block), "at most a block for each write")
	used, err := Allocated(dst)
	require.NoError(t, err)
	assert.Less(t, used, int64(len(data))+int64(2<<20), "the discarded extent is a hole in the copy too: %d", used)
}

// A sparse copy tells its advance: from 0 to the source's data bytes
// (holes neither copied nor counted), never backwards; a reflink tells
// nothing. So does the first pass of an Update (CopySparseProgress).
func TestCopyProgressCountsTheData(t *testing.T) {
	dir := t.TempDir()
	src, data := sparseFile(t, dir)
	type report struct{ done, total int64 }
	var got []report
	record := func(done, total int64) { got = append(got, report{done, total}) }
	check := func(t *testing.T) {
		require.GreaterOrEqual(t, len(got), 3, "a start and one report per extent: %v", got)
		total := got[0].total
		assert.Equal(t, report{0, total}, got[0])
		assert.GreaterOrEqual(t, total, int64(2*len(data)), "both extents counted")
		assert.Less(t, total, int64(8<<20), "the holes of the 64 MiB file not counted: %d", total)
		for i := 1; i < len(got); i++ {
			assert.Equal(t, total, got[i].total)
			assert.Greater(t, got[i].done, got[i-1].done, "progress went backwards or stood: %v", got)
		}
		assert.Equal(t, total, got[len(got)-1].done, "it ends at the total")
	}
	t.Run("copy", func(t *testing.T) {
		m, err := CopyProgress(context.Background(), src, filepath.Join(dir, "dst"), record)
		require.NoError(t, err)
		sameContent(t, src, filepath.Join(dir, "dst"))
		if m == Reflink {
			assert.Empty(t, got)
			return
		}
		check(t)
	})
	t.Run("an update's first pass", func(t *testing.T) {
		got = nil
		require.NoError(t, CopySparseProgress(context.Background(), src, filepath.Join(dir, "pre"), record))
		sameContent(t, src, filepath.Join(dir, "pre"))
		check(t)
	})
}

// CanReflink answers what a copy would do, and leaves no probe behind.
func TestCanReflinkAsCopyFinds(t *testing.T) {
	dir := t.TempDir()
	src, _ := sparseFile(t, dir)
	m, err := Copy(src, filepath.Join(dir, "dst"))
	require.NoError(t, err)
	probe := filepath.Join(dir, "probe")
	assert.Equal(t, m == Reflink, CanReflink(src, probe))
	_, err = os.Stat(probe)
	assert.True(t, os.IsNotExist(err), "the probe is removed")
}

// An Update cut short by its context stops, and the next one still
// corrects the copy.
func TestUpdateStopsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	src, _ := sparseFile(t, dir)
	dst := filepath.Join(dir, "dst")
	require.NoError(t, CopySparse(context.Background(), src, dst))
	require.NoError(t, os.WriteFile(src, bytes.Repeat([]byte{7}, 8<<20), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Update(ctx, src, dst)
	assert.ErrorIs(t, err, context.Canceled)
	_, err = Update(context.Background(), src, dst)
	require.NoError(t, err)
	sameContent(t, src, dst)
}
