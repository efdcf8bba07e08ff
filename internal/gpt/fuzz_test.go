package gpt

import (
	"os"
	"path/filepath"
	"testing"
)

// sparseDev is a device made of a head and a tail with zeros between, so a
// fuzzer can reach both the primary and the backup GPT of a 4 MiB device
// with a few dozen KiB of input.
type sparseDev struct {
	head, tail []byte
	size       int64
}

func (d sparseDev) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > d.size {
		return 0, os.ErrInvalid
	}
	clear(p)
	if off < int64(len(d.head)) {
		copy(p, d.head[off:])
	}
	tailStart := d.size - int64(len(d.tail))
	if end := off + int64(len(p)); end > tailStart {
		from := max(off, tailStart)
		copy(p[from-off:], d.tail[from-tailStart:])
	}
	return len(p), nil
}

const fuzzSize = 4 << 20

// seedImage is a real table written by Create, cut into head and tail.
func seedImage(f *testing.F) ([]byte, []byte) {
	p := filepath.Join(f.TempDir(), "img")
	img, err := os.Create(p)
	if err != nil {
		f.Fatal(err)
	}
	defer img.Close()
	if err := img.Truncate(fuzzSize); err != nil {
		f.Fatal(err)
	}
	if _, _, err := Create(img, fuzzSize, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "data-1"); err != nil {
		f.Fatal(err)
	}
	head, tail := make([]byte, 34*512), make([]byte, 33*512)
	if _, err := img.ReadAt(head, 0); err != nil {
		f.Fatal(err)
	}
	if _, err := img.ReadAt(tail, fuzzSize-int64(len(tail))); err != nil {
		f.Fatal(err)
	}
	return head, tail
}

// FuzzRead: whatever the bytes, Read returns an error or a table whose
// partitions lie inside the device; it never panics or allocates without
// bound.
func FuzzRead(f *testing.F) {
	head, tail := seedImage(f)
	f.Add(head, tail)
	f.Add(head, []byte{})
	f.Add(make([]byte, 1024), tail)
	f.Fuzz(func(t *testing.T, head, tail []byte) {
		if len(head)+len(tail) > fuzzSize {
			return
		}
		tab, err := Read(sparseDev{head, tail, fuzzSize}, fuzzSize, 512)
		if err != nil {
			return
		}
		for _, e := range tab.Entries {
			if e.Index < 1 {
				t.Fatalf("entry index %d", e.Index)
			}
			if len(e.GUID) != 36 {
				t.Fatalf("GUID %q", e.GUID)
			}
		}
	})
}
