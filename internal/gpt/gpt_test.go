package gpt

import (
	"bytes"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGUIDByteOrder(t *testing.T) {
	// The UEFI spec's mixed-endian layout: first three fields little-endian.
	b, err := EncodeGUID("11111111-2222-4333-8444-555555555555")
	require.NoError(t, err)
	assert.Equal(t, "11111111222233438444555555555555", hex.EncodeToString(b[:]))
	b, err = EncodeGUID("3F2504E0-4F89-41D3-9A0C-0305E82C3301")
	require.NoError(t, err)
	assert.Equal(t, "e004253f894fd3419a0c0305e82c3301", hex.EncodeToString(b[:]))
	assert.Equal(t, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", DecodeGUID(b[:]))
}

func newImage(t *testing.T, size int64) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.img"))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	t.Cleanup(func() { f.Close() })
	return f
}

func TestExtentAligned(t *testing.T) {
	start, length, err := Extent(64<<20, 512)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), start)
	assert.Equal(t, int64(0), (start+length)%Align, "ends on a 1 MiB boundary")
	assert.Equal(t, int64(62<<20), length, "last MiB holds the backup GPT")
	start, length, err = Extent(64<<20, 4096)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), start)
	assert.Equal(t, int64(62<<20), length)
	_, _, err = Extent(1<<20, 512)
	assert.Error(t, err)
}

func TestCreateReadRoundTrip(t *testing.T) {
	const size = 64 << 20
	f := newImage(t, size)
	const guid = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	start, length, err := Create(f, size, 512, guid, "data-1")
	require.NoError(t, err)

	tbl, err := Read(f, size, 512)
	require.NoError(t, err)
	require.Len(t, tbl.Entries, 1)
	p := tbl.Entries[0]
	assert.Equal(t, 1, p.Index)
	assert.Equal(t, guid, p.GUID)
	assert.Equal(t, "0fc63daf-8483-4772-8e79-3d69d8477de4", p.TypeGUID)
	assert.Equal(t, "data-1", p.Name)
	assert.Equal(t, start, p.Start(512))
	assert.Equal(t, length, p.Size(512))
	assert.False(t, tbl.FromBackup)

	// Protective MBR: type 0xEE at the first entry and the boot signature.
	mbr := make([]byte, 512)
	_, err = f.ReadAt(mbr, 0)
	require.NoError(t, err)
	assert.Equal(t, byte(0xEE), mbr[446+4])
	assert.Equal(t, []byte{0x55, 0xAA}, mbr[510:512])
}

func TestReadFallsBackToBackup(t *testing.T) {
	const size = 16 << 20
	f := newImage(t, size)
	_, _, err := Create(f, size, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "x")
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("garbage!"), 512) // break the primary signature
	require.NoError(t, err)
	tbl, err := Read(f, size, 512)
	require.NoError(t, err)
	assert.True(t, tbl.FromBackup)
	assert.Equal(t, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", tbl.Entries[0].GUID)
}

func TestSetPartitionGUIDTouchesOnlyGUIDAndCRCs(t *testing.T) {
	const size = 16 << 20
	f := newImage(t, size)
	_, _, err := Create(f, size, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "x")
	require.NoError(t, err)
	before, err := os.ReadFile(f.Name())
	require.NoError(t, err)

	const newGUID = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
	require.NoError(t, SetPartitionGUID(f, size, 512, 1, newGUID))
	after, err := os.ReadFile(f.Name())
	require.NoError(t, err)

	tbl, err := Read(f, size, 512)
	require.NoError(t, err)
	assert.Equal(t, newGUID, tbl.Entries[0].GUID)
	// Backup must agree, or tools will "repair" one from the other.
	assert.Equal(t, newGUID, readBackup(t, f, size).Entries[0].GUID)

	// Exactly: 16 GUID bytes + 4 array CRC bytes + 4 header CRC bytes, twice.
	diff := 0
	for i := range before {
		if before[i] != after[i] {
			diff++
		}
	}
	assert.LessOrEqual(t, diff, 2*(16+4+4))
	assert.Greater(t, diff, 2*10)

	assert.Error(t, SetPartitionGUID(f, size, 512, 2, newGUID), "an unused entry is refused")
}

func TestSetPartitionGUIDRefusesDamagedTable(t *testing.T) {
	const size = 16 << 20
	f := newImage(t, size)
	_, _, err := Create(f, size, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "x")
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff}, 1024+100) // corrupt the primary array
	require.NoError(t, err)
	before, _ := os.ReadFile(f.Name())
	assert.Error(t, SetPartitionGUID(f, size, 512, 1, "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"))
	after, _ := os.ReadFile(f.Name())
	assert.True(t, bytes.Equal(before, after), "nothing written on refusal")
}

func TestHeaderCRCIsChecked(t *testing.T) {
	const size = 16 << 20
	f := newImage(t, size)
	_, _, err := Create(f, size, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "x")
	require.NoError(t, err)
	// Flip one byte of the primary header's disk GUID: the signature is
	// intact, only the header CRC can tell.
	b := make([]byte, 1)
	_, err = f.ReadAt(b, 512+56)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{b[0] ^ 0xff}, 512+56)
	require.NoError(t, err)
	tbl, err := Read(f, size, 512)
	require.NoError(t, err)
	assert.True(t, tbl.FromBackup, "a header with a bad CRC is not trusted")

	// And a bad entry-array CRC: flip a byte of the partition name.
	f2 := newImage(t, size)
	_, _, err = Create(f2, size, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "x")
	require.NoError(t, err)
	_, err = f2.WriteAt([]byte{'Y'}, 1024+56)
	require.NoError(t, err)
	tbl, err = Read(f2, size, 512)
	require.NoError(t, err)
	assert.True(t, tbl.FromBackup)
	assert.Equal(t, "x", tbl.Entries[0].Name, "the intact backup is what is read")
}

// CreateFresh skips the syncs between parts, nothing else: the table it
// writes must be the one Create writes, byte for byte apart from the
// random disk GUID and the header CRCs that cover it.
func TestCreateFreshWritesWhatCreateWrites(t *testing.T) {
	const size = 32 << 20
	const guid = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	a, b := newImage(t, size), newImage(t, size)
	sa, la, err := Create(a, size, 512, guid, "vol")
	require.NoError(t, err)
	sb, lb, err := CreateFresh(b, size, 512, guid, "vol")
	require.NoError(t, err)
	assert.Equal(t, sa, sb)
	assert.Equal(t, la, lb)

	ta, err := Read(a, size, 512)
	require.NoError(t, err)
	tb, err := Read(b, size, 512)
	require.NoError(t, err)
	assert.False(t, tb.FromBackup, "the primary table is whole")
	assert.Equal(t, ta.Entries, tb.Entries)

	// The backup header too, read on its own.
	assert.Equal(t, guid, readBackup(t, b, size).Entries[0].GUID)

	// And the file is still open for the caller: the wrapper must not have
	// closed it.
	_, err = b.Stat()
	assert.NoError(t, err)
}

// readBackup wipes the primary GPT header (LBA 1, 512-byte sectors) and
// reads the table again: it must come whole from the backup header.
func readBackup(t *testing.T, f interface {
	io.ReaderAt
	io.WriterAt
}, size int64) *Table {
	t.Helper()
	_, err := f.WriteAt(make([]byte, 512), 512)
	require.NoError(t, err)
	tbl, err := Read(f, size, 512)
	require.NoError(t, err)
	assert.True(t, tbl.FromBackup)
	return tbl
}
