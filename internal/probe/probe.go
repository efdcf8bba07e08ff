// Package probe recognises what a device or image already holds, in-process,
// from on-disk magic numbers: the filesystems we create (with their UUID), a
// partition table (with its partitions' GUIDs), and the common signatures of
// data that is not ours, so that we can refuse to touch it.
package probe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
)

// Result describes the first signature found. Kind is "" for a device with no
// recognised signature.
type Result struct {
	Kind string // ext4, ext3, ext2, xfs, gpt, dos, btrfs, swap, LUKS, LVM2_member, ...
	// UUID is the filesystem UUID for ext*/xfs.
	UUID string
	// Label is the filesystem label (ext*, xfs, btrfs, swap): what
	// fstab's LABEL= and udev's /dev/disk/by-label name.
	Label string
	// GPT is the parsed table when Kind == "gpt".
	GPT *gpt.Table
}

// Empty reports whether nothing was recognised.
func (r Result) Empty() bool { return r.Kind == "" }

// String renders the result for error messages.
func (r Result) String() string {
	switch {
	case r.Kind == "":
		return "no signature"
	case r.UUID != "" && (r.Kind == "swap" || r.Kind == "LUKS"):
		return fmt.Sprintf("%s signature (UUID %s)", r.Kind, r.UUID)
	case r.UUID != "":
		return fmt.Sprintf("%s filesystem (UUID %s)", r.Kind, r.UUID)
	case r.Kind == "gpt" && r.GPT != nil:
		return fmt.Sprintf("GPT partition table with %d partition(s)", len(r.GPT.Entries))
	case r.Kind == "gpt" || r.Kind == "dos":
		return r.Kind + " partition table"
	}
	return r.Kind + " signature"
}

// magic is a fixed byte string at a fixed offset.
type magic struct {
	kind string
	off  int64
	val  string
}

// Foreign signatures, checked after ours. Offsets are the ones blkid uses.
var foreign = []magic{
	{"LUKS", 0, "LUKS\xba\xbe"},
	{"LUKS", 0x4000, "SKUL\xba\xbe"},
	{"btrfs", 65536 + 64, "_BHRfS_M"},
	{"swap", 4096 - 10, "SWAPSPACE2"},
	{"swap", 4096 - 10, "SWAP-SPACE"},
	{"swap", 8192 - 10, "SWAPSPACE2"},
	{"swap", 16384 - 10, "SWAPSPACE2"},
	{"swap", 65536 - 10, "SWAPSPACE2"},
	{"LVM2_member", 512, "LABELONE"},
	{"LVM2_member", 0, "LABELONE"},
	{"LVM2_member", 1024, "LABELONE"},
	{"LVM2_member", 1536, "LABELONE"},
	{"linux_raid_member", 0, "\xfc\x4e\x2b\xa9"},
	{"linux_raid_member", 4096, "\xfc\x4e\x2b\xa9"},
	{"bcache", 4096 + 24, "\xc6\x85\x73\xf6\x4e\x1a\x45\xca\x82\x65\xf5\x7f\x48\xba\x6d\x81"},
	{"f2fs", 1024, "\x10\x20\xf5\xf2"},
	{"iso9660", 32769, "CD001"},
	{"squashfs", 0, "hsqs"},
	{"ntfs", 3, "NTFS    "},
	{"vfat", 54, "FAT1"},
	{"vfat", 82, "FAT32   "},
}

const head = 128 << 10

