package api

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/store"
)

// #49 item 10: a schedule is set and removed as a snapshot is taken
// (operator; admin for a raw device) and read by a viewer; bad input is
// refused naming the field and the fix, changing nothing; the listing and
// the metrics show the nodes' Salt schedules beside the API's.
func TestSnapshotScheduleRoutes(t *testing.T) {
	var st *store.Bolt
	var reg *health.Registry
	ts, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
		reg = s.Health
	})
	mk := func(name, role string) string {
		code, m := do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"`+name+`","role":"`+role+`"}`)
		require.Equal(t, 201, code, m)
		return m["token"].(string)
	}
	viewer, op := mk("ro", "viewer"), mk("op", "operator")
	v := available(t, st, `{"name":"data","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	available(t, st, `{"name":"raw","node":"node-1","mode":"Block","rawBlockDevice":{"devicePath":"/dev/vg0/db"}}`)
	const path = "/api/v1/volumes/data/snapshot-schedule"

	for _, c := range []struct {
		name, path, tok, body string
		code                  int
		field, msg            string
	}{
		{"viewer", path, viewer, `{"every":"1h","keep":24}`, 403, "", "it needs role operator"},
		{"raw device", "/api/v1/volumes/raw/snapshot-schedule", op, `{"every":"1h","keep":24}`, 403, "", "raw device"},
		{"unknown volume", "/api/v1/volumes/nothing/snapshot-schedule", op, `{"every":"1h","keep":24}`, 404, "volume", `volume "nothing" not found`},
		{"unknown field", path, op, `{"every":"1h","keep":24,"kep":2}`, 400, "kep", "kep: unknown field"},
		{"no every", path, op, `{"keep":24}`, 400, "every", "every: missing"},
		{"every not an interval", path, op, `{"every":"hourly","keep":24}`, 400, "every", "is not an interval: use a whole number and a unit"},
		{"every below the floor", path, op, `{"every":"10s","keep":24}`, 400, "every", "shorter than the shortest interval, 1m: give 1m or more"},
		{"keep 0", path, op, `{"every":"1h"}`, 400, "keep", "keep: 0 is out of bounds"},
		{"keep 1001", path, op, `{"every":"1h","keep":1001}`, 400, "keep", "1 to 1000"},
		{"maxAge", path, op, `{"every":"1h","keep":2,"maxAge":"2000h"}`, 400, "maxAge", "at most 1000 times the interval"},
		{"not JSON", path, op, `every=1h`, 400, "every", `the body must be {"every": "1h", "keep": 24}`},
	} {
		code, m := do(t, ts, "PUT", c.path, c.tok, c.body)
		assert.Equal(t, c.code, code, c.name)
		if c.field != "" {
			assert.Equal(t, c.field, errField(m, "field"), c.name)
		}
		assert.Contains(t, errField(m, "message"), c.msg, c.name)
	}
	code, m := do(t, ts, "GET", "/api/v1/snapshot-schedules", viewer, "")
	require.Equal(t, 200, code, m)
	assert.Empty(t, m["items"], "nothing was written")
	code, m = do(t, ts, "DELETE", path, op, "")
	assert.Equal(t, 404, code, m)

	code, m = do(t, ts, "PUT", path, op, `{"every":"1h","keep":24,"maxAge":"7d"}`)
	require.Equal(t, 201, code, m)
	assert.Equal(t, "api", m["source"])
	assert.Equal(t, "1h", m["every"])
	assert.Equal(t, "7d", m["maxAge"])
	assert.Equal(t, v.Spec.UUID, m["volumeUUID"])
	assert.Equal(t, "token:op", m["createdBy"])
	code, m = do(t, ts, "PUT", path, op, `{"every":"2h","keep":12}`)
	require.Equal(t, 200, code, m)
	assert.Equal(t, "2h", m["every"])

	// A node's Salt schedule, as its beacon reported it.
	const db1 = "0c8d7f3e-5a1b-4c2d-9e8f-00000000d001"
	rows, _ := json.Marshal([]any{
		map[string]any{"schedule": "nightly", "volume": "db-1", "uuid": db1, "lastSuccess": "2026-11-27T02:00:00Z", "lastSnapshot": "nightly-20261127020000", "failing": true, "lastError": "no_room"},
		map[string]any{"schedule": 7, "volume": "bad"},
		"not a row",
		// node-2 lists data (node-1's, in the store) as its own: the
		// store says otherwise, the row goes.
		map[string]any{"schedule": "nightly", "volume": "data", "uuid": v.Spec.UUID, "failing": true, "lastError": "data is corrupt"},
		// and a volume of its own under data's name.
		map[string]any{"schedule": "nightly", "volume": "data", "uuid": "0c8d7f3e-5a1b-4c2d-9e8f-00000000d002", "failing": true},
	})
	assert.Empty(t, reg.Record(&health.Report{Node: "node-2", Kind: "confirmed", Interval: time.Minute, Heartbeat: time.Minute, Received: time.Now(),
		Volumes:   []saltvolumes.Device{{Name: "db-1", UUID: db1}, {Name: "data", UUID: v.Spec.UUID}, {Name: "data", UUID: "0c8d7f3e-5a1b-4c2d-9e8f-00000000d002"}},
		Schedules: health.ParseSchedules(rows)}))
	code, m = do(t, ts, "GET", "/api/v1/snapshot-schedules", viewer, "")
	require.Equal(t, 200, code, m)
	items := m["items"].([]any)
	require.Len(t, items, 2, "malformed rows are dropped")
	salt := items[1].(map[string]any)
	assert.Equal(t, "salt", salt["source"])
	assert.Equal(t, "node-2", salt["node"])
	assert.Equal(t, "nightly", salt["schedule"])
	assert.Equal(t, true, salt["overdue"], "a node's failing schedule is overdue")
	code, m = do(t, ts, "GET", "/api/v1/snapshot-schedules?volume=data&source=api", viewer, "")
	require.Equal(t, 200, code, m)
	assert.Len(t, m["items"], 1)
	code, m = do(t, ts, "GET", "/api/v1/snapshot-schedules?source=cron", viewer, "")
	assert.Equal(t, 400, code, m)
	assert.Equal(t, "source", errField(m, "field"))

	metrics := scrape(t, ts)
	assert.Contains(t, metrics, `salt_volumes_snapshot_schedule_last_success_timestamp_seconds{volume="db-1",schedule="nightly",source="salt",node="node-2"} 1.7957448e+09`)
	assert.Contains(t, metrics, `salt_volumes_snapshot_schedule_overdue{volume="data",schedule="data",source="api",node="node-1"} 0`)
	assert.Contains(t, metrics, `salt_volumes_snapshot_schedule_overdue{volume="db-1",schedule="nightly",source="salt",node="node-2"} 1`)

	code, m = do(t, ts, "DELETE", path, viewer, "")
	assert.Equal(t, 403, code, m)
	code, m = do(t, ts, "DELETE", path, op, "")
	require.Equal(t, 200, code, m)
	code, m = do(t, ts, "GET", "/api/v1/snapshot-schedules?source=api", viewer, "")
	require.Equal(t, 200, code, m)
	assert.Empty(t, m["items"])
}

