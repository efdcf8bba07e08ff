package events

import (
	"bytes"
	"encoding/hex"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// The frame Salt 3007/3008 publishes for tag "salt/test" and data
// {"x": 1, "_stamp": "2026-01-02T03:04:05.000006"} (63 bytes).
const golden = "82a468656164 80a4626f6479c431" +
	"73616c742f746573740a0a" +
	"82a17801a65f7374616d70ba323032362d30312d30325430333a30343a30352e303030303036"

func goldenBytes(t testing.TB) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(golden, " ", ""))
	require.NoError(t, err)
	require.Len(t, b, 63)
	return b
}

// frame builds a frame the way Salt does: body = tag + "\n\n" + msgpack(data).
func frame(t *testing.T, tag string, data []byte, strBody bool) []byte {
	body := append([]byte(tag+"\n\n"), data...)
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	require.NoError(t, enc.EncodeMapLen(2))
	require.NoError(t, enc.EncodeString("head"))
	require.NoError(t, enc.EncodeMapLen(0))
	require.NoError(t, enc.EncodeString("body"))
	if strBody {
		require.NoError(t, enc.EncodeString(string(body)))
	} else {
		require.NoError(t, enc.EncodeBytes(body))
	}
	return buf.Bytes()
}

func pack(t *testing.T, v any) []byte {
	b, err := msgpack.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestGoldenFrame(t *testing.T) {
	d := NewDecoder(bytes.NewReader(goldenBytes(t)))
	ev, err := d.Next()
	require.NoError(t, err)
	assert.Equal(t, "salt/test", ev.Tag)
	assert.Equal(t, int64(1), ev.Data["x"])
	assert.Equal(t, "2026-01-02T03:04:05.000006", ev.Data["_stamp"])
	_, err = d.Next()
	assert.ErrorIs(t, err, io.EOF)
}

// dribble returns at most n bytes per Read, like a slow socket.
type dribble struct {
	r io.Reader
	n int
}

func (d dribble) Read(p []byte) (int, error) {
	if len(p) > d.n {
		p = p[:d.n]
	}
	return d.r.Read(p)
}

func TestSplitFramesManyFramesStrBodiesAndGarbage(t *testing.T) {
	var stream []byte
	stream = append(stream, goldenBytes(t)...)
	// ext 78 (datetime) and 79 (constant) inside the data
	ext := []byte{0x82, 0xa2, 't', 's', 0xd7, 78}
	ext = append(ext, []byte("20260102")...) // fixext8 payload
	ext = append(ext, 0xa1, 'c', 0xd4, 79, 0x01)
	stream = append(stream, frame(t, "salt/ext", ext, false)...)
	// a str-typed body
	stream = append(stream, frame(t, "salt/str", pack(t, map[string]any{"a": "b"}), true)...)
	// a body whose data is garbage: skipped, the stream goes on
	stream = append(stream, frame(t, "salt/bad", []byte{0xc1, 0xff, 0x00}, false)...)
	// a body without the separator: skipped
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	require.NoError(t, enc.Encode(map[string]any{"head": map[string]any{}, "body": []byte("no-separator")}))
	stream = append(stream, buf.Bytes()...)
	// non-string keys (int and bin) at any depth
	keys := []byte{0x82, 0x07, 0xa6, 'i', 'n', 't', 'k', 'e', 'y', 0xc4, 0x01, 'k', 0x81, 0x01, 0x02}
	stream = append(stream, frame(t, "salt/keys", keys, false)...)

	d := NewDecoder(dribble{bytes.NewReader(stream), 7})
	var got []Event
	for {
		ev, err := d.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		got = append(got, ev)
	}
	require.Len(t, got, 4)
	assert.Equal(t, "salt/test", got[0].Tag)
	assert.Equal(t, "salt/ext", got[1].Tag)
	assert.Equal(t, SaltTime("20260102"), got[1].Data["ts"])
	assert.Equal(t, SaltConstant("\x01"), got[1].Data["c"])
	assert.Equal(t, "b", got[2].Data["a"])
	assert.Equal(t, "salt/keys", got[3].Tag)
	assert.Equal(t, "intkey", got[3].Data["7"])
	assert.Equal(t, map[string]any{"1": int64(2)}, got[3].Data["k"])
	assert.Equal(t, 2, d.Skipped)
}

func TestTruncatedStreamIsEOF(t *testing.T) {
	b := goldenBytes(t)
	d := NewDecoder(bytes.NewReader(b[:40]))
	_, err := d.Next()
	assert.ErrorIs(t, err, io.EOF)
}

func TestKindsAndTypedEvents(t *testing.T) {
	cases := map[string]string{
		"salt/job/20260102030405123456/new":        KindJobNew,
		"salt/job/20260102030405123456/ret/node-1": KindJobReturn,
		"salt/run/20260102030405123456/new":        KindRunNew,
		"salt/run/20260102030405123456/ret":        KindRunReturn,
		"salt/minion/node-1/start":                 KindMinionStart,
		"salt-volumes/data-1/progress":             KindProgress,
		"20260102030405123456":                     KindOther,
		"salt/auth":                                KindOther,
		"salt/job/1/sub/node-1/error/state.sls":    KindOther,
	}
	for tag, want := range cases {
		assert.Equal(t, want, Event{Tag: tag}.Kind(), tag)
	}

	r, ok := Event{Tag: "salt/job/42/ret/node-1", Data: map[string]any{
		"fun": "state.apply", "retcode": int64(2), "success": false, "return": map[string]any{"x": 1},
	}}.AsJobReturn()
	require.True(t, ok)
	assert.Equal(t, JobReturn{JID: "42", Minion: "node-1", Fun: "state.apply", Retcode: 2, Return: map[string]any{"x": 1}}, r)

	// A minion-fired event arrives wrapped; AsProgress unwraps it.
	p, ok := Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-1", "tag": "salt-volumes/data-1/progress",
		"data": map[string]any{"step": "formatted", "uuid": "u-1", "volume": "data-1"},
	}}.AsProgress()
	require.True(t, ok)
	assert.Equal(t, "data-1", p.Volume)
	assert.Equal(t, "formatted", p.Step)
	assert.Equal(t, "u-1", p.UUID)
	assert.Equal(t, "node-1", p.Node)
	assert.Zero(t, p.Total, "a step without bytes")

	// A long step's bytes, as msgpack gives them; nonsense is none.
	for _, c := range []struct {
		done, total any
		want        [2]int64
	}{
		{int64(64), int64(128), [2]int64{64, 128}},
		{uint64(0), uint64(1 << 40), [2]int64{0, 1 << 40}},
		{int8(3), uint16(9), [2]int64{3, 9}},
		{float64(5), float64(10), [2]int64{5, 10}},
		{int64(200), int64(128), [2]int64{}}, // past the total
		{int64(-1), int64(128), [2]int64{}},
		{"50%", int64(128), [2]int64{}}, // a string is no number
		{float64(1.5), float64(10), [2]int64{}},
		{nil, int64(10), [2]int64{}},
		{int64(5), true, [2]int64{}},
		{int64(1 << 57), int64(1 << 57), [2]int64{}}, // past any device
		{int64(1 << 53), int64(1 << 53), [2]int64{1 << 53, 1 << 53}},
	} {
		p, ok := Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{
			"cmd": "_minion_event", "id": "node-1",
			"data": map[string]any{"step": "copying", "uuid": "u-1", "done": c.done, "total": c.total},
		}}.AsProgress()
		require.True(t, ok)
		assert.Equal(t, c.want, [2]int64{p.Done, p.Total}, "%#v of %#v", c.done, c.total)
	}
}

