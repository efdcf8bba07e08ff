package probe

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const size = 8 << 20

func image(t *testing.T, writes map[int64][]byte) *bytes.Reader {
	t.Helper()
	b := make([]byte, size)
	for off, v := range writes {
		copy(b[off:], v)
	}
	return bytes.NewReader(b)
}

func TestBlank(t *testing.T) {
	r, err := Device(image(t, nil), size, 512)
	require.NoError(t, err)
	assert.True(t, r.Empty())
}

func TestExt4AndXFSUUID(t *testing.T) {
	uuid := []byte{0x3f, 0x25, 0x04, 0xe0, 0x4f, 0x89, 0x41, 0xd3, 0x9a, 0x0c, 0x03, 0x05, 0xe8, 0x2c, 0x33, 0x01}
	incompat := make([]byte, 4)
	binary.LittleEndian.PutUint32(incompat, 0x40) // extents
	r, err := Device(image(t, map[int64][]byte{1080: {0x53, 0xEF}, 1024 + 0x60: incompat, 1128: uuid}), size, 512)
	require.NoError(t, err)
	assert.Equal(t, "ext4", r.Kind)
	assert.Equal(t, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", r.UUID, "ext UUIDs are stored in plain byte order")

	r, err = Device(image(t, map[int64][]byte{0: []byte("XFSB"), 32: uuid}), size, 512)
	require.NoError(t, err)
	assert.Equal(t, "xfs", r.Kind)
	assert.Equal(t, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", r.UUID)
}

func TestForeignSignatures(t *testing.T) {
	cases := map[string]map[int64][]byte{
		"LUKS":              {0: []byte("LUKS\xba\xbe")},
		"btrfs":             {65536 + 64: []byte("_BHRfS_M")},
		"swap":              {4086: []byte("SWAPSPACE2")},
		"LVM2_member":       {512: []byte("LABELONE")},
		"linux_raid_member": {4096: {0xfc, 0x4e, 0x2b, 0xa9}},
		"iso9660":           {32769: []byte("CD001")},
		"squashfs":          {0: []byte("hsqs")},
		"dos":               {510: {0x55, 0xAA}},
		"gpt":               {512: []byte("EFI PART")}, // header unreadable: still a table
		"zfs_member":        {16 << 10: append([]byte{1, 1, 0, 0}, []byte("....pool_guid")...)},
	}
	for want, w := range cases {
		r, err := Device(image(t, w), size, 512)
		require.NoError(t, err, want)
		assert.Equal(t, want, r.Kind)
		assert.False(t, r.Empty())
	}
}

func TestBackupGPTOnlyIsStillATable(t *testing.T) {
	r, err := Device(image(t, map[int64][]byte{size - 512: []byte("EFI PART")}), size, 512)
	require.NoError(t, err)
	assert.Equal(t, "gpt", r.Kind)
}

// gptImage is an image file holding our one-partition GPT.
func gptImage(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "img"))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	require.NoError(t, f.Truncate(size))
	_, _, err = gpt.Create(f, size, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "v")
	require.NoError(t, err)
	return f
}

func TestGPTWithPartitionGUIDs(t *testing.T) {
	f := gptImage(t)
	r, err := Device(f, size, 512)
	require.NoError(t, err)
	require.Equal(t, "gpt", r.Kind)
	require.NotNil(t, r.GPT)
	p, ok := r.GPT.Partition(1)
	require.True(t, ok)
	assert.Equal(t, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", p.GUID)
}

// countingReader counts the reads a probe makes: each one on a block
// device opened afresh goes to the device.
type countingReader struct {
	r     *bytes.Reader
	reads int
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads++
	return c.r.ReadAt(p, off)
}

func TestTailSignaturesOnOddSizes(t *testing.T) {
	// md metadata sits at offsets aligned down from the end: check them on
	// sizes that are not multiples of the alignment.
	for _, sz := range []int64{size, size + 3*512, size + 60<<10} {
		img := func(off int64) *bytes.Reader {
			b := make([]byte, sz)
			copy(b[off:], []byte{0xfc, 0x4e, 0x2b, 0xa9})
			return bytes.NewReader(b)
		}
		md10 := ((sz >> 9) - 16) &^ 7 * 512
		md090 := (sz &^ (65536 - 1)) - 65536
		for name, off := range map[string]int64{"md 1.0": md10, "md 0.90": md090} {
			r, err := Device(img(off), sz, 512)
			require.NoError(t, err)
			assert.Equal(t, "linux_raid_member", r.Kind, "%s on a %d-byte device", name, sz)
		}
		b := make([]byte, sz)
		copy(b[sz/512*512-512:], "EFI PART")
		r, err := Device(bytes.NewReader(b), sz, 512)
		require.NoError(t, err)
		assert.Equal(t, "gpt", r.Kind, "backup GPT header on a %d-byte device", sz)
	}
}

func TestProbeReadsTwiceAtMost(t *testing.T) {
	c := &countingReader{r: image(t, nil)}
	r, err := Device(c, size, 512)
	require.NoError(t, err)
	assert.True(t, r.Empty())
	assert.Equal(t, 2, c.reads, "a blank device: its start and its end, once each")

	b := make([]byte, size)
	_, err = gptImage(t).ReadAt(b, 0)
	require.NoError(t, err)
	c = &countingReader{r: bytes.NewReader(b)}
	r, err = Device(c, size, 512)
	require.NoError(t, err)
	require.NotNil(t, r.GPT)
	assert.Equal(t, 1, c.reads, "a sound GPT is parsed from the start already read")
}
