package blockdev

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ZeroChunk is how much one BLKZEROOUT asks for: small enough that
// progress can be told and a cancelled wipe stops soon, large enough that
// the kernel offloads it (WRITE ZEROES, or unmapping on a thin device).
const ZeroChunk = 256 << 20

// ZeroOut zeroes [off, off+n) of the open block device with BLKZEROOUT:
// the kernel uses the device's write-zeroes command where it has one and
// writes zero pages where it does not, and drops the page cache of the
// range, so what is read next comes from the device.
func ZeroOut(f *os.File, off, n int64) error {
	r := [2]uint64{uint64(off), uint64(n)}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&r))); e != 0 {
		return fmt.Errorf("BLKZEROOUT at %d (+%d): %w", off, n, e)
	}
	return nil
}

// SampleBlock is the size of each block a verification reads back.
const SampleBlock = 4096

// SampleOffsets picks the blocks a wipe's verification reads: the first
// and the last block of the device, and count blocks at offsets drawn
// from seed (reported, so a run can be repeated).
func SampleOffsets(size int64, seed uint64, count int) []int64 {
	blocks := size / SampleBlock
	if blocks <= 0 {
		return nil
	}
	out := []int64{0}
	if blocks > 1 {
		out = append(out, (blocks-1)*SampleBlock)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5a17))
	for i := 0; i < count; i++ {
		out = append(out, rng.Int64N(blocks)*SampleBlock)
	}
	return out
}

// VerifyZero reads back the blocks at offsets (through r, a direct reader
// of the device) and returns the first one that is not all zero.
func VerifyZero(r io.ReaderAt, offsets []int64) (bad int64, err error) {
	buf := make([]byte, SampleBlock)
	zero := make([]byte, SampleBlock)
	for _, off := range offsets {
		n, err := r.ReadAt(buf, off)
		if err != nil && !(err == io.EOF && n == len(buf)) {
			return off, fmt.Errorf("reading back %d bytes at %d: %w", len(buf), off, err)
		}
		if !bytes.Equal(buf, zero) {
			return off, fmt.Errorf("the %d bytes at offset %d are not zero after zeroing", len(buf), off)
		}
	}
	return -1, nil
}
