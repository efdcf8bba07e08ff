package blockdev

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The direct reader answers like any io.ReaderAt, whatever the offset and
// length: bytes, and io.EOF when the read reaches past the end.
func TestDirectReaderReadsLikeAPlainReader(t *testing.T) {
	want := make([]byte, 3*directAlign+512) // not a whole number of 4 KiB blocks
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	p := filepath.Join(t.TempDir(), "img")
	require.NoError(t, os.WriteFile(p, want, 0o600))
	f, r, err := OpenDirect(p)
	require.NoError(t, err)
	defer f.Close()
	if _, plain := r.(*os.File); plain {
		t.Log("this filesystem has no direct I/O: OpenDirect fell back to a plain open")
	}
	ref := bytes.NewReader(want)
	size := int64(len(want))
	for _, c := range []struct{ off, n int64 }{
		{0, 128},
		{100, 5000},
		{directAlign - 1, 2},
		{directAlign, directAlign},
		{size - 10, 10},
		{size - 10, 100},
		{size, 10},
		{size + directAlign, 10},
		{5, 0},
	} {
		got := make([]byte, c.n)
		n, err := r.ReadAt(got, c.off)
		exp := make([]byte, c.n)
		en, eerr := ref.ReadAt(exp, c.off)
		assert.Equal(t, en, n, "bytes read at %d+%d", c.off, c.n)
		assert.Equal(t, exp[:en], got[:n], "content at %d+%d", c.off, c.n)
		if eerr == io.EOF {
			assert.ErrorIs(t, err, io.EOF, "short read at %d+%d", c.off, c.n)
		} else {
			assert.NoError(t, err, "read at %d+%d", c.off, c.n)
		}
	}
	_, err = r.ReadAt(make([]byte, 1), -1)
	assert.Error(t, err)
}

func TestAlignedBuffer(t *testing.T) {
	for _, n := range []int{1, 512, directAlign, 3*directAlign + 1} {
		b := alignedBuffer(n)
		assert.Len(t, b, n)
		assert.Equal(t, n, cap(b), "appending must not run into the padding")
		assert.Zero(t, addr(b)%directAlign, "buffer of %d bytes aligned", n)
	}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
