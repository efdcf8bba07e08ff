// Package events reads Salt's master event bus: the msgpack stream on
// <sock_dir>/master_event_pub.ipc (or TCP when ipc_mode is tcp). It only
// reads; it never writes to the socket.
//
// Wire format: msgpack maps {"head": {}, "body": <bin or str: tag + "\n\n" +
// msgpack(data)>}, no handshake. How they are delimited depends on the
// master's Salt (see Framing), and the decoder finds out from the first
// bytes of each connection. Data may hold Salt's ext types 78 (datetime) and
// 79 (constant) and non-string map keys.
package events

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
)

// Event is one event from the bus.
type Event struct {
	Tag  string         `json:"tag"`
	Data map[string]any `json:"data"`
}

// SaltTime is Salt's ext type 78: a datetime as "%Y%m%dT%H:%M:%S.%f".
type SaltTime string

// SaltConstant is Salt's ext type 79, kept as its raw msgpack payload.
type SaltConstant string

// MaxFrame bounds one frame; Salt trims events to max_event_size (1 MiB).
const MaxFrame = 16 << 20

// ErrFrameTooLarge means one frame ran past MaxFrame: the stream is not
// Salt's, or is broken, and must be reconnected.
var ErrFrameTooLarge = fmt.Errorf("event frame larger than %d bytes", MaxFrame)

// Framing is how frames follow each other on the stream.
type Framing int

const (
	// FramingUnknown: nothing read yet on this connection.
	FramingUnknown Framing = iota
	// FramingPlain: maps back to back, no length (Salt 3006.0-3006.25's
	// ipc transport, 3007 and 3008's tcp transport on the same socket).
	FramingPlain
	// FramingLengthPrefixed: each map behind a 4-byte big-endian length
	// (Salt 3006.26 and later 3006 releases).
	FramingLengthPrefixed
)

func (f Framing) String() string {
	switch f {
	case FramingPlain:
		return "plain"
	case FramingLengthPrefixed:
		return "length-prefixed"
	}
	return "unknown"
}

// Decoder reads events from a stream. It survives bad events: a frame whose
// body cannot be decoded is counted and skipped.
type Decoder struct {
	s src
	// Want, when set, passes over events it does not want without
	// decoding them (see Relevant).
	Want    Want
	Skipped int // events that could not be decoded
	Ignored int // events Want passed over
	// Lazy leaves the bulk of job returns undecoded: each state result
	// inside "return" and the whole of "fun_args" stay Raw (the control
	// plane reads a return's content from Salt's job cache, never from
	// the bus; it needs only the state keys).
	Lazy bool
	own  []byte
	strs map[string]string
	// framing is decided by the first frame and kept for the connection:
	// a master restarted as another release comes back on a new one.
	framing Framing
}

// Framing says how this stream delimits its frames (FramingUnknown until
// the first frame is read).
func (d *Decoder) Framing() Framing { return d.framing }

// DecodeMsgpack decodes one msgpack document the way event data is
// decoded (string map keys, Salt's ext types); trailing bytes are an error.
func DecodeMsgpack(b []byte) (any, error) {
	s := &src{b: b}
	v, err := decodeData(s, 0)
	if err == nil && s.off != len(b) {
		err = errors.New("trailing bytes after the value")
	}
	return v, err
}

// Raw is a msgpack value left undecoded (Decoder.Lazy); Decode decodes it.
type Raw []byte

// Decode decodes the value.
func (r Raw) Decode() (any, error) { return decodeData(&src{b: r}, 0) }

// NewDecoder wraps a stream (the socket, or a recording of it).
func NewDecoder(r io.Reader) *Decoder {
	return &Decoder{s: src{br: bufio.NewReaderSize(r, 64<<10)}}
}

// Next returns the next well-formed event. io.EOF means the bus closed; any
// other error means the stream itself is broken (reconnect).
func (d *Decoder) Next() (Event, error) {
	for {
		d.s.used = 0
		ev, ok, err := d.frame()
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Event{}, io.EOF
		}
		if err != nil {
			return Event{}, err
		}
		if ok {
			return ev, nil
		}
	}
}

var keyBody = []byte("body")

// frame reads one frame {"head": ..., "body": tag "\n\n" msgpack(data)};
// ok is false for a frame that was skipped or ignored.
func (d *Decoder) frame() (Event, bool, error) {
	c, err := d.s.byte()
	if err != nil {
		return Event{}, false, err
	}
	if d.framing == FramingUnknown {
		d.framing = detectFraming(c)
	}
	if d.framing == FramingPlain {
		return d.body(c)
	}
	// A length below MaxFrame has a zero first byte; anything else is a
	// frame too large or a stream that is not Salt's.
	rest, err := d.s.take(3)
	if err != nil {
		return Event{}, false, err
	}
	size := int(c)<<24 | be(rest)
	if size > MaxFrame {
		return Event{}, false, ErrFrameTooLarge
	}
	start := d.s.used
	if c, err = d.s.byte(); err != nil {
		return Event{}, false, err
	}
	ev, ok, err := d.body(c)
	if err != nil {
		return Event{}, false, err
	}
	// The map may end before the length does (nothing Salt sends, but the
	// length is what delimits): skip to the next frame. A map that ran
	// past its length has lost the frame boundary: reconnect.
	used := int(d.s.used - start)
	if used > size {
		return Event{}, false, fmt.Errorf("event frame ran %d bytes past its length prefix of %d", used-size, size)
	}
	if err := d.s.discard(size - used); err != nil {
		return Event{}, false, err
	}
	return ev, ok, nil
}

