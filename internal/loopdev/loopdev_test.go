package loopdev

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
)

// Loop devices belong to the whole machine. Once a device of ours is
// detached, another program may bind its number to its own file; a
// second detach of ours (a cleanup after an explicit detach, or an
// engine's detach of a device it found a moment ago) must leave that
// binding alone. CI saw it happen: a test's raw disk vanished under it
// and the next loop device attached took its number.
func TestDetachLeavesARecycledNumberAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	ctx := context.Background()
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, nil, 0o600))
		require.NoError(t, os.Truncate(p, 1<<20))
		return p
	}
	mine, theirs := file("mine"), file("theirs")

	ours, err := Attach(ctx, mine)
	require.NoError(t, err)
	require.NoError(t, Detach(ctx, ours, 5*time.Second))
	// Someone else binds a device (the same number if it is still free,
	// which Reattach asks for; the check is the same either way).
	other, _, err := Reattach(ctx, ours, theirs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = Detach(ctx, other, 5*time.Second) })
	stale := ours
	stale.Name, stale.Path = other.Name, other.Path

	require.NoError(t, Detach(ctx, stale, time.Second), "a detach of a device that is gone already succeeds")
	require.NoError(t, ClearAutoclear(stale))
	found, err := Find(theirs)
	require.NoError(t, err)
	require.Equal(t, []string{other.Name}, names(found), "the other program's device is still bound to its file")
	back, err := BackingFile(other.Name)
	require.NoError(t, err)
	assert.Equal(t, theirs, back)

	// What Find returns is known by its file too: rebinding the number
	// between the lookup and the detach leaves the new binding alone.
	require.NoError(t, Detach(ctx, found[0], 5*time.Second))
	again, _, err := Reattach(ctx, found[0], mine)
	require.NoError(t, err)
	t.Cleanup(func() { _ = Detach(ctx, again, 5*time.Second) })
	looked := found[0]
	looked.Name, looked.Path = again.Name, again.Path
	require.NoError(t, Detach(ctx, looked, time.Second))
	found, err = Find(mine)
	require.NoError(t, err)
	assert.Equal(t, []string{again.Name}, names(found))

	// A device named by its number alone is taken at its word.
	require.NoError(t, Detach(ctx, Device{Name: again.Name, Path: again.Path}, 5*time.Second))
	found, err = Find(mine)
	require.NoError(t, err)
	assert.Empty(t, found, "detached by its name")
}

func names(ds []Device) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}

// A /dev node made by hand (blockdev.EnsureNode makes one while devtmpfs
// catches up) is one devtmpfs never removes: left behind, it keeps the
// numbers the kernel gives the next partition added anywhere, and a path
// to a later partition of that name would lead to another disk. Deleting
// a partition, or detaching the disk, takes such a node with it.
func TestPartitionNodesMadeByHandGoWithThePartition(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "disk")
	require.NoError(t, os.WriteFile(p, nil, 0o600))
	require.NoError(t, os.Truncate(p, 8<<20))
	d, err := Attach(ctx, p)
	require.NoError(t, err)
	t.Cleanup(func() { _ = Detach(ctx, d, 5*time.Second) })
	byHand := func(pno int) string {
		name, err := EnsurePartition(d.Name, pno, int64(pno)<<20, 1<<20)
		require.NoError(t, err)
		n, err := blockdev.DevOf(name)
		require.NoError(t, err)
		node := "/dev/" + name
		_ = os.Remove(node)
		require.NoError(t, unix.Mknod(node, unix.S_IFBLK|0o660, int(unix.Mkdev(n.Major, n.Minor))))
		t.Cleanup(func() { _ = os.Remove(node) })
		return node
	}

	node := byHand(1)
	require.NoError(t, RemovePartition(d.Name, 1))
	assert.NoFileExists(t, node, "removed with its partition")

	node = byHand(2)
	other := byHand(3)
	require.NoError(t, Detach(ctx, d, 5*time.Second))
	assert.NoFileExists(t, node, "removed with its disk")
	assert.NoFileExists(t, other, "removed with its disk")
}
