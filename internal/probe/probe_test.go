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

func TestGPTWithPartitionGUIDs(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "img"))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(size))
	_, _, err = gpt.Create(f, size, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "v")
	require.NoError(t, err)
	r, err := Device(f, size, 512)
	require.NoError(t, err)
	require.Equal(t, "gpt", r.Kind)
	require.NotNil(t, r.GPT)
	p, ok := r.GPT.Partition(1)
	require.True(t, ok)
	assert.Equal(t, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", p.GUID)
}
