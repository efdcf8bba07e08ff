// Package events reads Salt's master event bus: the msgpack stream on
// <sock_dir>/master_event_pub.ipc (or TCP when ipc_mode is tcp). It only
// reads; it never writes to the socket.
//
// Wire format (Salt 3006-3008): concatenated msgpack maps
// {"head": {}, "body": <bin or str: tag + "\n\n" + msgpack(data)>}, no
// length prefix, no handshake. Data may hold Salt's ext types 78 (datetime)
// and 79 (constant) and non-string map keys.
package events

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Event is one event from the bus.
type Event struct {
	Tag  string         `json:"tag"`
	Data map[string]any `json:"data"`
}

// SaltTime is Salt's ext type 78: a datetime as "%Y%m%dT%H:%M:%S.%f".
type SaltTime string

// SaltConstant is Salt's ext type 79, kept as its raw msgpack payload (a
// string type: msgpack/v5 cannot build byte-slice ext types as interfaces).
type SaltConstant string

func init() {
	msgpack.RegisterExtDecoder(78, SaltTime(""), rawExt)
	msgpack.RegisterExtDecoder(79, SaltConstant(""), rawExt)
}

// rawExt keeps an ext payload as the bytes of a string-kind type.
func rawExt(d *msgpack.Decoder, v reflect.Value, n int) error {
	// n is the sender's claim: no ext of Salt's is near a frame's size.
	if n < 0 || n > MaxFrame {
		return ErrFrameTooLarge
	}
	b := make([]byte, n)
	if err := d.ReadFull(b); err != nil {
		return err
	}
	v.SetString(string(b))
	return nil
}

// MaxFrame bounds one frame; Salt trims events to max_event_size (1 MiB).
const MaxFrame = 16 << 20

// ErrFrameTooLarge means one frame ran past MaxFrame: the stream is not
// Salt's, or is broken, and must be reconnected.
var ErrFrameTooLarge = fmt.Errorf("event frame larger than %d bytes", MaxFrame)

// Decoder reads events from a stream. It survives bad events: a frame whose
// body cannot be decoded is counted and skipped.
type Decoder struct {
	dec     *msgpack.Decoder
	lim     *frameLimit
	Skipped int // events that could not be decoded
}

// frameLimit fails a read once the current frame has used MaxFrame bytes.
type frameLimit struct {
	r    io.Reader
	left int64
}

func (l *frameLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, ErrFrameTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// NewDecoder wraps a stream (the socket, or a recording of it).
func NewDecoder(r io.Reader) *Decoder {
	lim := &frameLimit{r: bufio.NewReaderSize(r, 64<<10), left: MaxFrame}
	d := msgpack.NewDecoder(lim)
	d.UseLooseInterfaceDecoding(true)
	return &Decoder{dec: d, lim: lim}
}

// Next returns the next well-formed event. io.EOF means the bus closed; any
// other error means the stream itself is broken (reconnect).
func (d *Decoder) Next() (Event, error) {
	for {
		// The decoder reads ahead at most its own small buffer, so a frame
		// gets MaxFrame bytes plus what was buffered for it.
		d.lim.left = MaxFrame
		v, err := decodeValue(d.dec, 0)
		if errors.Is(err, ErrFrameTooLarge) {
			return Event{}, err
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return Event{}, io.EOF
			}
			return Event{}, err
		}
		ev, err := FromFrame(v)
		if err != nil {
			d.Skipped++
			continue
		}
		return ev, nil
	}
}

// FromFrame turns one decoded frame into an event.
func FromFrame(v any) (Event, error) {
	frame, ok := v.(map[string]any)
	if !ok {
		return Event{}, fmt.Errorf("frame is %T, not a map", v)
	}
	var body []byte
	switch b := frame["body"].(type) {
	case []byte:
		body = b
	case string:
		body = []byte(b)
	default:
		return Event{}, fmt.Errorf("frame body is %T", frame["body"])
	}
	return Unpack(body)
}

// Unpack splits a body at the first blank line into tag and data.
func Unpack(body []byte) (Event, error) {
	tag, raw, ok := bytes.Cut(body, []byte("\n\n"))
	if !ok {
		return Event{}, errors.New("body has no tag separator")
	}
	ev := Event{Tag: string(tag)}
	if len(raw) == 0 {
		ev.Data = map[string]any{}
		return ev, nil
	}
	d := msgpack.NewDecoder(bytes.NewReader(raw))
	d.UseLooseInterfaceDecoding(true)
	v, err := decodeValue(d, 0)
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

// decodeValue decodes one msgpack value. Arrays and maps are decoded here
// rather than by the library, which allocates by the length the sender
// claims (a 5-byte header can ask for gigabytes); every map gets string
// keys, whatever the wire type of the key (str, bin, int).
func decodeValue(d *msgpack.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, errTooDeep
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		s := make([]any, 0, min(n, 64))
		for i := 0; i < n; i++ {
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return s, nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, min(n, 64))
		for i := 0; i < n; i++ {
			k, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			switch kk := k.(type) {
			case string:
				m[kk] = v
			case []byte:
				m[string(kk)] = v
			default:
				m[fmt.Sprint(kk)] = v
			}
		}
		return m, nil
	}
	return d.DecodeInterfaceLoose()
}

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
func (e Event) Kind() string {
	p := strings.Split(e.Tag, "/")
	switch {
	case len(p) == 4 && p[0] == "salt" && p[1] == "job" && p[3] == "new":
		return KindJobNew
	case len(p) == 5 && p[0] == "salt" && p[1] == "job" && p[3] == "ret":
		return KindJobReturn
	case len(p) == 4 && p[0] == "salt" && p[1] == "run" && p[3] == "new":
		return KindRunNew
	case len(p) == 4 && p[0] == "salt" && p[1] == "run" && p[3] == "ret":
		return KindRunReturn
	case len(p) == 4 && p[0] == "salt" && p[1] == "minion" && p[3] == "start":
		return KindMinionStart
	case len(p) == 3 && p[0] == "salt-volumes" && p[2] == "progress":
		return KindProgress
	case len(p) == 4 && p[0] == "salt-volumes" && p[1] == "node" && p[3] == "health":
		return KindNodeHealth
	case len(p) == 4 && p[0] == "salt-volumes" && p[1] == "node" && p[3] == "restore":
		return KindNodeRestore
	}
	return KindOther
}

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
