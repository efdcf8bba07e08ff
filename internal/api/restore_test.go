package api

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// #49 item 9: a restore replaces a volume's data, so it needs what a
// deletion does (operator); it is audited; while it runs the volume is
// not deleted, grown or snapshotted, and a second request answers it; a
// volume not Available is refused with the reason.
func TestRestoreRolesConflictsAndReplay(t *testing.T) {
	var st *store.Bolt
	ts, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
	})
	mk := func(name, role string) string {
		code, m := do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"`+name+`","role":"`+role+`"}`)
		require.Equal(t, 201, code, m)
		return m["token"].(string)
	}
	viewer, op := mk("ro", "viewer"), mk("op", "operator")
	v := available(t, st, `{"name":"data","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	// A Ready snapshot, as the leader's loop leaves it.
	rec, err := json.Marshal(map[string]any{"name": "before", "volume": "data", "volumeUUID": v.Spec.UUID, "node": "node-1",
		"phase": snapshots.Ready, "createdAt": time.Now(), "spec": v.Spec})
	require.NoError(t, err)
	require.NoError(t, st.PutRecord(context.Background(), snapshots.Kind, "before", rec))

	code, m := do(t, ts, "POST", "/api/v1/snapshots/before/restore", viewer, "")
	assert.Equal(t, 403, code, m)
	assert.Contains(t, errField(m, "message"), "it needs role operator")
	code, m = do(t, ts, "POST", "/api/v1/snapshots/nothing/restore", op, "")
	assert.Equal(t, 404, code, m)

	code, m = do(t, ts, "POST", "/api/v1/snapshots/before/restore", op, "")
	require.Equal(t, 202, code, m)
	restore, _ := m["restore"].(map[string]any)
	assert.Equal(t, snapshots.Restoring, restore["phase"])
	assert.Equal(t, "token:op", restore["requestedBy"])
	code, m = do(t, ts, "POST", "/api/v1/snapshots/before/restore", token, "")
	require.Equal(t, 202, code, m)
	assert.Equal(t, "token:op", m["restore"].(map[string]any)["requestedBy"], "the running restore answers")

	for _, c := range []struct{ method, path, body, msg string }{
		{"DELETE", "/api/v1/volumes/data", "", "delete it once that has finished"},
		{"POST", "/api/v1/volumes/data/resize", `{"size":"2Gi"}`, "grow it once that has finished"},
		{"POST", "/api/v1/volumes/data/snapshots", `{"name":"after"}`, "take its snapshot once that has finished"},
		{"DELETE", "/api/v1/snapshots/before", "", "being restored from it"},
	} {
		code, m := do(t, ts, c.method, c.path, op, c.body)
		assert.Equal(t, 409, code, c.path)
		assert.Contains(t, errField(m, "message"), c.msg, c.path)
	}
	cur, err := st.Get("data")
	require.NoError(t, err)
	assert.Equal(t, volume.Available, cur.Status.Phase)
	assert.False(t, cur.DeleteRequested)

	code, m = do(t, ts, "GET", "/api/v1/audit", token, "")
	require.Equal(t, 200, code, m)
	var routes []string
	for _, it := range m["items"].([]any) {
		e := it.(map[string]any)
		routes = append(routes, e["user"].(string)+" "+e["route"].(string)+" "+e["decision"].(string))
	}
	assert.Contains(t, routes, "token:op /api/v1/snapshots/before/restore allowed")
	assert.Contains(t, routes, "token:ro /api/v1/snapshots/before/restore refused")

	// Another volume, not Available: 409 naming why.
	w := available(t, st, `{"name":"busy","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	w.Status.Phase = volume.Pending
	require.NoError(t, st.Update(context.Background(), w))
	rec, _ = json.Marshal(map[string]any{"name": "b1", "volume": "busy", "volumeUUID": w.Spec.UUID, "node": "node-1",
		"phase": snapshots.Ready, "createdAt": time.Now(), "spec": w.Spec})
	require.NoError(t, st.PutRecord(context.Background(), snapshots.Kind, "b1", rec))
	code, m = do(t, ts, "POST", "/api/v1/snapshots/b1/restore", op, "")
	assert.Equal(t, 409, code, m)
	assert.Contains(t, errField(m, "message"), "volume busy is Pending: restore it once it is Available")
}

// From the outside review of #49: a restore rolls back the data under a
// claim as surely as a deletion removes it, so an operator does not
// restore a volume whose PersistentVolume a claim holds, or one in use;
// an admin may (the node still refuses a volume in use).
func TestRestoreOfAHeldVolumeNeedsAdmin(t *testing.T) {
	var st *store.Bolt
	ts, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
	})
	code, m := do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"op","role":"operator"}`)
	require.Equal(t, 201, code, m)
	op := m["token"].(string)
	v := available(t, st, `{"name":"claimed","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	v.Status.PersistentVolume = &saltvolumes.PersistentVolume{Name: "pv-claimed", Phase: "Bound", Claim: "tenant/db"}
	require.NoError(t, st.Update(context.Background(), v))
	rec, err := json.Marshal(map[string]any{"name": "c1", "volume": "claimed", "volumeUUID": v.Spec.UUID, "node": "node-1",
		"phase": snapshots.Ready, "createdAt": time.Now(), "spec": v.Spec})
	require.NoError(t, err)
	require.NoError(t, st.PutRecord(context.Background(), snapshots.Kind, "c1", rec))

	code, m = do(t, ts, "POST", "/api/v1/snapshots/c1/restore", op, "")
	assert.Equal(t, 403, code, m)
	assert.Contains(t, errField(m, "message"), "PersistentVolume pv-claimed is Bound (claim tenant/db)")
	got, err := st.GetRecord(context.Background(), snapshots.Kind, "c1")
	require.NoError(t, err)
	assert.NotContains(t, string(got), snapshots.Restoring, "nothing was asked of the node")
	code, m = do(t, ts, "POST", "/api/v1/snapshots/c1/restore", token, "")
	assert.Equal(t, 202, code, m)
}