// detectFraming decides from a connection's first byte: a msgpack map
// header starts a plain stream; a zero is the top byte of a length prefix
// (no plain stream starts with one: Salt publishes maps only). Anything
// else is read as plain, and skipped and counted there.
func detectFraming(c byte) Framing {
	if c == 0 {
		return FramingLengthPrefixed
	}
	return FramingPlain
}

// body reads a frame's map, its first byte c already read.
func (d *Decoder) body(c byte) (Event, bool, error) {
	n, isMap, err := mapLen(&d.s, c)
	if err != nil {
		return Event{}, false, err
	}
	if !isMap {
		if err := skipAfter(&d.s, c, 0); err != nil {
			return Event{}, false, err
		}
		d.Skipped++
		return Event{}, false, nil
	}
	var body []byte
	found := false
	for i := 0; i < n; i++ {
		k, err := strBytes(&d.s)
		if err != nil {
			return Event{}, false, err
		}
		if !bytes.Equal(k, keyBody) {
			if err := skip(&d.s, 0); err != nil {
				return Event{}, false, err
			}
			continue
		}
		c, err := d.s.byte()
		if err != nil {
			return Event{}, false, err
		}
		l, ok, err := strLen(&d.s, c)
		if err != nil {
			return Event{}, false, err
		}
		if !ok {
			if err := skipAfter(&d.s, c, 0); err != nil {
				return Event{}, false, err
			}
			found = false
			continue
		}
		b, err := d.s.take(l)
		if err != nil {
			return Event{}, false, err
		}
		if i == n-1 {
			body = b // Salt puts the body last: used before the next read
		} else {
			d.own = append(d.own[:0], b...)
			body = d.own
		}
		found = true
	}
	if !found {
		d.Skipped++
		return Event{}, false, nil
	}
	tag, raw, ok := bytes.Cut(body, []byte("\n\n"))
	if !ok {
		d.Skipped++
		return Event{}, false, nil
	}
	if d.Want != nil && !d.Want(tag, raw) {
		d.Ignored++
		return Event{}, false, nil
	}
	if d.strs == nil {
		d.strs = map[string]string{}
	}
	lazy := d.Lazy && kindOf(tag) == KindJobReturn
	ev, err := unpack(tag, raw, d.strs, lazy)
	if err != nil {
		d.Skipped++
		return Event{}, false, nil
	}
	return ev, true, nil
}

// Unpack splits a body at the first blank line into tag and data.
func Unpack(body []byte) (Event, error) {
	tag, raw, ok := bytes.Cut(body, []byte("\n\n"))
	if !ok {
		return Event{}, errors.New("body has no tag separator")
	}
	return unpack(tag, raw, nil, false)
}

