package events

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
)

// The bus carries every event of the master: minion auth, other jobs'
// returns, beacons of other tools. The control plane needs a few percent of
// them. The scanner reads a frame's body as bytes (straight out of the read
// buffer when it fits), looks at the tag, and for job returns at the
// function, before anything is decoded into Go values: an event that is not
// ours costs no allocation.

// Want decides from the tag and the raw msgpack data whether an event is
// decoded. nil wants everything.
type Want func(tag, data []byte) bool

// Relevant wants what the control plane uses: progress and node events of
// ours, and job returns of state runs or of our own module's functions
// (plus any job return in a minion's envelope, which the reconciler counts
// as forged).
func Relevant(tag, data []byte) bool {
	switch kindOf(tag) {
	case KindProgress, KindNodeHealth, KindNodeRestore:
		return true
	case KindJobReturn:
		return returnRelevant(data)
	}
	return false
}

var (
	keyFun        = []byte("fun")
	keyCmd        = []byte("cmd")
	prefixState   = []byte("state.")
	prefixOurs    = []byte("salt_volumes.")
	cmdMinionEvnt = []byte("_minion_event")
)

// returnRelevant reads the top level of a job return's data for "fun" and
// "cmd", skipping every other value undecoded.
func returnRelevant(data []byte) bool {
	s := src{b: data}
	n, ok, err := mapHeader(&s)
	if err != nil || !ok {
		return false
	}
	for i := 0; i < n; i++ {
		k, err := strBytes(&s)
		if err != nil {
			return false
		}
		switch {
		case bytes.Equal(k, keyFun):
			// A minion's envelope has no "fun": past this, only the
			// function decides.
			v, err := strBytes(&s)
			return err == nil && (bytes.HasPrefix(v, prefixState) || bytes.HasPrefix(v, prefixOurs))
		case bytes.Equal(k, keyCmd):
			v, err := strBytes(&s)
			if err != nil {
				return false
			}
			if bytes.Equal(v, cmdMinionEvnt) {
				return true
			}
		default:
			if err := skip(&s, 0); err != nil {
				return false
			}
		}
	}
	return false
}

// kindOf is Kind on a tag given as bytes or a string, without allocating.
func kindOf[T string | []byte](tag T) string {
	var p [6]int // start of each of the first 5 parts, and the end
	parts := 0
	start := 0
	for i := 0; i <= len(tag); i++ {
		if i == len(tag) || tag[i] == '/' {
			if parts == 5 {
				return KindOther // more than five parts: none of ours
			}
			p[parts] = start
			parts++
			start = i + 1
		}
	}
	p[parts] = len(tag) + 1
	part := func(i int) T { return tag[p[i] : p[i+1]-1] }
	eq := func(i int, s string) bool { return string(part(i)) == s }
	switch {
	case parts == 4 && eq(0, "salt") && eq(1, "job") && eq(3, "new"):
		return KindJobNew
	case parts == 5 && eq(0, "salt") && eq(1, "job") && eq(3, "ret"):
		return KindJobReturn
	case parts == 4 && eq(0, "salt") && eq(1, "run") && eq(3, "new"):
		return KindRunNew
	case parts == 4 && eq(0, "salt") && eq(1, "run") && eq(3, "ret"):
		return KindRunReturn
	case parts == 4 && eq(0, "salt") && eq(1, "minion") && eq(3, "start"):
		return KindMinionStart
	case parts == 3 && eq(0, "salt-volumes") && eq(2, "progress"):
		return KindProgress
	case parts == 4 && eq(0, "salt-volumes") && eq(1, "node") && eq(3, "health"):
		return KindNodeHealth
	case parts == 4 && eq(0, "salt-volumes") && eq(1, "node") && eq(3, "restore"):
		return KindNodeRestore
	}
	return KindOther
}

// src is where the scanner reads msgpack from: a byte slice (a body), or
// the stream through a read buffer (br set), counting the bytes of the
// current frame against MaxFrame. One concrete type, not an interface: a
// scanner on the stack stays there.
type src struct {
	b   []byte
	off int

	br   *bufio.Reader
	used int64
	big  []byte // reused for values larger than the read buffer

	// strs interns short strings while decoding: Salt's events repeat the
	// same keys and many of the same values, event after event.
	strs map[string]string
}