// Device probes r, a device or image of the given size with logical sector
// size ss.
func Device(r io.ReaderAt, size int64, ss int) (Result, error) {
	n := int64(head)
	if size < n {
		n = size
	}
	b := make([]byte, n)
	if _, err := r.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return Result{}, fmt.Errorf("reading the start of the device: %w", err)
	}
	at := func(off int64, l int) []byte {
		if off < 0 || off+int64(l) > int64(len(b)) {
			return nil
		}
		return b[off : off+int64(l)]
	}

	// ext2/3/4: magic 0xEF53 at 1080, UUID at 1128.
	if m := at(1080, 2); m != nil && binary.LittleEndian.Uint16(m) == 0xEF53 {
		compat := binary.LittleEndian.Uint32(at(1024+0x5C, 4))
		incompat := binary.LittleEndian.Uint32(at(1024+0x60, 4))
		kind := "ext2"
		switch {
		case incompat&0x40 != 0 || incompat&0x80 != 0 || incompat&0x200 != 0: // extents, 64bit, flex_bg
			kind = "ext4"
		case compat&0x4 != 0: // has_journal
			kind = "ext3"
		}
		return Result{Kind: kind, UUID: fsUUID(at(1128, 16)), Label: cString(at(1024+0x78, 16))}, nil
	}
	// XFS: "XFSB" at 0, UUID at 32.
	if m := at(0, 4); string(m) == "XFSB" {
		return Result{Kind: "xfs", UUID: fsUUID(at(32, 16)), Label: cString(at(108, 12))}, nil
	}
	// GPT: "EFI PART" at LBA 1. Parse it so callers can see partition GUIDs;
	// a damaged table is still a partition table.
	for _, s := range []int{ss, 512, 4096} {
		if m := at(int64(s), 8); string(m) == "EFI PART" {
			t, err := gpt.Read(headReader{b, r}, size, s)
			if err != nil {
				return Result{Kind: "gpt"}, nil
			}
			return Result{Kind: "gpt", GPT: t}, nil
		}
	}
	for _, f := range foreign {
		if m := at(f.off, len(f.val)); m != nil && string(m) == f.val {
			return Result{Kind: f.kind, UUID: foreignUUID(f.kind, at), Label: foreignLabel(f.kind, at)}, nil
		}
	}
	if zfsAt(b) {
		return Result{Kind: "zfs_member"}, nil
	}
	// A DOS/MBR table (or a FAT/NTFS boot sector, or a GPT whose primary
	// header is gone but whose protective MBR remains).
	if m := at(510, 2); m != nil && m[0] == 0x55 && m[1] == 0xAA {
		return Result{Kind: "dos"}, nil
	}
	// Signatures at the end of the device: the backup GPT and md 0.90/1.0.
	if size > head {
		if k := tail(r, size, ss); k != "" {
			return Result{Kind: k}, nil
		}
	}
	return Result{}, nil
}

// foreignUUID reads the UUID of the foreign kinds that udev would link
// under /dev/disk/by-uuid, so that a volume UUID colliding with one of them
// is noticed without udev.
func foreignUUID(kind string, at func(int64, int) []byte) string {
	switch kind {
	case "btrfs":
		return fsUUID(at(65536+0x20, 16))
	case "swap":
		return fsUUID(at(1024+12, 16))
	case "LUKS":
		if b := at(0xa8, 40); b != nil {
			if u, err := uuid.Parse(string(bytes.TrimRight(b, "\x00"))); err == nil {
				return u.String()
			}
		}
	}
	return ""
}

// foreignLabel reads the label of the foreign kinds that carry one in
// their superblock, for the same reason.
func foreignLabel(kind string, at func(int64, int) []byte) string {
	switch kind {
	case "btrfs":
		return cString(at(65536+0x12b, 256))
	case "swap":
		return cString(at(1024+0x1c, 16))
	}
	return ""
}

// cString is a fixed-size, NUL-padded field as a string.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// zfsAt recognises the first ZFS vdev label by its nvlist, which always
// names the pool GUID.
func zfsAt(b []byte) bool {
	// Label 0 holds an XDR nvlist at 16 KiB whose first bytes are
	// encoding=1 (XDR), endianness, and two reserved zero bytes.
	const off = 16 << 10
	if len(b) < off+4 {
		return false
	}
	return b[off] == 1 && (b[off+1] == 0 || b[off+1] == 1) && b[off+2] == 0 && b[off+3] == 0 &&
		bytes.Contains(b[off:off+1024], []byte("pool_guid"))
}

// tail looks for the signatures kept near the end of a device, read in one
// go: every read of a block device opened afresh goes to the device (the
// kernel drops its cache on the last close), a loop device's through a
// kernel worker, so three small reads cost three round trips.
func tail(r io.ReaderAt, size int64, ss int) string {
	lastSector := size/int64(ss)*int64(ss) - int64(ss)
	// md 1.0: 8 KiB from the end, 4 KiB aligned.
	off10 := ((size >> 9) - 16) &^ 7 * 512
	// md 0.90: 64 KiB from the end, 64 KiB aligned.
	off090 := (size &^ (65536 - 1)) - 65536
	from := min(lastSector, off10)
	if off090 > 0 {
		from = min(from, off090)
	}
	from = max(from, 0)
	b := make([]byte, size-from)
	if _, err := r.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	at := func(off int64, l int) string {
		if off < from || off+int64(l) > size {
			return ""
		}
		return string(b[off-from : off-from+int64(l)])
	}
	if at(lastSector, 8) == "EFI PART" {
		return "gpt"
	}
	const mdMagic = "\xfc\x4e\x2b\xa9"
	if at(off10, 4) == mdMagic || off090 > 0 && at(off090, 4) == mdMagic {
		return "linux_raid_member"
	}
	return ""
}

// headReader serves reads within the start of the device, already read,
// from memory.
type headReader struct {
	head []byte
	r    io.ReaderAt
}

func (h headReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= 0 && off+int64(len(p)) <= int64(len(h.head)) {
		return copy(p, h.head[off:]), nil
	}
	return h.r.ReadAt(p, off)
}

func fsUUID(b []byte) string {
	u, err := uuid.FromBytes(b)
	if err != nil {
		return ""
	}
	return u.String()
}
