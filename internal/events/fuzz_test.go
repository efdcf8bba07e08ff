package events

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecoder: any byte stream, in either framing, yields events, io.EOF or an error, never a
// panic, and every event it yields classifies and converts without one.
func FuzzDecoder(f *testing.F) {
	f.Add(goldenBytes(f))
	ret, _ := msgpack.Marshal(map[string]any{"fun": "state.apply", "retcode": 0, "return": map[string]any{"a": 1}})
	frame, _ := msgpack.Marshal(map[string]any{"head": map[string]any{}, "body": append([]byte("salt/job/1/ret/m\n\n"), ret...)})
	f.Add(frame)
	prog, _ := msgpack.Marshal(map[string]any{"cmd": "_minion_event", "id": "n", "data": map[string]any{"step": "x", "uuid": "u"}})
	frame2, _ := msgpack.Marshal(map[string]any{"head": map[string]any{}, "body": string(append([]byte("salt-volumes/v/progress\n\n"), prog...))})
	f.Add(append(frame, frame2...))
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	// Each Salt line's own framing (3006.26+ length-prefixed, 3007/3008
	// plain), as captured from real masters.
	for _, c := range lineCaptures {
		f.Add(readCapture(f, c.file))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// Everything, and only what the control plane wants: the filtered
		// decoder yields the unfiltered one's events that Relevant keeps.
		all := NewDecoder(bytes.NewReader(b))
		var kept []Event
		for range 64 {
			ev, err := all.Next()
			if errors.Is(err, io.EOF) || err != nil {
				break
			}
			ev.Kind()
			ev.AsJobReturn()
			ev.AsProgress()
			ev.AsNodeEvent()
			if k := ev.Kind(); k == KindProgress || k == KindNodeHealth || k == KindNodeRestore {
				kept = append(kept, ev)
			}
		}
		some := NewDecoder(bytes.NewReader(b))
		some.Want = Relevant
		n := 0
		for range 64 {
			ev, err := some.Next()
			if err != nil {
				break
			}
			if k := ev.Kind(); k == KindProgress || k == KindNodeHealth || k == KindNodeRestore {
				if n < len(kept) && kept[n].Tag != ev.Tag {
					t.Fatalf("filtered decoder gave %q where the unfiltered one gave %q", ev.Tag, kept[n].Tag)
				}
				n++
			}
		}
	})
}
