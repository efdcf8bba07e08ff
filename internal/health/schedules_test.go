package health

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// uuidN is the uuid of the test's volume n.
func uuidN(n int) string { return fmt.Sprintf("3f2504e0-4f89-41d3-9a0c-%012d", n) }

// A node's snapshotSchedules rows are kept with its report; a malformed
// row is dropped alone, never the report; rows and errors are bounded.
func TestSaltScheduleRowsFromTheBeacon(t *testing.T) {
	vols := []any{map[string]any{"name": "data-1", "uuid": uuidN(1), "state": "present"}}
	rows := []any{
		map[string]any{"schedule": "nightly", "volume": "data-1", "uuid": uuidN(1), "lastSuccess": "2026-01-01T02:00:00Z",
			"lastSnapshot": "nightly-20260101020000", "failing": false},
		map[string]any{"schedule": "hourly.db", "volume": "data-1", "uuid": strings.ToUpper(uuidN(1)), "lastSuccess": nil, "failing": true,
			"lastError": strings.Repeat("e", 400), "lastErrorAt": "not a time"},
		map[string]any{"schedule": []any{1}, "volume": "x", "uuid": uuidN(1)},
		42,
	}
	for i := range 100 {
		vols = append(vols, map[string]any{"name": fmt.Sprintf("v%03d", i), "uuid": uuidN(100 + i), "state": "present"})
		rows = append(rows, map[string]any{"schedule": "many", "volume": fmt.Sprintf("v%03d", i), "uuid": uuidN(100 + i)})
	}
	rep, err := Parse("node-1", map[string]any{"kind": "heartbeat", "interval": 60.0, "heartbeat": 300.0, "volumes": vols,
		"snapshotSchedules": rows}, time.Now())
	require.NoError(t, err)
	require.Len(t, rep.Schedules, MaxScheduleRows)
	first := rep.Schedules[0]
	require.NotNil(t, first.LastSuccess)
	assert.Equal(t, time.Date(2026, 1, 1, 2, 0, 0, 0, time.UTC), *first.LastSuccess)
	second := rep.Schedules[1]
	assert.True(t, second.Failing)
	assert.Nil(t, second.LastSuccess)
	assert.Nil(t, second.LastErrorAt)
	assert.Equal(t, uuidN(1), second.UUID, "lower case")
	assert.Len(t, second.LastError, maxScheduleError+3)
	assert.Equal(t, "v000", rep.Schedules[2].Volume, "the malformed rows are skipped")

	// A report with a schedules field of the wrong shape keeps the rest.
	rep, err = Parse("node-1", map[string]any{"kind": "heartbeat", "interval": 60.0, "heartbeat": 300.0, "snapshotSchedules": "oops"}, time.Now())
	require.NoError(t, err)
	assert.Empty(t, rep.Schedules)

	g := New()
	g.Record(g.Confirmed("node-2", Status{Volumes: []saltvolumes.Device{{Name: "v", UUID: uuidN(2)}},
		Schedules: []byte(`[{"schedule":"s","volume":"v","uuid":"` + uuidN(2) + `"},{"schedule":"s","volume":"w","uuid":"` + uuidN(3) + `"}]`)}, time.Now()))
	got := g.SaltSchedules()
	require.Len(t, got, 1, "the row of a volume the report does not list is dropped")
	assert.Equal(t, "node-2", got[0].Node)
	assert.Equal(t, "v", got[0].Volume)
}

// Each field of a row is held to what the node's module writes: names,
// a uuid, a snapshot name, an error without control characters; a row
// under another name than its volume's, of an orphan, or twice, goes.
func TestSaltScheduleRowFields(t *testing.T) {
	vols := []any{map[string]any{"name": "data-1", "uuid": uuidN(1), "state": "present"},
		map[string]any{"name": "lost", "uuid": uuidN(2), "state": "orphan"}}
	row := func(kv ...any) map[string]any {
		m := map[string]any{"schedule": "nightly", "volume": "data-1", "uuid": uuidN(1)}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		name string
		row  map[string]any
		kept bool
	}{
		{"plain", row(), true},
		{"schedule with a dot", row("schedule", "db.nightly"), true},
		{"schedule upper case", row("schedule", "Nightly"), false},
		{"schedule 64", row("schedule", strings.Repeat("n", 64)), false},
		{"schedule with a tab", row("schedule", "n\tx"), false},
		{"volume with a dot", row("volume", "data.1"), false},
		{"volume under another name", row("volume", "data-2"), false},
		{"no uuid", row("uuid", nil), false},
		{"uuid not a uuid", row("uuid", "u1"), false},
		{"uuid not the report's", row("uuid", uuidN(9)), false},
		{"uuid of an orphan", row("volume", "lost", "uuid", uuidN(2)), false},
	} {
		rep, err := Parse("node-1", map[string]any{"kind": "heartbeat", "interval": 60.0, "heartbeat": 300.0, "volumes": vols,
			"snapshotSchedules": []any{c.row}}, time.Now())
		require.NoError(t, err)
		assert.Equal(t, c.kept, len(rep.Schedules) == 1, c.name)
	}

	rep, err := Parse("node-1", map[string]any{"kind": "heartbeat", "interval": 60.0, "heartbeat": 300.0, "volumes": vols,
		"snapshotSchedules": []any{
			row("lastSnapshot", "nightly-\x1b[2J", "lastError", "no_room:\x1b[31m red\ttab\nline\u202e\xff "+strings.Repeat("é", 200)),
			row("lastSnapshot", "other"), // the same schedule and volume again
		}}, time.Now())
	require.NoError(t, err)
	require.Len(t, rep.Schedules, 1)
	r := rep.Schedules[0]
	assert.Empty(t, r.LastSnapshot, "not a snapshot name")
	assert.True(t, strings.HasPrefix(r.LastError, "no_room:[31m red tab line\uFFFD éé"), r.LastError)
	assert.True(t, strings.HasSuffix(r.LastError, "é..."), "cut on a character")
	assert.LessOrEqual(t, len(r.LastError), maxScheduleError+3)
	for _, c := range r.LastError {
		assert.False(t, c < 0x20 || c == 0x7f || c == 0x202e, "%q", c)
	}
}
