// Package gpt writes the one-partition GUID Partition Table of a Block volume
// (through go-diskfs) and reads or patches GPTs in place.
//
// Reading and patching are our own: setting the unique GUID of one partition
// of someone's disk must change exactly those 16 bytes and the two CRCs in
// each copy of the table, and nothing else.
package gpt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"strings"
	"unicode/utf16"

	"github.com/diskfs/go-diskfs/backend"
	dgpt "github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/google/uuid"
)

const (
	signature = "EFI PART"
	// Align is the partition alignment every modern tool uses.
	Align = 1 << 20
	// entriesBytes is the standard 128 entries x 128 bytes array.
	entriesBytes = 128 * 128
)

// ErrNoGPT means neither the primary nor the backup header is valid.
var ErrNoGPT = errors.New("no valid GPT")

// EncodeGUID returns the on-disk (mixed-endian) form of a UUID: the first
// three fields little-endian, the last two as written.
func EncodeGUID(s string) ([16]byte, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return [16]byte{}, err
	}
	var b [16]byte
	binary.LittleEndian.PutUint32(b[0:], binary.BigEndian.Uint32(u[0:4]))
	binary.LittleEndian.PutUint16(b[4:], binary.BigEndian.Uint16(u[4:6]))
	binary.LittleEndian.PutUint16(b[6:], binary.BigEndian.Uint16(u[6:8]))
	copy(b[8:], u[8:])
	return b, nil
}

// DecodeGUID is the inverse of EncodeGUID; it returns lower case.
func DecodeGUID(b []byte) string {
	var u uuid.UUID
	binary.BigEndian.PutUint32(u[0:], binary.LittleEndian.Uint32(b[0:4]))
	binary.BigEndian.PutUint16(u[4:], binary.LittleEndian.Uint16(b[4:6]))
	binary.BigEndian.PutUint16(u[6:], binary.LittleEndian.Uint16(b[6:8]))
	copy(u[8:], b[8:16])
	return u.String()
}

// Entry is one used partition entry.
type Entry struct {
	Index     int // 1-based
	TypeGUID  string
	GUID      string // unique partition GUID, lower case
	FirstLBA  uint64
	LastLBA   uint64
	Name      string
	entryByte int64 // absolute offset of the entry in the primary array
}

// Start and Size are in bytes.
func (e Entry) Start(sectorSize int) int64 { return int64(e.FirstLBA) * int64(sectorSize) }
func (e Entry) Size(sectorSize int) int64 {
	return int64(e.LastLBA-e.FirstLBA+1) * int64(sectorSize)
}

// Table is a parsed GPT.
type Table struct {
	SectorSize int
	DiskGUID   string
	Entries    []Entry
	// FromBackup is set when the primary was unreadable.
	FromBackup bool
}

// Partition returns the entry with the given 1-based index.
func (t *Table) Partition(index int) (Entry, bool) {
	for _, e := range t.Entries {
		if e.Index == index {
			return e, true
		}
	}
	return Entry{}, false
}

type header struct {
	raw        []byte
	myLBA      uint64
	altLBA     uint64
	firstUse   uint64
	lastUse    uint64
	entriesLBA uint64
	numEntries uint32
	entrySize  uint32
}

func readHeader(r io.ReaderAt, lba uint64, ss int) (*header, error) {
	b := make([]byte, ss)
	if _, err := r.ReadAt(b, int64(lba)*int64(ss)); err != nil {
		return nil, err
	}
	if string(b[:8]) != signature {
		return nil, ErrNoGPT
	}
	hsize := binary.LittleEndian.Uint32(b[12:])
	if hsize < 92 || int(hsize) > ss {
		return nil, fmt.Errorf("%w: header size %d", ErrNoGPT, hsize)
	}
	want := binary.LittleEndian.Uint32(b[16:])
	c := append([]byte(nil), b[:hsize]...)
	binary.LittleEndian.PutUint32(c[16:], 0)
	if crc32.ChecksumIEEE(c) != want {
		return nil, fmt.Errorf("%w: header CRC mismatch at LBA %d", ErrNoGPT, lba)
	}
	h := &header{
		raw:        b,
		myLBA:      binary.LittleEndian.Uint64(b[24:]),
		altLBA:     binary.LittleEndian.Uint64(b[32:]),
		firstUse:   binary.LittleEndian.Uint64(b[40:]),
		lastUse:    binary.LittleEndian.Uint64(b[48:]),
		entriesLBA: binary.LittleEndian.Uint64(b[72:]),
		numEntries: binary.LittleEndian.Uint32(b[80:]),
		entrySize:  binary.LittleEndian.Uint32(b[84:]),
	}
	// UEFI allows 128 * 2^n byte entries; anything past a sector each, or
	// an array past 1 MiB, is not a table we could have written or read.
	if h.entrySize < 128 || h.entrySize%8 != 0 || h.entrySize > 4096 || h.numEntries == 0 ||
		h.numEntries > 4096 || uint64(h.numEntries)*uint64(h.entrySize) > 1<<20 {
		return nil, fmt.Errorf("%w: odd entry geometry %dx%d", ErrNoGPT, h.numEntries, h.entrySize)
	}
	return h, nil
}

