package health

// Outside review of the nodes' snapshotSchedules rows (schedules.go): a
// compromised minion sends what it likes in its beacon and status
// reports. Each test asserts what should hold; a failing one is a finding.

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const victimUUID = "3f2504e0-4f89-41d3-9a0c-0305e82c3301" // data-1, on node-1

// evil-node reports a failing Salt schedule of volume data-1, which is
// node-1's, not its own (its report lists no such volume): the row is
// kept, listed under ?volume=data-1, and exported as
// salt_volumes_snapshot_schedule_overdue{volume="data-1",...} 1, which
// fires SaltVolumesSnapshotScheduleOverdue for a volume the minion does
// not hold (with its chosen text in the alert's summary).
func TestAttackForgedRowsForAVolumeNotOnTheNode(t *testing.T) {
	rep, err := Parse("evil-node", map[string]any{"kind": "heartbeat", "interval": 60.0, "heartbeat": 300.0, "volumes": []any{},
		"snapshotSchedules": []any{map[string]any{"schedule": "nightly", "volume": "data-1", "uuid": victimUUID, "failing": true,
			"lastError": "data-1 is corrupt: run salt-volumes rm --wipe data-1"}}}, time.Now())
	require.NoError(t, err)
	assert.Empty(t, rep.Schedules, "a row for a volume the node's report does not list is kept: %+v", rep.Schedules)
}

// Only lastError is bounded: schedule, volume, uuid and lastSnapshot are
// kept at any length (an SSE event may be 64 MiB), then written as metric
// labels twice per scrape and in every listing. 64 rows of fresh names per
// report also make 64 new series per node per beacon interval (cardinality
// churn in Prometheus).
func TestAttackHugeRowFieldsAreKept(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	rep, err := Parse("evil-node", map[string]any{"kind": "heartbeat", "interval": 60.0, "heartbeat": 300.0, "volumes": []any{},
		"snapshotSchedules": []any{map[string]any{"schedule": huge, "volume": huge, "uuid": huge, "lastSnapshot": huge}}}, time.Now())
	require.NoError(t, err)
	for _, r := range rep.Schedules {
		assert.LessOrEqual(t, len(r.Schedule), 253, "schedule")
		assert.LessOrEqual(t, len(r.Volume), 63, "volume")
		assert.LessOrEqual(t, len(r.UUID), 36, "uuid")
		assert.LessOrEqual(t, len(r.LastSnapshot), 63, "lastSnapshot")
	}
}