// A volume with snapshots is not deleted, and the refusal says how: its
// schedule first (it takes more), then its snapshots, listed by
// `snapshot ls`.
func TestVolumeDeletionHeldBySnapshotsAndItsSchedule(t *testing.T) {
	var st *store.Bolt
	ts, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
	})
	available(t, st, `{"name":"data","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	code, m := do(t, ts, "POST", "/api/v1/volumes/data/snapshots", token, `{"name":"s1"}`)
	require.Equal(t, 201, code, m)
	code, m = do(t, ts, "DELETE", "/api/v1/volumes/data", token, "")
	require.Equal(t, 409, code, m)
	msg := errField(m, "message")
	assert.Contains(t, msg, `volume "data" has snapshots (s1): a volume is deleted only once its snapshots are; delete them first (salt-volumes snapshot ls data lists them; salt-volumes snapshot rm s1)`)
	assert.NotContains(t, msg, "schedule")

	code, m = do(t, ts, "PUT", "/api/v1/volumes/data/snapshot-schedule", token, `{"every":"1h","keep":24}`)
	require.Equal(t, 201, code, m)
	code, m = do(t, ts, "DELETE", "/api/v1/volumes/data", token, "")
	require.Equal(t, 409, code, m)
	msg = errField(m, "message")
	assert.Contains(t, msg, "its snapshot schedule (every 1h, keep 24) takes more: remove the schedule first (salt-volumes snapshot unschedule data; its snapshots stay), then delete the snapshots (salt-volumes snapshot ls data lists them; salt-volumes snapshot rm s1)")
	assert.Contains(t, msg, "nothing was changed")
}

// Schedule records have no compare-and-swap: a replica that does not
// lead changes none (503, nothing written); reading them is anyone's.
func TestScheduleChangesOnTheLeaderOnly(t *testing.T) {
	var st *store.Bolt
	var role atomic.Pointer[Role]
	role.Store(&Role{})
	ts, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
		s.Role = func() Role { return *role.Load() }
	})
	available(t, st, `{"name":"data","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	const path = "/api/v1/volumes/data/snapshot-schedule"
	code, m := do(t, ts, "PUT", path, token, `{"every":"1h","keep":24}`)
	assert.Equal(t, 503, code, m)
	assert.Contains(t, errField(m, "message"), "no leader: no replica leads now")
	assert.Contains(t, errField(m, "message"), "nothing was changed")
	code, m = do(t, ts, "GET", "/api/v1/snapshot-schedules", token, "")
	require.Equal(t, 200, code, m)
	assert.Empty(t, m["items"], "nothing was written")

	role.Store(&Role{Leader: true})
	code, m = do(t, ts, "PUT", path, token, `{"every":"1h","keep":24}`)
	require.Equal(t, 201, code, m)

	role.Store(&Role{LeaderID: "replica-b"})
	code, m = do(t, ts, "DELETE", path, token, "")
	assert.Equal(t, 503, code, m)
	assert.Contains(t, errField(m, "message"), "replica-b, which advertises no URL")
	code, m = do(t, ts, "GET", "/api/v1/snapshot-schedules", token, "")
	require.Equal(t, 200, code, m)
	assert.Len(t, m["items"], 1, "still there")
}