func (h *header) readEntries(r io.ReaderAt, ss int) ([]byte, error) {
	arr := make([]byte, int(h.numEntries)*int(h.entrySize))
	if _, err := r.ReadAt(arr, int64(h.entriesLBA)*int64(ss)); err != nil {
		return nil, err
	}
	if crc32.ChecksumIEEE(arr) != binary.LittleEndian.Uint32(h.raw[88:]) {
		return nil, fmt.Errorf("%w: partition array CRC mismatch", ErrNoGPT)
	}
	return arr, nil
}

// Read parses the GPT of a device or image of the given size, falling back to
// the backup header when the primary is damaged.
func Read(r io.ReaderAt, size int64, ss int) (*Table, error) {
	h, err := readHeader(r, 1, ss)
	var arr []byte
	if err == nil {
		arr, err = h.readEntries(r, ss)
	}
	fromBackup := false
	if err != nil {
		if size < int64(ss)*2 {
			return nil, err
		}
		hb, berr := readHeader(r, uint64(size/int64(ss))-1, ss)
		if berr != nil {
			return nil, err
		}
		if arr, berr = hb.readEntries(r, ss); berr != nil {
			return nil, err
		}
		h, fromBackup = hb, true
	}
	t := &Table{SectorSize: ss, DiskGUID: DecodeGUID(h.raw[56:72]), FromBackup: fromBackup}
	zero := make([]byte, 16)
	for i := 0; i < int(h.numEntries); i++ {
		e := arr[i*int(h.entrySize) : (i+1)*int(h.entrySize)]
		if bytes.Equal(e[:16], zero) {
			continue
		}
		t.Entries = append(t.Entries, Entry{
			Index:     i + 1,
			TypeGUID:  DecodeGUID(e[0:16]),
			GUID:      DecodeGUID(e[16:32]),
			FirstLBA:  binary.LittleEndian.Uint64(e[32:]),
			LastLBA:   binary.LittleEndian.Uint64(e[40:]),
			Name:      decodeName(e[56:128]),
			entryByte: int64(h.entriesLBA)*int64(ss) + int64(i)*int64(h.entrySize),
		})
	}
	return t, nil
}

func decodeName(b []byte) string {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		c := binary.LittleEndian.Uint16(b[i:])
		if c == 0 {
			break
		}
		u = append(u, c)
	}
	return string(utf16.Decode(u))
}

// Extent is where Create puts the single partition, in bytes.
func Extent(size int64, ss int) (start, length int64, err error) {
	sectors := size / int64(ss)
	entrySectors := int64(entriesBytes / ss)
	if entrySectors == 0 {
		entrySectors = 1
	}
	lastUsable := sectors - 1 - entrySectors - 1
	step := int64(Align / ss)
	startLBA := step
	endLBA := (lastUsable+1)/step*step - 1
	if endLBA <= startLBA {
		return 0, 0, fmt.Errorf("device of %d bytes is too small for an aligned GPT partition", size)
	}
	return startLBA * int64(ss), (endLBA - startLBA + 1) * int64(ss), nil
}

// Create writes a protective MBR and a GPT with one Linux-data partition
// aligned to 1 MiB whose unique GUID is guid. It writes through f and does
// not ask the kernel to re-read anything: the caller owns that step. Each
// part is synced before the next (backup before primary), so a crash leaves
// either the old primary table or the whole new one: what a disk needs.
func Create(f *os.File, size int64, ss int, guid, name string) (start, length int64, err error) {
	return create(f, f, size, ss, guid, name, "")
}

