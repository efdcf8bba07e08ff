package api

// Outside review of the snapshot schedule routes (schedules.go). Each
// test is an attack and asserts what should hold; a failing one is a
// finding.

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/store"
)

// Held: a person scoped to node-2 neither sets, changes nor removes the
// schedule of a volume on node-1; a viewer neither.
func TestAttackScheduleScopeAndRoles(t *testing.T) {
	var st *store.Bolt
	f := newPeople()
	f.acl["alice"] = []string{"node-2"}
	ts, _ := newServerWith(t, func(s *Server) {
		withPeople(&st, f, access.RoleMap{Users: map[string]access.Role{"alice": access.Operator}, Eauth: []string{"file"}})(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
	})
	available(t, st, `{"name":"data","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	code, m := login(t, ts, "alice", "alice-pw", "file")
	require.Equal(t, 200, code, m)
	alice := m["token"].(string)
	code, m = do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"ro","role":"viewer"}`)
	require.Equal(t, 201, code, m)
	viewer := m["token"].(string)

	const path = "/api/v1/volumes/data/snapshot-schedule"
	code, m = do(t, ts, "PUT", path, alice, `{"every":"1h","keep":1}`)
	assert.Equal(t, 403, code, m)
	code, m = do(t, ts, "PUT", path, token, `{"every":"1h","keep":24}`)
	require.Equal(t, 201, code, m)
	code, m = do(t, ts, "PUT", path, alice, `{"every":"1m","keep":1}`)
	assert.Equal(t, 403, code, "changing another scope's schedule: %v", m)
	code, m = do(t, ts, "DELETE", path, alice, "")
	assert.Equal(t, 403, code, "removing another scope's schedule: %v", m)
	code, m = do(t, ts, "PUT", path, viewer, `{"every":"1m","keep":1}`)
	assert.Equal(t, 403, code, m)
	code, m = do(t, ts, "DELETE", path, viewer, "")
	assert.Equal(t, 403, code, m)
	code, m = do(t, ts, "GET", "/api/v1/snapshot-schedules?volume=data", viewer, "")
	require.Equal(t, 200, code, m)
	items := m["items"].([]any)
	require.Len(t, items, 1)
	assert.Equal(t, "24", jsonNum(items[0].(map[string]any)["keep"]), "unchanged")
}

func jsonNum(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// alice, scoped to node-2, takes snapshots of her own volume under the
// names the schedule of data (node-1, outside her scope) will use for its
// next slots, as far as she can tell them: the API accepts them, and
// none is the slot's name, whose tag is keyed by the schedule's id, which
// no answer shows (a slot whose name is taken anyway takes its next name:
// snapshots' TestScheduleSlotNameTakenByAnotherTakesTheNextName). So no
// name of hers is refused for looking like a slot's.
func TestAttackSnapshotNameSquatsAnotherScopesSlot(t *testing.T) {
	var st *store.Bolt
	f := newPeople()
	f.acl["alice"] = []string{"node-2"}
	ts, _ := newServerWith(t, func(s *Server) {
		withPeople(&st, f, access.RoleMap{Users: map[string]access.Role{"alice": access.Operator}, Eauth: []string{"file"}})(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
	})
	available(t, st, `{"name":"data","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	available(t, st, `{"name":"mine","node":"node-2","sparseLoopDevice":{"size":"1Gi"}}`)
	code, m := do(t, ts, "PUT", "/api/v1/volumes/data/snapshot-schedule", token, `{"every":"1h","keep":24}`)
	require.Equal(t, 201, code, m)
	for k := range m {
		assert.NotContains(t, []string{"id", "scheduleID"}, k, "the schedule's id is never shown")
	}
	code, m = login(t, ts, "alice", "alice-pw", "file")
	require.Equal(t, 200, code, m)
	alice := m["token"].(string)

	b, err := st.GetRecord(context.Background(), snapshots.ScheduleKind, "data")
	require.NoError(t, err)
	var rec struct{ ID string }
	require.NoError(t, json.Unmarshal(b, &rec))
	next := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
	slot := snapshots.SlotName("data", rec.ID, next, 0)
	guess := "data-" + next.Format("20060102150405")
	require.NotEqual(t, slot, guess)
	require.NotContains(t, slot, guess+"-000000")
	code, m = do(t, ts, "POST", "/api/v1/volumes/mine/snapshots", alice, `{"name":"`+guess+`"}`)
	assert.Equal(t, 201, code, "a name of hers that is no slot's: %v", m)
	code, m = do(t, ts, "GET", "/api/v1/snapshots?volume=mine", alice, "")
	require.Equal(t, 200, code, m)
	for _, it := range m["items"].([]any) {
		assert.NotEqual(t, slot, it.(map[string]any)["name"])
	}
}

// A minion's row with a tab in its volume name is written as a label
// value with \t, an escape the Prometheus text format does not define:
// strict parsers (prometheus/common expfmt: promtool check metrics,
// client_golang-based relays, Telegraf) refuse the whole scrape ("invalid
// escape sequence"), hiding every other metric and alert input.
func TestAttackForgedRowBreaksStrictMetricsParsers(t *testing.T) {
	var st *store.Bolt
	var reg *health.Registry
	ts, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
		reg = s.Health
	})
	rows, _ := json.Marshal([]any{map[string]any{"schedule": "n\tx", "volume": "v\x01", "failing": true}})
	reg.Record(&health.Report{Node: "evil-node", Kind: "confirmed", Interval: time.Minute, Heartbeat: time.Minute, Received: time.Now(),
		Schedules: health.ParseSchedules(rows)})
	// A row that passes (a minion id is the node's label, whatever Salt
	// let it be): its label is written with the format's escapes only.
	const u = "0c8d7f3e-5a1b-4c2d-9e8f-00000000e001"
	rows, _ = json.Marshal([]any{map[string]any{"schedule": "nightly", "volume": "v1", "uuid": u, "failing": true}})
	reg.Record(&health.Report{Node: "evil\tnode\x01\"\\", Kind: "confirmed", Interval: time.Minute, Heartbeat: time.Minute, Received: time.Now(),
		Volumes: []saltvolumes.Device{{Name: "v1", UUID: u}}, Schedules: health.ParseSchedules(rows)})
	metrics := scrape(t, ts)
	bad := regexp.MustCompile(`\{[^}\n]*\\[^\\"n][^}\n]*\}`)
	assert.Empty(t, bad.FindAllString(metrics, -1), "label values with escapes the exposition format does not define")
	assert.Contains(t, metrics, `salt_volumes_snapshot_schedule_overdue{volume="v1",schedule="nightly",source="salt",node="evilnode\"\\"} 1`)
	assert.NotRegexp(t, `[\x00-\x08\x0b-\x1f\x7f]`, metrics, "no control character but newlines")
}