// Bounds of the intern table: short strings only, and a fixed number of
// them, so a stream of unique values cannot grow it.
const (
	internMaxLen  = 32
	internMaxSize = 16384
)

func (s *src) str(b []byte) string {
	if s.strs == nil || len(b) > internMaxLen {
		return string(b)
	}
	if v, ok := s.strs[string(b)]; ok {
		return v
	}
	v := string(b)
	if len(s.strs) < internMaxSize {
		s.strs[v] = v
	}
	return v
}

var errBadCode = errors.New("invalid msgpack code")

func (s *src) count(n int) error {
	s.used += int64(n)
	if n < 0 || s.used > MaxFrame {
		return ErrFrameTooLarge
	}
	return nil
}

func (s *src) byte() (byte, error) {
	if s.br != nil {
		if err := s.count(1); err != nil {
			return 0, err
		}
		return s.br.ReadByte()
	}
	if s.off >= len(s.b) {
		return 0, io.ErrUnexpectedEOF
	}
	c := s.b[s.off]
	s.off++
	return c, nil
}

// take returns the next n bytes, valid until the next read.
func (s *src) take(n int) ([]byte, error) {
	if s.br == nil {
		if n < 0 || n > len(s.b)-s.off {
			return nil, io.ErrUnexpectedEOF
		}
		v := s.b[s.off : s.off+n]
		s.off += n
		return v, nil
	}
	if err := s.count(n); err != nil {
		return nil, err
	}
	if n <= s.br.Size() {
		b, err := s.br.Peek(n)
		if err != nil {
			return nil, err
		}
		_, _ = s.br.Discard(n)
		// Peek's bytes stay put until the next read fills the buffer.
		return b, nil
	}
	if cap(s.big) < n {
		s.big = make([]byte, n)
	}
	b := s.big[:n]
	_, err := io.ReadFull(s.br, b)
	return b, err
}

func (s *src) discard(n int) error {
	if s.br == nil {
		_, err := s.take(n)
		return err
	}
	if err := s.count(n); err != nil {
		return err
	}
	_, err := s.br.Discard(n)
	return err
}

// left is how many bytes a slice source has left (a stream: unknown, the
// frame's allowance).
func (s *src) left() int {
	if s.br != nil {
		return int(MaxFrame - s.used)
	}
	return len(s.b) - s.off
}

func be(b []byte) int {
	n := 0
	for _, c := range b {
		n = n<<8 | int(c)
	}
	return n
}

// length reads a big-endian length of size bytes.
func length(s *src, size int) (int, error) {
	b, err := s.take(size)
	if err != nil {
		return 0, err
	}
	n := be(b)
	if n < 0 || n > MaxFrame {
		return 0, ErrFrameTooLarge
	}
	return n, nil
}

// mapHeader reads a map header; ok is false (and the code consumed) if
// the value is not a map.
func mapHeader(s *src) (n int, ok bool, err error) {
	c, err := s.byte()
	if err != nil {
		return 0, false, err
	}
	n, ok, err = mapLen(s, c)
	return n, ok, err
}

func mapLen(s *src, c byte) (int, bool, error) {
	switch {
	case c >= 0x80 && c <= 0x8f:
		return int(c & 0x0f), true, nil
	case c == 0xde:
		n, err := length(s, 2)
		return n, true, err
	case c == 0xdf:
		n, err := length(s, 4)
		return n, true, err
	}
	return 0, false, nil
}

// strLen reads the header of a str or bin value.
func strLen(s *src, c byte) (int, bool, error) {
	switch {
	case c >= 0xa0 && c <= 0xbf:
		return int(c & 0x1f), true, nil
	case c == 0xd9 || c == 0xc4:
		n, err := length(s, 1)
		return n, true, err
	case c == 0xda || c == 0xc5:
		n, err := length(s, 2)
		return n, true, err
	case c == 0xdb || c == 0xc6:
		n, err := length(s, 4)
		return n, true, err
	}
	return 0, false, nil
}

// strBytes reads a str or bin value; anything else is skipped and yields
// nil.
func strBytes(s *src) ([]byte, error) {
	c, err := s.byte()
	if err != nil {
		return nil, err
	}
	n, ok, err := strLen(s, c)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, skipAfter(s, c, 0)
	}
	return s.take(n)
}