// Relay is Create for a table laid out again over a grown disk or file: the
// same partition GUID and start, the partition to the new end, the backup
// table moved there, and the disk GUID kept (a raw volume's record names
// its disk by it).
func Relay(f *os.File, size int64, ss int, guid, name, diskGUID string) (start, length int64, err error) {
	return create(f, f, size, ss, guid, name, diskGUID)
}

// CreateFresh is Create for a file only this volume uses, whose interrupted
// write is simply written again: the parts need no order among themselves,
// so one sync at the end replaces Create's five.
func CreateFresh(f *os.File, size int64, ss int, guid, name string) (start, length int64, err error) {
	return create(unsynced{f}, f, size, ss, guid, name, "")
}

func create(w backend.WritableFile, f *os.File, size int64, ss int, guid, name, diskGUID string) (start, length int64, err error) {
	start, length, err = Extent(size, ss)
	if err != nil {
		return 0, 0, err
	}
	if len(utf16.Encode([]rune(name))) > 36 {
		name = name[:36]
	}
	t := &dgpt.Table{
		LogicalSectorSize:  ss,
		PhysicalSectorSize: ss,
		GUID:               strings.ToUpper(diskGUID),
		ProtectiveMBR:      true,
		Partitions: []*dgpt.Partition{{
			Index: 1,
			Start: uint64(start / int64(ss)),
			End:   uint64((start+length)/int64(ss)) - 1,
			Type:  dgpt.LinuxFilesystem,
			Name:  name,
			GUID:  strings.ToUpper(guid),
		}},
	}
	if err := t.Write(w, size); err != nil {
		return 0, 0, fmt.Errorf("writing GPT: %w", err)
	}
	return start, length, f.Sync()
}

// unsynced hides the file's Sync from go-diskfs, which syncs after every
// part it writes when it can.
type unsynced struct{ f *os.File }

func (u unsynced) Stat() (fs.FileInfo, error)                { return u.f.Stat() }
func (u unsynced) Read(p []byte) (int, error)                { return u.f.Read(p) }
func (u unsynced) Close() error                              { return nil }
func (u unsynced) ReadAt(p []byte, off int64) (int, error)   { return u.f.ReadAt(p, off) }
func (u unsynced) WriteAt(p []byte, off int64) (int, error)  { return u.f.WriteAt(p, off) }
func (u unsynced) Seek(off int64, whence int) (int64, error) { return u.f.Seek(off, whence) }

// ReadWriterAt is what in-place patching needs.
type ReadWriterAt interface {
	io.ReaderAt
	io.WriterAt
}

// SetPartitionGUID changes the unique GUID of partition index in both the
// primary and the backup table, recomputing their CRCs. Both copies must be
// valid: patching one and leaving a stale other would be worse than refusing.
func SetPartitionGUID(f ReadWriterAt, size int64, ss int, index int, guid string) error {
	g, err := EncodeGUID(guid)
	if err != nil {
		return err
	}
	prim, err := readHeader(f, 1, ss)
	if err != nil {
		return fmt.Errorf("primary GPT: %w", err)
	}
	back, err := readHeader(f, prim.altLBA, ss)
	if err != nil {
		return fmt.Errorf("backup GPT: %w", err)
	}
	for _, h := range []*header{prim, back} {
		arr, err := h.readEntries(f, ss)
		if err != nil {
			return err
		}
		if index < 1 || index > int(h.numEntries) {
			return fmt.Errorf("partition %d is outside the table", index)
		}
		off := (index - 1) * int(h.entrySize)
		if bytes.Equal(arr[off:off+16], make([]byte, 16)) {
			return fmt.Errorf("partition %d is not in the GPT", index)
		}
		copy(arr[off+16:off+32], g[:])
		binary.LittleEndian.PutUint32(h.raw[88:], crc32.ChecksumIEEE(arr))
		hsize := binary.LittleEndian.Uint32(h.raw[12:])
		binary.LittleEndian.PutUint32(h.raw[16:], 0)
		binary.LittleEndian.PutUint32(h.raw[16:], crc32.ChecksumIEEE(h.raw[:hsize]))
		if _, err := f.WriteAt(arr, int64(h.entriesLBA)*int64(ss)); err != nil {
			return err
		}
		if _, err := f.WriteAt(h.raw, int64(h.myLBA)*int64(ss)); err != nil {
			return err
		}
	}
	if s, ok := f.(interface{ Sync() error }); ok {
		return s.Sync()
	}
	return nil
}
