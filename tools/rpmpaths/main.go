// Command rpmpaths rewrites the payload of RPM packages so that its file
// names are relative ("./usr/bin/x"), as rpmbuild writes them, and brings
// the header's digests and sizes up to date.
//
//	rpmpaths FILE.rpm...
//
// nfpm's RPM writer names payload files by absolute paths ("/usr/bin/x").
// rpm installs either way (it places files by the header), but whoever
// looks inside the usual way, rpm2cpio x.rpm | cpio -idm, as root writes
// the package over the machine's own /usr and /etc, and rpmlint 2.4 does
// exactly that. The package is rewritten in place (atomically); running
// it on a package already rewritten changes nothing.
package main

import (
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rpmpaths FILE.rpm...")
		os.Exit(2)
	}
	for _, p := range os.Args[1:] {
		if err := rewriteFile(p); err != nil {
			fmt.Fprintf(os.Stderr, "rpmpaths: %s: %v\n", p, err)
			os.Exit(1)
		}
	}
}

func rewriteFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := rewrite(b)
	if err != nil {
		return err
	}
	if bytes.Equal(out, b) {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".rpmpaths-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(out); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

const leadSize = 96

var headerMagic = []byte{0x8e, 0xad, 0xe8, 0x01, 0, 0, 0, 0}

// header is one header structure of the package, in place in the file.
type header struct {
	start, end int // the structure's bytes in the file
	entries    map[uint32]entry
	data       int // where its data store starts in the file
}

type entry struct{ typ, off, count uint32 }

// Tag types of the header format.
const (
	typeInt32       = 4
	typeInt64       = 5
	typeString      = 6
	typeBin         = 7
	typeStringArray = 8
)

// Tags this rewrite keeps true (signature header, then main header).
const (
	sigSize            = 1000
	sigMD5             = 1004
	sigPayloadSize     = 1007
	sigSHA1            = 269
	sigLongSize        = 270
	sigLongArchiveSize = 271
	sigSHA256          = 273

	tagArchiveSize       = 1046
	tagLongArchiveSize   = 271
	tagPayloadFormat     = 1124
	tagPayloadCompressor = 1125
	tagPayloadFlags      = 1126
	tagPayloadDigest     = 5092
	tagPayloadDigestAlgo = 5093
	tagPayloadDigestAlt  = 5097
)

func readHeader(b []byte, at int) (*header, error) {
	if at+16 > len(b) || !bytes.Equal(b[at:at+8], headerMagic) {
		return nil, fmt.Errorf("no RPM header at byte %d", at)
	}
	n := int(binary.BigEndian.Uint32(b[at+8:]))
	size := int(binary.BigEndian.Uint32(b[at+12:]))
	h := &header{start: at, data: at + 16 + 16*n, entries: map[uint32]entry{}}
	h.end = h.data + size
	if n > 1<<16 || h.end > len(b) {
		return nil, fmt.Errorf("a header at byte %d runs past the file", at)
	}
	for i := range n {
		e := b[at+16+16*i:]
		tag := binary.BigEndian.Uint32(e)
		en := entry{binary.BigEndian.Uint32(e[4:]), binary.BigEndian.Uint32(e[8:]), binary.BigEndian.Uint32(e[12:])}
		if int(en.off) >= size {
			return nil, fmt.Errorf("tag %d of the header at byte %d points past its data", tag, at)
		}
		h.entries[tag] = en
	}
	return h, nil
}

// str reads a STRING or the first of a STRING_ARRAY.
func (h *header) str(b []byte, tag uint32) (string, bool) {
	e, ok := h.entries[tag]
	if !ok || (e.typ != typeString && e.typ != typeStringArray) {
		return "", false
	}
	s := b[h.data+int(e.off) : h.end]
	if i := bytes.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return string(s), true
}

// setStr overwrites a STRING (or a one-string STRING_ARRAY) with one of
// the same length: digests in hex keep theirs.
func (h *header) setStr(b []byte, tag uint32, v string) error {
	old, ok := h.str(b, tag)
	if !ok {
		return nil
	}
	if len(old) != len(v) || h.entries[tag].count != 1 {
		return fmt.Errorf("tag %d: %d characters, the new value %d", tag, len(old), len(v))
	}
	copy(b[h.data+int(h.entries[tag].off):], v)
	return nil
}

// setInt overwrites an INT32 or INT64 tag.
func (h *header) setInt(b []byte, tag uint32, v uint64) error {
	e, ok := h.entries[tag]
	if !ok {
		return nil
	}
	at := h.data + int(e.off)
	switch {
	case e.typ == typeInt32 && e.count == 1:
		if v > 0xffffffff {
			return fmt.Errorf("tag %d: %d does not fit 32 bits", tag, v)
		}
		binary.BigEndian.PutUint32(b[at:], uint32(v))
	case e.typ == typeInt64 && e.count == 1:
		binary.BigEndian.PutUint64(b[at:], v)
	default:
		return fmt.Errorf("tag %d: type %d count %d is not one integer", tag, e.typ, e.count)
	}
	return nil
}

func (h *header) setBin(b []byte, tag uint32, v []byte) error {
	e, ok := h.entries[tag]
	if !ok {
		return nil
	}
	if e.typ != typeBin || int(e.count) != len(v) {
		return fmt.Errorf("tag %d: type %d of %d bytes, the new value %d", tag, e.typ, e.count, len(v))
	}
	copy(b[h.data+int(e.off):], v)
	return nil
}

func rewrite(in []byte) ([]byte, error) {
	b := append([]byte(nil), in...)
	if len(b) < leadSize || !bytes.Equal(b[:4], []byte{0xed, 0xab, 0xee, 0xdb}) {
		return nil, errors.New("not an RPM package (no lead)")
	}
	sig, err := readHeader(b, leadSize)
	if err != nil {
		return nil, err
	}
	// Only digests and sizes are brought up to date: a signature (RSA,
	// PGP, DSA) or a digest this does not know would be left stale, so a
	// package carrying one is refused, changing nothing (sign after this).
	for tag := range sig.entries {
		switch tag {
		case 62, sigSHA1, sigLongSize, sigLongArchiveSize, sigSHA256, sigSize, sigMD5, sigPayloadSize, 1008:
		default:
			return nil, fmt.Errorf("the signature header holds tag %d (a signature or a digest this tool does not update): rewrite the payload before signing", tag)
		}
	}
	mainAt := sig.end + (8-(sig.end-leadSize)%8)%8
	main, err := readHeader(b, mainAt)
	if err != nil {
		return nil, err
	}
	if f, _ := main.str(b, tagPayloadFormat); f != "cpio" {
		return nil, fmt.Errorf("payload format %q: only cpio is rewritten", f)
	}
	if c, _ := main.str(b, tagPayloadCompressor); c != "gzip" {
		return nil, fmt.Errorf("payload compressor %q: only gzip is rewritten", c)
	}
	if a, ok := main.entries[tagPayloadDigestAlgo]; ok {
		if a.typ != typeInt32 {
			return nil, fmt.Errorf("payload digest algorithm of type %d", a.typ)
		}
		if algo := binary.BigEndian.Uint32(b[main.data+int(a.off):]); algo != 8 {
			return nil, fmt.Errorf("payload digest algorithm %d: only SHA-256 (8) is kept", algo)
		}
	}
	zr, err := gzip.NewReader(bytes.NewReader(b[main.end:]))
	if err != nil {
		return nil, fmt.Errorf("the payload: %w", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("the payload: %w", err)
	}
	cpio, changed, err := relativeNames(raw)
	if err != nil {
		return nil, err
	}
	if !changed {
		return in, nil
	}
	level := gzip.BestCompression
	if s, ok := main.str(b, tagPayloadFlags); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n >= 1 && n <= 9 {
			level = n
		}
	}
	var z bytes.Buffer
	zw, err := gzip.NewWriterLevel(&z, level)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(cpio); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	payload := z.Bytes()

	hexsum := func(h hash.Hash, parts ...[]byte) string {
		for _, p := range parts {
			h.Write(p)
		}
		return hex.EncodeToString(h.Sum(nil))
	}
	for _, set := range []error{
		main.setStr(b, tagPayloadDigest, hexsum(sha256.New(), payload)),
		main.setStr(b, tagPayloadDigestAlt, hexsum(sha256.New(), cpio)),
		main.setInt(b, tagArchiveSize, uint64(len(cpio))),
		main.setInt(b, tagLongArchiveSize, uint64(len(cpio))),
	} {
		if set != nil {
			return nil, set
		}
	}
	hdr := b[main.start:main.end]
	md := md5.Sum(append(append([]byte(nil), hdr...), payload...))
	for _, set := range []error{
		sig.setStr(b, sigSHA256, hexsum(sha256.New(), hdr)),
		sig.setStr(b, sigSHA1, hexsum(sha1.New(), hdr)),
		sig.setInt(b, sigSize, uint64(len(hdr)+len(payload))),
		sig.setInt(b, sigLongSize, uint64(len(hdr)+len(payload))),
		sig.setInt(b, sigPayloadSize, uint64(len(cpio))),
		sig.setInt(b, sigLongArchiveSize, uint64(len(cpio))),
		sig.setBin(b, sigMD5, md[:]),
	} {
		if set != nil {
			return nil, set
		}
	}
	return append(b[:main.end:main.end], payload...), nil
}

// relativeNames rewrites the names of a newc cpio archive: "/x" becomes
// "./x". It refuses any other archive than newc (what rpm writes) and
// names that climb out ("..").
func relativeNames(a []byte) ([]byte, bool, error) {
	var out bytes.Buffer
	changed := false
	pad4 := func(n int) int { return (4 - n%4) % 4 }
	for off := 0; ; {
		if off+110 > len(a) {
			return nil, false, errors.New("the payload's cpio archive ends without its trailer")
		}
		h := a[off : off+110]
		if string(h[:6]) != "070701" && string(h[:6]) != "070702" {
			return nil, false, fmt.Errorf("the payload is not a newc cpio archive (magic %q)", h[:6])
		}
		field := func(i int) (int, error) {
			n, err := strconv.ParseUint(string(h[6+8*i:14+8*i]), 16, 32)
			return int(n), err
		}
		fileSize, err1 := field(6)
		nameSize, err2 := field(11)
		if err := errors.Join(err1, err2); err != nil || nameSize < 1 {
			return nil, false, fmt.Errorf("a cpio header at byte %d: %v", off, err)
		}
		nameAt := off + 110
		if nameAt+nameSize > len(a) {
			return nil, false, errors.New("a cpio name runs past the archive")
		}
		name := string(a[nameAt : nameAt+nameSize-1])
		dataAt := nameAt + nameSize + pad4(110+nameSize)
		next := dataAt + fileSize + pad4(fileSize)
		if next > len(a) {
			return nil, false, errors.New("a cpio file runs past the archive")
		}
		for _, part := range strings.Split(name, "/") {
			if part == ".." {
				return nil, false, fmt.Errorf("payload name %q climbs out", name)
			}
		}
		if strings.HasPrefix(name, "/") {
			name, changed = "."+name, true
		}
		hdr := append([]byte(nil), h...)
		copy(hdr[6+8*11:], fmt.Sprintf("%08X", len(name)+1))
		out.Write(hdr)
		out.WriteString(name)
		out.WriteByte(0)
		out.Write(make([]byte, pad4(110+len(name)+1)))
		out.Write(a[dataAt : dataAt+fileSize])
		out.Write(make([]byte, pad4(fileSize)))
		off = next
		if name == "TRAILER!!!" {
			// What follows the trailer is padding.
			out.Write(a[off:])
			return out.Bytes(), changed, nil
		}
	}
}
