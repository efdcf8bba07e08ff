package probe

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/salt-volumes/salt-volumes/internal/gpt"
)

// headTail is a device whose first and last bytes come from the fuzzer,
// zeros between: the probers read both ends of a device.
type headTail struct {
	head, tail []byte
	size       int64
}

func (d headTail) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= d.size {
		return 0, io.EOF
	}
	n := len(p)
	if int64(n) > d.size-off {
		n = int(d.size - off)
	}
	clear(p[:n])
	if off < int64(len(d.head)) {
		copy(p[:n], d.head[off:])
	}
	tailStart := d.size - int64(len(d.tail))
	if end := off + int64(n); end > tailStart {
		from := max(off, tailStart)
		copy(p[from-off:n], d.tail[from-tailStart:])
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

const fuzzSize = 4 << 20

func fuzzSeeds(f *testing.F) [][2][]byte {
	at := func(off int, v []byte) []byte {
		b := make([]byte, 128<<10)
		copy(b[off:], v)
		return b
	}
	ext4 := at(1080, []byte{0x53, 0xEF})
	binary.LittleEndian.PutUint32(ext4[1024+0x60:], 0x40)
	copy(ext4[1128:], []byte("0123456789abcdef"))
	luks := at(0, []byte("LUKS\xba\xbe"))
	copy(luks[0xa8:], "3f2504e0-4f89-41d3-9a0c-0305e82c3301")
	seeds := [][2][]byte{
		{ext4, nil},
		{at(0, []byte("XFSB")), nil},
		{luks, nil},
		{at(4096-10, []byte("SWAPSPACE2")), nil},
		{at(65536+64, []byte("_BHRfS_M")), nil},
		{at(16<<10, append([]byte{1, 1, 0, 0}, []byte("....pool_guid")...)), nil},
		{at(510, []byte{0x55, 0xaa}), nil},
		{nil, append(make([]byte, 512-8), []byte("EFI PART")...)},
	}
	// A real GPT, both ends.
	p := filepath.Join(f.TempDir(), "img")
	img, err := os.Create(p)
	if err != nil {
		f.Fatal(err)
	}
	defer img.Close()
	if err := img.Truncate(fuzzSize); err != nil {
		f.Fatal(err)
	}
	if _, _, err := gpt.Create(img, fuzzSize, 512, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "v"); err != nil {
		f.Fatal(err)
	}
	head, tail := make([]byte, 34*512), make([]byte, 33*512)
	_, _ = img.ReadAt(head, 0)
	_, _ = img.ReadAt(tail, fuzzSize-int64(len(tail)))
	return append(seeds, [2][]byte{head, tail})
}

// FuzzDevice: any bytes probe to a result or an error, never a panic, and
// a result's UUID is empty or a canonical UUID.
func FuzzDevice(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s[0], s[1], false)
	}
	f.Fuzz(func(t *testing.T, head, tail []byte, bigSectors bool) {
		if len(head)+len(tail) > fuzzSize {
			return
		}
		ss := 512
		if bigSectors {
			ss = 4096
		}
		r, err := Device(headTail{head, tail, fuzzSize}, fuzzSize, ss)
		if err != nil {
			return
		}
		if r.UUID != "" && (len(r.UUID) != 36 || strings.ToLower(r.UUID) != r.UUID) {
			t.Fatalf("UUID %q", r.UUID)
		}
		_ = r.String()
	})
}

// FuzzParseWipefs: wipefs output we cannot read is an error, never a panic.
func FuzzParseWipefs(f *testing.F) {
	f.Add([]byte(`{"signatures":[{"device":"/dev/loop3","offset":"0x200","type":"gpt","uuid":null,"label":null}]}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		sigs, err := ParseWipefs(strings.NewReader(string(b)))
		if err == nil {
			for _, s := range sigs {
				_ = s.String()
			}
		}
	})
}
