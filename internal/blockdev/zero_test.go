package blockdev

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSampleOffsets(t *testing.T) {
	const size = 64 << 20
	a := SampleOffsets(size, 42, 16)
	require.Len(t, a, 18)
	assert.Equal(t, int64(0), a[0], "the first block")
	assert.Equal(t, int64(size-SampleBlock), a[1], "the last block")
	for _, off := range a {
		assert.Zero(t, off%SampleBlock)
		assert.Less(t, off, int64(size))
	}
	assert.Equal(t, a, SampleOffsets(size, 42, 16), "the same seed reads the same blocks")
	assert.NotEqual(t, a, SampleOffsets(size, 43, 16))
	assert.Len(t, SampleOffsets(SampleBlock, 1, 3), 4, "one block: it is first, and drawn")
	assert.Empty(t, SampleOffsets(100, 1, 3))
}

// VerifyZero's refusals, on a file standing in for a device that did not
// zero (a real one cannot be made to lie here).
func TestVerifyZero(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dev")
	require.NoError(t, os.WriteFile(p, make([]byte, 1<<20), 0o600))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	offs := SampleOffsets(1<<20, 7, 8)
	bad, err := VerifyZero(f, offs)
	require.NoError(t, err)
	assert.Equal(t, int64(-1), bad)

	_, err = f.WriteAt([]byte{1}, (1<<20)-1) // the last byte
	require.NoError(t, err)
	bad, err = VerifyZero(f, offs)
	assert.ErrorContains(t, err, "not zero")
	assert.Equal(t, int64((1<<20)-SampleBlock), bad)

	bad, err = VerifyZero(f, []int64{2 << 20})
	assert.ErrorContains(t, err, "reading back")
	assert.Equal(t, int64(2<<20), bad)
}