// A frame that claims or carries more than MaxFrame breaks the stream
// instead of growing memory without bound.
func TestFrameLargerThanMaxFrameIsRefused(t *testing.T) {
	body := append([]byte("salt/job/1/ret/m\n\n"), make([]byte, MaxFrame+1)...)
	frame, err := msgpack.Marshal(map[string]any{"head": map[string]any{}, "body": body})
	require.NoError(t, err)
	_, err = NewDecoder(bytes.NewReader(frame)).Next()
	assert.ErrorIs(t, err, ErrFrameTooLarge)

	// A map header claiming four billion entries allocates nothing first.
	claim := []byte{0xdf, 0xff, 0xff, 0xff, 0xff}
	_, err = NewDecoder(bytes.NewReader(claim)).Next()
	assert.Error(t, err)
}

// An ext header claiming gigabytes (found by FuzzDecoder) is refused
// before anything is allocated for it.
func TestHugeExtClaimIsRefused(t *testing.T) {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	_, err := NewDecoder(bytes.NewReader([]byte("\xc9\xc9#\xf1\x7fNE"))).Next()
	runtime.ReadMemStats(&m1)
	assert.Error(t, err)
	assert.Less(t, m1.TotalAlloc-m0.TotalAlloc, uint64(64<<20), "no allocation by the claimed length")
}
