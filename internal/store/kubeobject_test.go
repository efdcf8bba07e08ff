package store

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// A volume written as a Volume object reads back whole: the object's spec
// and record are the volume's own types, so a field added to a volume (or
// to the volume contract) is kept in Volume-objects mode as in bbolt and
// etcd. The fixture sets every stored field; adding one to volume.Volume or
// spec.Spec without setting it here fails the test, and then the round
// trip checks it.
func TestVolumeObjectKeepsEveryField(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	v := &volume.Volume{
		Spec: spec.Spec{Name: "data", UUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301", Node: "node-1", Mode: spec.ModeFilesystem,
			FSType: "xfs", MkfsOptions: []string{"-m", "crc=1"}, SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"},
			RawBlockDevice: &spec.RawBlockDevice{DevicePath: "/dev/sdb"}, LVMLogicalVolume: &spec.LVMLogicalVolume{VGName: "vg0", Size: "1Gi"},
			Template:   &spec.Template{Metadata: spec.TemplateMetadata{Labels: map[string]string{"tier": "gold"}}},
			Source:     &spec.Source{VolumeUUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3302", Snapshot: "s1"},
			Encryption: &spec.Encryption{Provider: spec.ProviderKeyfile}},
		CreatedAt: now, DeleteRequested: true, Wipe: true, ForgetRequested: true, NodeForgotten: true, Origin: volume.OriginSalt,
		Claim: &saltvolumes.Claim{Namespace: "apps", Name: "data", UID: "u", StorageClass: "sv", ReclaimPolicy: "Delete"}, RequestedBy: "alice",
	}
	v.Status.Phase, v.Status.Reason, v.Status.Message, v.Status.Step = volume.Pending, "Resizing", "growing", "attach"
	v.Status.JobID, v.Status.JobStartedAt, v.Status.UpdatedAt = "20261126120000000000", now, now
	v.Status.PersistentPath, v.Status.Size, v.Status.PreparedSize, v.Status.Growing = "/dev/disk/by-uuid/x", 1<<30, 1<<30, true

	stored := func(typ reflect.Type, skip ...string) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Tag.Get("json") == "-" || strings.Contains(strings.Join(skip, ","), f.Name) {
				continue
			}
			val := reflect.ValueOf(v).Elem()
			if typ == reflect.TypeOf(spec.Spec{}) {
				val = val.FieldByName("Spec")
			}
			assert.False(t, val.Field(i).IsZero(), "the fixture leaves %s.%s unset: set it, so the round trip checks it", typ.Name(), f.Name)
		}
	}
	stored(reflect.TypeOf(volume.Volume{}))
	stored(reflect.TypeOf(spec.Spec{}))

	u := withStatus(newObject(v), v, now)
	u.SetResourceVersion("42")
	got, err := volumeFromObject(u)
	require.NoError(t, err)
	want := v.Clone()
	want.Revision = 42
	assert.Equal(t, want, got)
}
