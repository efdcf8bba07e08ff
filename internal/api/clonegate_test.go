package api

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

func available(t *testing.T, st store.Store, body string) *volume.Volume {
	t.Helper()
	sp, err := spec.ParseNew(strings.NewReader(body), uuid.NewString)
	require.NoError(t, err)
	v := &volume.Volume{Spec: *sp, CreatedAt: time.Now()}
	v.Status.Phase = volume.Available
	require.NoError(t, st.Create(context.Background(), v))
	return v
}

// #48 item 16: reading a snapshot's data needs the rights its source
// needs. An operator neither snapshots nor clones an admin's raw volume,
// and clones no snapshot the control plane does not keep (one Salt took,
// named by uuid and name).
func TestClonesNeedTheRightsOfTheirSource(t *testing.T) {
	var st *store.Bolt
	ts, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
	})
	code, m := do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"op","role":"operator"}`)
	require.Equal(t, 201, code)
	op := m["token"].(string)
	raw := available(t, st, `{"name":"admins-raw","node":"node-1","mode":"Block","rawBlockDevice":{"devicePath":"/dev/vg0/secrets"}}`)
	sparse := available(t, st, `{"name":"ops-data","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)

	code, m = do(t, ts, "POST", "/api/v1/volumes/admins-raw/snapshots", op, `{"name":"grab"}`)
	assert.Equal(t, 403, code, m)
	assert.Contains(t, errField(m, "message"), "snapshot a volume on a raw device (/dev/vg0/secrets): it needs role admin")
	code, m = do(t, ts, "POST", "/api/v1/volumes/admins-raw/snapshots", token, `{"name":"nightly"}`)
	require.Equal(t, 201, code, m)
	code, m = do(t, ts, "POST", "/api/v1/volumes/ops-data/snapshots", op, `{"name":"mine"}`)
	require.Equal(t, 201, code, m)

	clone := func(tok, name, src, snap string) (int, map[string]any) {
		return do(t, ts, "POST", "/api/v1/volumes", tok, `{"name":"`+name+`","node":"node-1","mode":"Block","lvmLogicalVolume":{"vgName":"vg0","size":"1Gi"},"source":{"volumeUUID":"`+src+`","snapshot":"`+snap+`"}}`)
	}
	code, m = clone(op, "stolen", raw.Spec.UUID, "nightly")
	assert.Equal(t, 403, code, m)
	assert.Contains(t, errField(m, "message"), "of a volume on a raw device")
	code, m = clone(op, "stolen2", uuid.NewString(), "taken-by-salt")
	assert.Equal(t, 403, code, m)
	assert.Contains(t, errField(m, "message"), "which no snapshot record of this control plane names")
	_, err := st.Get("stolen")
	assert.ErrorIs(t, err, store.ErrNotFound, "nothing created")

	code, m = do(t, ts, "POST", "/api/v1/volumes", op, `{"name":"copy","node":"node-1","sparseLoopDevice":{"size":"1Gi"},"source":{"volumeUUID":"`+sparse.Spec.UUID+`","snapshot":"mine"}}`)
	assert.Equal(t, 201, code, m)
	code, m = clone(token, "admins-copy", raw.Spec.UUID, "nightly")
	assert.Equal(t, 201, code, m)
}

// A thick LVM snapshot being restored is being merged into its volume:
// no clone reads it meanwhile (#49 item 9), and nothing is created.
func TestNoCloneOfAThickSnapshotBeingRestored(t *testing.T) {
	var st *store.Bolt
	ts, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
	})
	lv := available(t, st, `{"name":"db","node":"node-1","lvmLogicalVolume":{"vgName":"vg0","size":"1Gi"}}`)
	rec := map[string]any{"name": "before", "volume": "db", "volumeUUID": lv.Spec.UUID, "node": "node-1", "phase": "Ready",
		"method": "lvm-thick", "createdAt": time.Now().UTC(), "spec": lv.Spec,
		"restore": map[string]any{"phase": snapshots.Restoring, "requestedBy": "bootstrap", "requestedAt": time.Now().UTC()}}
	b, err := json.Marshal(rec)
	require.NoError(t, err)
	require.NoError(t, st.PutRecord(context.Background(), snapshots.Kind, "before", b))
	body := `{"name":"copy","node":"node-1","lvmLogicalVolume":{"vgName":"vg0","size":"1Gi"},"source":{"volumeUUID":"` + lv.Spec.UUID + `","snapshot":"before"}}`
	code, m := do(t, ts, "POST", "/api/v1/volumes", token, body)
	assert.Equal(t, 409, code, m)
	assert.Equal(t, "source", errField(m, "field"))
	assert.Contains(t, errField(m, "message"), "volume db is being restored from snapshot before, which that uses up")
	_, err = st.Get("copy")
	assert.ErrorIs(t, err, store.ErrNotFound, "nothing created")

	// Once the restore is over (a thin or sparse snapshot stays), it may.
	rec["method"], rec["restore"] = "lvm-thin", map[string]any{"phase": "Restored", "requestedAt": time.Now().UTC()}
	b, err = json.Marshal(rec)
	require.NoError(t, err)
	require.NoError(t, st.PutRecord(context.Background(), snapshots.Kind, "before", b))
	code, m = do(t, ts, "POST", "/api/v1/volumes", token, body)
	assert.Equal(t, 201, code, m)
}
