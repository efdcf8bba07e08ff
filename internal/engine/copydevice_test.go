package engine

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/loopdev"
)

// A thick LVM snapshot's copy into a larger clone (here two loop devices
// in place of the LVs): the snapshot's bytes, then zeroes to the end
// (the LV's extents may hold an earlier LV's data), each part telling its
// bytes from none to all, as the user's progress bar reads them.
func TestCopyDeviceTellsItsBytesAndZeroesTheRest(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	dir := t.TempDir()
	const n, size = 9 << 20, 24 << 20
	content := bytes.Repeat([]byte("snapshot"), n/8)
	attach := func(name string, data []byte, size int64) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		require.NoError(t, os.Truncate(p, size))
		d, err := loopdev.Attach(context.Background(), p)
		if err != nil {
			t.Skipf("no loop device: %v", err)
		}
		t.Cleanup(func() { _ = loopdev.Detach(context.Background(), d, 5*time.Second) })
		return d.Path
	}
	from := attach("from", content, n)
	to := attach("to", bytes.Repeat([]byte{0xee}, size), size) // an earlier LV's data

	type report struct{ done, total int64 }
	var copied, zeroed []report
	require.NoError(t, copyDevice(context.Background(), from, to, n,
		func(d, tot int64) { copied = append(copied, report{d, tot}) },
		func(d, tot int64) { zeroed = append(zeroed, report{d, tot}) }))

	got, err := os.ReadFile(to)
	require.NoError(t, err)
	require.Len(t, got, size)
	assert.True(t, bytes.Equal(content, got[:n]), "the snapshot's bytes")
	assert.True(t, bytes.Equal(make([]byte, size-n), got[n:]), "zeroes after them, none of the earlier data")
	for _, c := range []struct {
		name  string
		r     []report
		total int64
	}{{"copied", copied, n}, {"zeroed", zeroed, size - n}} {
		require.GreaterOrEqual(t, len(c.r), 2, c.name)
		assert.Equal(t, report{0, c.total}, c.r[0], c.name)
		assert.Equal(t, report{c.total, c.total}, c.r[len(c.r)-1], c.name)
		for i := 1; i < len(c.r); i++ {
			assert.Greater(t, c.r[i].done, c.r[i-1].done, "%s: %v", c.name, c.r)
		}
	}

	// Stopped: it returns at the next chunk, saying why.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, copyDevice(ctx, from, to, n, nil, nil), context.Canceled)
}
