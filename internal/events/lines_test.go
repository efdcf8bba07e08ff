package events

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Captures of a real master's event socket, one per supported Salt line
// (written by test/events' TestDetectsThisSaltsFraming with
// SALT_VOLUMES_CAPTURE_DIR): a runner's event.send, then a test.ping job.
var lineCaptures = []struct {
	file    string
	framing Framing
}{
	{"bus-3006.29.bin", FramingLengthPrefixed},
	{"bus-3007.16.bin", FramingPlain},
	{"bus-3008.3.bin", FramingPlain},
}

func readCapture(t testing.TB, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func TestEachSaltLinesCaptureDecodes(t *testing.T) {
	for _, c := range lineCaptures {
		t.Run(c.file, func(t *testing.T) {
			for _, chunk := range []int{1, 7, 4096} {
				d := NewDecoder(dribble{bytes.NewReader(readCapture(t, c.file)), chunk})
				var tags []string
				var ping JobReturn
				for {
					ev, err := d.Next()
					if err == io.EOF {
						break
					}
					require.NoError(t, err)
					tags = append(tags, ev.Tag)
					if r, ok := ev.AsJobReturn(); ok {
						ping = r
					}
				}
				assert.Equal(t, c.framing, d.Framing(), "read %d bytes at a time", chunk)
				assert.Zero(t, d.Skipped)
				assert.Contains(t, tags, "salt-volumes/capture/progress")
				assert.Equal(t, "test.ping", ping.Fun)
				assert.Equal(t, "node-1", ping.Minion)
				assert.Equal(t, true, ping.Return)
			}
		})
	}
}

// The serve path (Relevant, Lazy) on each line: the job return and the
// progress events are kept, the runner's events passed over.
func TestEachSaltLinesCaptureFiltered(t *testing.T) {
	for _, c := range lineCaptures {
		d := NewDecoder(bytes.NewReader(readCapture(t, c.file)))
		d.Want, d.Lazy = Relevant, true
		kinds := map[string]int{}
		for {
			ev, err := d.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err, c.file)
			kinds[ev.Kind()]++
		}
		assert.Equal(t, 1, kinds[KindProgress], c.file)
		assert.Equal(t, 0, kinds[KindJobReturn], "test.ping is not ours: %s", c.file)
		assert.Greater(t, d.Ignored, 2, c.file)
	}
}

// A length prefix that disagrees with the map behind it: a shorter map is
// padded over to the next frame; a map running past its length breaks the
// stream (reconnect) instead of reading the next frame's bytes as its own.
func TestLengthPrefixBoundsTheFrame(t *testing.T) {
	f := goldenBytes(t)
	prefixed := func(size int, body []byte) []byte {
		return append([]byte{0, byte(size >> 16), byte(size >> 8), byte(size)}, body...)
	}
	padded := prefixed(len(f)+3, append(append([]byte{}, f...), 0xc0, 0xc0, 0xc0))
	stream := append(padded, prefixed(len(f), f)...)
	d := NewDecoder(bytes.NewReader(stream))
	for range 2 {
		ev, err := d.Next()
		require.NoError(t, err)
		assert.Equal(t, "salt/test", ev.Tag)
	}
	_, err := d.Next()
	assert.ErrorIs(t, err, io.EOF)

	short := prefixed(len(f)-10, f)
	_, err = NewDecoder(bytes.NewReader(short)).Next()
	assert.ErrorContains(t, err, "past its length prefix")

	huge := []byte{0x7f, 0xff, 0xff, 0xff}
	d = NewDecoder(bytes.NewReader(append(prefixed(len(f), f), huge...)))
	_, err = d.Next()
	require.NoError(t, err)
	_, err = d.Next()
	assert.ErrorIs(t, err, ErrFrameTooLarge)
}
