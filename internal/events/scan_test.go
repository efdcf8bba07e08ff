package events

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

func TestRelevant(t *testing.T) {
	ret := func(data map[string]any) []byte { return pack(t, data) }
	cases := []struct {
		tag  string
		data []byte
		want bool
	}{
		{"salt-volumes/data-1/progress", nil, true},
		{"salt-volumes/node/node-1/health", nil, true},
		{"salt-volumes/node/node-1/restore", nil, true},
		{"salt/job/1/ret/node-1", ret(map[string]any{"fun": "state.apply", "return": map[string]any{}}), true},
		{"salt/job/1/ret/node-1", ret(map[string]any{"return": map[string]any{"a": []any{1, 2}}, "fun": "state.sls"}), true},
		{"salt/job/1/ret/node-1", ret(map[string]any{"fun": "salt_volumes.status"}), true},
		{"salt/job/1/ret/node-1", ret(map[string]any{"fun": "test.ping", "return": true}), false},
		{"salt/job/1/ret/node-1", ret(map[string]any{"fun": "cmd.run", "return": "state.apply"}), false},
		// A minion's own event under a return tag: counted as forged.
		{"salt/job/1/ret/node-1", ret(map[string]any{"cmd": "_minion_event", "id": "x", "data": map[string]any{}}), true},
		{"salt/job/1/ret/node-1", []byte{0xc1}, false},
		{"salt/job/1/new", ret(map[string]any{"fun": "state.apply"}), false},
		{"salt/auth", ret(map[string]any{"id": "node-1"}), false},
		{"minion_ping", nil, false},
		{"salt-volumes/a/b/c/d/e/f", nil, false},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Relevant([]byte(c.tag), c.data), "%s %x", c.tag, c.data)
	}
}

// unrelated is a mix of events of typical sizes that the control plane
// does not use: auth, job publications and returns of other functions, a
// grains dump, beacon events of other tools.
func unrelated(t testing.TB) []byte {
	var out []byte
	add := func(tag string, data any) {
		b, err := msgpack.Marshal(data)
		require.NoError(t, err)
		f, err := msgpack.Marshal(map[string]any{"head": map[string]any{}, "body": append([]byte(tag+"\n\n"), b...)})
		require.NoError(t, err)
		out = append(out, f...)
	}
	grains := map[string]any{}
	for i := range 80 {
		grains[fmt.Sprintf("grain_%d", i)] = []any{"value", i, 3.5, map[string]any{"nested": true}}
	}
	add("salt/auth", map[string]any{"result": true, "act": "accept", "id": "node-7", "pub": string(bytes.Repeat([]byte("k"), 450))})
	add("salt/job/20261123000000000001/new", map[string]any{"jid": "20261123000000000001", "tgt": "*", "tgt_type": "glob", "fun": "test.ping", "arg": []any{}, "minions": []any{"node-1", "node-2"}, "user": "root"})
	add("salt/job/20261123000000000001/ret/node-1", map[string]any{"fun": "test.ping", "jid": "20261123000000000001", "return": true, "retcode": 0, "success": true, "id": "node-1", "fun_args": []any{}})
	add("salt/job/20261123000000000002/ret/node-2", map[string]any{"cmd": "_return", "id": "node-2", "return": grains, "fun": "grains.items", "retcode": 0})
	add("salt/beacon/node-1/diskusage/", map[string]any{"id": "node-1", "/": "63%", "_stamp": "2026-11-23T00:00:00.000000"})
	add("minion_ping", map[string]any{"minion": "node-3"})
	add("salt/minion/node-3/start", map[string]any{"cmd": "_minion_event", "id": "node-3", "data": "Minion node-3 started"})
	return out
}

func TestSkippedEventsAllocateNothing(t *testing.T) {
	one := unrelated(t)
	stream := bytes.Repeat(one, 200)
	r := bytes.NewReader(stream)
	d := NewDecoder(r)
	d.Want = Relevant
	// Warm up: the read buffer exists before counting.
	_, err := d.Next()
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, 7*200, d.Ignored)
	allocs := testing.AllocsPerRun(20, func() {
		r.Reset(stream)
		d.s.br.Reset(r)
		_, err := d.Next()
		require.ErrorIs(t, err, io.EOF)
	})
	assert.Zero(t, allocs, "allocations per pass over 1,400 unrelated events")
	assert.Zero(t, d.Skipped)
}

func TestDecodeDataMatchesTheLibrary(t *testing.T) {
	v := map[string]any{
		"s": "x", "i": int64(-3), "big": int64(1 << 40), "neg": int64(-1 << 40), "u": uint64(1<<64 - 1),
		"f": 2.5, "b": []byte{1, 2}, "n": nil, "t": true, "a": []any{"a", int64(1), map[string]any{"k": "v"}},
		"long": string(bytes.Repeat([]byte("y"), 70000)),
	}
	raw := pack(t, v)
	got, err := decodeData(&src{b: raw}, 0)
	require.NoError(t, err)
	assert.Equal(t, v, got)
	// Claims larger than what is left fail before allocating.
	for _, bad := range [][]byte{{0xdf, 0xff, 0xff, 0xff, 0xff}, {0xdd, 0x7f, 0xff, 0xff, 0xff}, {0xdb, 0x00, 0xff, 0xff, 0xff}} {
		_, err := decodeData(&src{b: bad}, 0)
		assert.Error(t, err, "%x", bad)
	}
}

// Lazy decoding keeps a job return's state keys and leaves each result
// (and fun_args) undecoded until asked.
func TestLazyJobReturns(t *testing.T) {
	result := map[string]any{"result": true, "comment": "prepared", "volume": map[string]any{"uuid": "u-1", "size": int64(1 << 30)}}
	data := map[string]any{"fun": "state.apply", "retcode": int64(0), "fun_args": []any{"salt_volumes.prepared"},
		"return": map[string]any{"salt_volumes_|-salt_volumes v1_|-v1_|-prepared": result}}
	stream := frame(t, "salt/job/1/ret/node-1", pack(t, data), false)
	d := NewDecoder(bytes.NewReader(stream))
	d.Want, d.Lazy = Relevant, true
	ev, err := d.Next()
	require.NoError(t, err)
	jr, ok := ev.AsJobReturn()
	require.True(t, ok)
	assert.Equal(t, "state.apply", jr.Fun)
	ret := jr.Return.(map[string]any)
	r, ok := ret["salt_volumes_|-salt_volumes v1_|-v1_|-prepared"].(Raw)
	require.True(t, ok, "%T", ret["salt_volumes_|-salt_volumes v1_|-v1_|-prepared"])
	full, err := r.Decode()
	require.NoError(t, err)
	assert.Equal(t, result, full)
	args, err := ev.Data["fun_args"].(Raw).Decode()
	require.NoError(t, err)
	assert.Equal(t, []any{"salt_volumes.prepared"}, args)
}