func unpack(tag, raw []byte, strs map[string]string, lazy bool) (Event, error) {
	ev := Event{Tag: string(tag)}
	if len(raw) == 0 {
		ev.Data = map[string]any{}
		return ev, nil
	}
	s := &src{b: raw, strs: strs}
	var v any
	var err error
	if lazy {
		// Raw values point into the body, which the read buffer reuses:
		// one copy of it for the event.
		s.b = bytes.Clone(raw)
		v, err = decodeReturn(s)
	} else {
		v, err = decodeData(s, 0)
	}
	if err == nil && s.off != len(raw) {
		err = errors.New("trailing bytes after the data")
	}
	if err != nil {
		return Event{}, fmt.Errorf("event %s: %w", ev.Tag, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return Event{}, fmt.Errorf("event %s: data is %T, not a map", ev.Tag, v)
	}
	ev.Data = m
	return ev, nil
}

// maxDepth bounds nesting: Salt's events are a few levels deep, and a
// hostile stream must not exhaust the stack.
const maxDepth = 64

var errTooDeep = errors.New("event data nested too deep")

// Kinds of events the control plane reacts to.
const (
	KindOther       = ""
	KindJobNew      = "job-new"
	KindJobReturn   = "job-return"
	KindRunNew      = "run-new"
	KindRunReturn   = "run-return"
	KindMinionStart = "minion-start"
	KindProgress    = "progress"
	KindNodeHealth  = "node-health"
	KindNodeRestore = "node-restore"
)

// Kind classifies an event by its tag.
func (e Event) Kind() string { return kindOf(e.Tag) }

// JobReturn is a salt/job/<jid>/ret/<minion> event.
type JobReturn struct {
	JID     string
	Minion  string
	Fun     string
	FunArgs []any
	Retcode int
	Success bool
	Return  any
}

// AsJobReturn decodes a job return event.
func (e Event) AsJobReturn() (JobReturn, bool) {
	if e.Kind() != KindJobReturn {
		return JobReturn{}, false
	}
	p := strings.Split(e.Tag, "/")
	r := JobReturn{JID: p[2], Minion: p[4], Return: e.Data["return"]}
	r.Fun, _ = e.Data["fun"].(string)
	r.FunArgs, _ = e.Data["fun_args"].([]any)
	r.Retcode = toInt(e.Data["retcode"])
	if s, ok := e.Data["success"].(bool); ok {
		r.Success = s
	} else {
		r.Success = r.Retcode == 0
	}
	return r, true
}

// Progress is one of our salt-volumes/<name>/progress events.
type Progress struct {
	Volume string
	UUID   string
	Step   string
	// Node is the minion id of Salt's single-event envelope, which the
	// master checked against the minion's key; Authenticated is false when
	// there is no such envelope (Salt's batched form puts the sender's data
	// on the bus bare). The "node" field inside the data is never trusted.
	Node          string
	Authenticated bool
	Data          map[string]any
	// Seq is the step's number from the sending minion process (0: the
	// event carried none): a minion that forwards events concurrently
	// (Salt 3006) delivers them out of order, and Seq puts them back.
	Seq int
	// Done and Total are a long step's bytes done and to do (0: the step
	// said none).
	Done, Total int64
}

// AsProgress decodes a progress event, unwrapping the envelope Salt puts
// around an event a minion fires ({"cmd": "_minion_event", "id", "data"}).
func (e Event) AsProgress() (Progress, bool) {
	if e.Kind() != KindProgress {
		return Progress{}, false
	}
	d := e.Data
	p := Progress{Volume: strings.Split(e.Tag, "/")[1]}
	if inner, ok := d["data"].(map[string]any); ok && d["cmd"] == "_minion_event" {
		id, _ := d["id"].(string)
		p.Node, p.Authenticated = id, id != ""
		d = inner
	}
	p.Data = d
	p.UUID, _ = d["uuid"].(string)
	p.Step, _ = d["step"].(string)
	p.Seq = toInt(d["seq"])
	// Bounded where a float64 is still exact (8 PiB): no device is
	// larger, and consumers may compute with floats.
	if done, total := toInt64(d["done"]), toInt64(d["total"]); total > 0 && total <= 1<<53 && done >= 0 && done <= total {
		p.Done, p.Total = done, total
	}
	return p, true
}

// NodeEvent is one of our salt-volumes/node/<minion>/{health,restore}
// events, fired by the salt_volumes beacon or module on that minion.
type NodeEvent struct {
	// Minion is the id in the tag, which the sender chose.
	Minion string
	// Node is the id of Salt's single-event envelope, which the master
	// checked against the minion's key; Authenticated is false without it.
	// The event counts only when Node is Minion: a node reports on itself.
	Node          string
	Authenticated bool
	Data          map[string]any
}

// AsNodeEvent decodes a node health or restore event.
func (e Event) AsNodeEvent() (NodeEvent, bool) {
	if k := e.Kind(); k != KindNodeHealth && k != KindNodeRestore {
		return NodeEvent{}, false
	}
	n := NodeEvent{Minion: strings.Split(e.Tag, "/")[2]}
	d := e.Data
	if inner, ok := d["data"].(map[string]any); ok && d["cmd"] == "_minion_event" {
		id, _ := d["id"].(string)
		n.Node, n.Authenticated = id, id != ""
		d = inner
	}
	n.Data = d
	return n, true
}

// toInt64 is a byte count as msgpack or JSON gives it, or -1 for
// anything that is not a whole, non-negative number.
func toInt64(v any) int64 {
	switch n := v.(type) {
	case int64:
		if n >= 0 {
			return n
		}
	case uint64:
		if n <= math.MaxInt64 {
			return int64(n)
		}
	case int:
		if n >= 0 {
			return int64(n)
		}
	case int8:
		if n >= 0 {
			return int64(n)
		}
	case int16:
		if n >= 0 {
			return int64(n)
		}
	case int32:
		if n >= 0 {
			return int64(n)
		}
	case uint8:
		return int64(n)
	case uint16:
		return int64(n)
	case uint32:
		return int64(n)
	case float64:
		if n >= 0 && n < 1<<62 && n == math.Trunc(n) {
			return int64(n)
		}
	}
	return -1
}

func toInt(v any) int {
	switch n := v.(type) {
	case int64:
		return int(n)
	case uint64:
		return int(n)
	case int:
		return n
	case float64:
		return int(n)
	}
	return 0
}