// skip passes over one value without decoding it.
func skip(s *src, depth int) error {
	c, err := s.byte()
	if err != nil {
		return err
	}
	return skipAfter(s, c, depth)
}

func skipAfter(s *src, c byte, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	// The common cases of a body, without the stream's bookkeeping.
	if s.br == nil {
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			return nil
		case c >= 0xa0 && c <= 0xbf:
			n := int(c & 0x1f)
			if n > len(s.b)-s.off {
				return io.ErrUnexpectedEOF
			}
			s.off += n
			return nil
		case c >= 0x80 && c <= 0x8f:
			for i := 0; i < 2*int(c&0x0f); i++ {
				if s.off >= len(s.b) {
					return io.ErrUnexpectedEOF
				}
				c := s.b[s.off]
				s.off++
				if err := skipAfter(s, c, depth+1); err != nil {
					return err
				}
			}
			return nil
		}
	}
	if n, ok, err := strLen(s, c); ok || err != nil {
		if err != nil {
			return err
		}
		return s.discard(n)
	}
	if n, ok, err := mapLen(s, c); ok || err != nil {
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := skip(s, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	n := 0
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return nil // fixint, nil, bool
	case c >= 0x90 && c <= 0x9f:
		n = int(c & 0x0f)
	case c == 0xdc || c == 0xdd:
		size := 2
		if c == 0xdd {
			size = 4
		}
		var err error
		if n, err = length(s, size); err != nil {
			return err
		}
	case c == 0xcc || c == 0xd0:
		return s.discard(1)
	case c == 0xcd || c == 0xd1:
		return s.discard(2)
	case c == 0xce || c == 0xd2 || c == 0xca:
		return s.discard(4)
	case c == 0xcf || c == 0xd3 || c == 0xcb:
		return s.discard(8)
	case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16 (+ type byte)
		return s.discard(1 + 1<<(c-0xd4))
	case c >= 0xc7 && c <= 0xc9: // ext 8, 16, 32
		size := 1 << (c - 0xc7)
		l, err := length(s, size)
		if err != nil {
			return err
		}
		return s.discard(l + 1)
	default:
		return errBadCode
	}
	for i := 0; i < n; i++ {
		if err := skip(s, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// decodeData decodes one msgpack value from a body the way Salt's events
// need: maps get string keys whatever the wire type of the key (str, bin,
// int); integers become int64 (uint64 past its range), floats float64; ext
// 78 and 79 are SaltTime and SaltConstant. Lengths are checked against
// what is left before anything is allocated for them.
func decodeData(s *src, depth int) (any, error) {
	if depth > maxDepth {
		return nil, errTooDeep
	}
	c, err := s.byte()
	if err != nil {
		return nil, err
	}
	switch {
	case c <= 0x7f:
		return int64(c), nil
	case c >= 0xe0:
		return int64(int8(c)), nil
	case c >= 0xa0 && c <= 0xbf:
		b, err := s.take(int(c & 0x1f))
		return s.str(b), err
	case c >= 0x80 && c <= 0x8f:
		return decodeMap(s, int(c&0x0f), depth)
	case c >= 0x90 && c <= 0x9f:
		return decodeArray(s, int(c&0x0f), depth)
	}
	switch c {
	case 0xc0:
		return nil, nil
	case 0xc2:
		return false, nil
	case 0xc3:
		return true, nil
	case 0xd9, 0xda, 0xdb:
		n, _, err := strLen(s, c)
		if err != nil {
			return nil, err
		}
		b, err := s.take(n)
		return s.str(b), err
	case 0xc4, 0xc5, 0xc6:
		n, _, err := strLen(s, c)
		if err != nil {
			return nil, err
		}
		b, err := s.take(n)
		return bytes.Clone(b), err
	case 0xde, 0xdf:
		n, _, err := mapLen(s, c)
		if err != nil {
			return nil, err
		}
		return decodeMap(s, n, depth)
	case 0xdc, 0xdd:
		size := 2
		if c == 0xdd {
			size = 4
		}
		n, err := length(s, size)
		if err != nil {
			return nil, err
		}
		return decodeArray(s, n, depth)
	case 0xcc, 0xcd, 0xce, 0xcf:
		b, err := s.take(1 << (c - 0xcc))
		if err != nil {
			return nil, err
		}
		var u uint64
		for _, x := range b {
			u = u<<8 | uint64(x)
		}
		if u <= 1<<63-1 {
			return int64(u), nil
		}
		return u, nil
	case 0xd0, 0xd1, 0xd2, 0xd3:
		size := 1 << (c - 0xd0)
		b, err := s.take(size)
		if err != nil {
			return nil, err
		}
		var u uint64
		for _, x := range b {
			u = u<<8 | uint64(x)
		}
		shift := 64 - 8*size
		return int64(u<<shift) >> shift, nil
	case 0xca:
		b, err := s.take(4)
		if err != nil {
			return nil, err
		}
		return float64(math.Float32frombits(uint32(be(b)))), nil
	case 0xcb:
		b, err := s.take(8)
		if err != nil {
			return nil, err
		}
		var u uint64
		for _, x := range b {
			u = u<<8 | uint64(x)
		}
		return math.Float64frombits(u), nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xc7, 0xc8, 0xc9:
		var n int
		if c >= 0xd4 {
			n = 1 << (c - 0xd4)
		} else if n, err = length(s, 1<<(c-0xc7)); err != nil {
			return nil, err
		}
		typ, err := s.byte()
		if err != nil {
			return nil, err
		}
		b, err := s.take(n)
		if err != nil {
			return nil, err
		}
		switch int8(typ) {
		case 78:
			return SaltTime(b), nil
		case 79:
			return SaltConstant(b), nil
		}
		return nil, fmt.Errorf("unknown msgpack ext type %d", int8(typ))
	}
	return nil, errBadCode
}

func decodeMap(s *src, n, depth int) (any, error) {
	return decodeEntries(s, n, depth, func(s *src, _ string) (any, error) { return decodeData(s, depth+1) })
}

// decodeEntries reads a map of n entries at depth: keys decoded (strings as
// they are, anything else printed), each value by value.
func decodeEntries(s *src, n, depth int, value func(s *src, key string) (any, error)) (any, error) {
	// Every entry takes at least two bytes: a claim past that is a lie.
	if n > s.left()/2 {
		return nil, io.ErrUnexpectedEOF
	}
	m := make(map[string]any, n)
	for i := 0; i < n; i++ {
		var key string
		c, err := s.byte()
		if err != nil {
			return nil, err
		}
		if l, ok, err := strLen(s, c); ok || err != nil {
			if err != nil {
				return nil, err
			}
			b, err := s.take(l)
			if err != nil {
				return nil, err
			}
			key = s.str(b)
		} else {
			s.off--
			k, err := decodeData(s, depth+1)
			if err != nil {
				return nil, err
			}
			key = fmt.Sprint(k)
		}
		v, err := value(s, key)
		if err != nil {
			return nil, err
		}
		m[key] = v
	}
	return m, nil
}

func decodeArray(s *src, n, depth int) (any, error) {
	if n > s.left() {
		return nil, io.ErrUnexpectedEOF
	}
	a := make([]any, n)
	for i := range a {
		v, err := decodeData(s, depth+1)
		if err != nil {
			return nil, err
		}
		a[i] = v
	}
	return a, nil
}

// decodeReturn decodes a job return's data with "return" one level deep
// (state keys, results Raw) and "fun_args" Raw.
func decodeReturn(s *src) (any, error) {
	n, ok, err := mapHeader(s)
	if err != nil {
		return nil, err
	}
	if !ok {
		s.off--
		return decodeData(s, 0)
	}
	return decodeEntries(s, n, 0, func(s *src, key string) (any, error) {
		switch key {
		case "return":
			return shallowMap(s)
		case "fun_args":
			return raw(s)
		}
		return decodeData(s, 1)
	})
}

// raw copies the next value out undecoded.
func raw(s *src) (Raw, error) {
	start := s.off
	if err := skip(s, 1); err != nil {
		return nil, err
	}
	// The source is the event's own copy (unpack): no copy per value.
	return Raw(s.b[start:s.off:s.off]), nil
}

// shallowMap decodes a map's keys and leaves its values Raw (anything but a
// map is decoded whole).
func shallowMap(s *src) (any, error) {
	n, ok, err := mapHeader(s)
	if err != nil {
		return nil, err
	}
	if !ok {
		s.off--
		return decodeData(s, 1)
	}
	return decodeEntries(s, n, 1, func(s *src, _ string) (any, error) { return raw(s) })
}
