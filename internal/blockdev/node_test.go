package blockdev_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// What udev's re-read of a table does to a partition, step by step: it is
// gone when we look, and back (under a new number) a moment later.
func TestAwaitNodeRidesOutReread(t *testing.T) {
	disk := testenv.FakeDisk(t, 16<<20)
	const start, length = 1 << 20, 8 << 20
	part, err := loopdev.EnsurePartition(disk.Name, 1, start, length)
	require.NoError(t, err)
	_, _, err = blockdev.AwaitNode(context.Background(), part, time.Second)
	require.NoError(t, err)
	before, err := blockdev.DevOf(part)
	require.NoError(t, err)

	t.Run("gone, then back", func(t *testing.T) {
		require.NoError(t, loopdev.RemovePartition(disk.Name, 1))
		back := make(chan error, 1)
		go func() {
			time.Sleep(300 * time.Millisecond)
			_, err := loopdev.EnsurePartition(disk.Name, 1, start, length)
			back <- err
		}()
		path, size, err := blockdev.AwaitNode(context.Background(), part, 5*time.Second)
		require.NoError(t, err)
		require.NoError(t, <-back)
		assert.Equal(t, "/dev/"+part, path)
		assert.Equal(t, int64(length), size)
	})

	t.Run("a stale node is replaced", func(t *testing.T) {
		now, err := blockdev.DevOf(part)
		require.NoError(t, err)
		// A node left with numbers the partition no longer has, as one made
		// while devtmpfs caught up stays after a renumbering re-read.
		stale := now
		if stale == before {
			stale.Minor += 100
		} else {
			stale = before
		}
		require.NoError(t, os.Remove("/dev/"+part))
		require.NoError(t, unix.Mknod("/dev/"+part, unix.S_IFBLK|0o660, int(unix.Mkdev(stale.Major, stale.Minor))))
		path, _, err := blockdev.AwaitNode(context.Background(), part, time.Second)
		require.NoError(t, err)
		got, err := blockdev.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, now, got)
	})

	t.Run("gone for good: an error naming it, in bounded time", func(t *testing.T) {
		require.NoError(t, loopdev.RemovePartition(disk.Name, 1))
		_, _, err := blockdev.AwaitNode(context.Background(), part, 200*time.Millisecond)
		require.Error(t, err)
		assert.Contains(t, err.Error(), part)
	})

	t.Run("a symlink in its place is never replaced", func(t *testing.T) {
		p, err := loopdev.EnsurePartition(disk.Name, 1, start, length)
		require.NoError(t, err)
		require.NoError(t, os.Remove("/dev/"+p))
		require.NoError(t, os.Symlink("null", "/dev/"+p))
		t.Cleanup(func() { os.Remove("/dev/" + p) })
		_, _, err = blockdev.AwaitNode(context.Background(), p, 200*time.Millisecond)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not replacing")
		dest, _ := os.Readlink("/dev/" + p)
		assert.Equal(t, "null", dest)
	})
}
