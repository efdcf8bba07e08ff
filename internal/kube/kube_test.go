package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/salt-volumes/salt-volumes/internal/spec"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

func available(mode string) saltvolumes.View {
	v := saltvolumes.View{Spec: spec.Spec{Name: "data-1", UUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301", Node: "node-1", Mode: mode}}
	v.Status.Phase = saltvolumes.Available
	v.Status.Size = 10 << 30
	v.Status.PersistentPath = "/dev/disk/by-uuid/" + v.Spec.UUID
	if mode == spec.ModeFilesystem {
		v.Spec.FSType = "xfs"
	} else {
		v.Status.PersistentPath = "/dev/disk/by-partuuid/" + v.Spec.UUID
	}
	return v
}

// decoded reads the manifest back the way kubectl would: as generic YAML.
func decoded(t *testing.T, obj any) map[string]any {
	b, err := Marshal(obj)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, yaml.Unmarshal(b, &m))
	return m
}

func dig(m map[string]any, keys ...any) any {
	var cur any = m
	for _, k := range keys {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[k.(string)]
		case []any:
			cur = c[k.(int)]
		default:
			return nil
		}
	}
	return cur
}

func TestPersistentVolumeFilesystem(t *testing.T) {
	pv, err := NewPersistentVolume(available(spec.ModeFilesystem), Options{MountOptions: []string{"discard"}})
	require.NoError(t, err)
	m := decoded(t, pv)
	assert.Equal(t, "v1", m["apiVersion"])
	assert.Equal(t, "PersistentVolume", m["kind"])
	assert.Equal(t, "data-1", dig(m, "metadata", "name"))
	assert.Equal(t, "10Gi", dig(m, "spec", "capacity", "storage"))
	assert.Equal(t, "Filesystem", dig(m, "spec", "volumeMode"))
	assert.Equal(t, "/dev/disk/by-uuid/3f2504e0-4f89-41d3-9a0c-0305e82c3301", dig(m, "spec", "local", "path"))
	assert.Equal(t, "xfs", dig(m, "spec", "local", "fsType"))
	assert.Equal(t, "salt-volumes", dig(m, "spec", "storageClassName"))
	assert.Equal(t, "Retain", dig(m, "spec", "persistentVolumeReclaimPolicy"))
	assert.Equal(t, []any{"ReadWriteOnce"}, dig(m, "spec", "accessModes"))
	assert.Equal(t, []any{"discard"}, dig(m, "spec", "mountOptions"))
	expr := dig(m, "spec", "nodeAffinity", "required", "nodeSelectorTerms", 0, "matchExpressions", 0)
	assert.Equal(t, map[string]any{"key": "kubernetes.io/hostname", "operator": "In", "values": []any{"node-1"}}, expr)
}

func TestPersistentVolumeBlock(t *testing.T) {
	pv, err := NewPersistentVolume(available(spec.ModeBlock), Options{StorageClass: "fast", Hostname: "worker-1.example.com"})
	require.NoError(t, err)
	m := decoded(t, pv)
	assert.Equal(t, "Block", dig(m, "spec", "volumeMode"))
	assert.Equal(t, "/dev/disk/by-partuuid/3f2504e0-4f89-41d3-9a0c-0305e82c3301", dig(m, "spec", "local", "path"))
	assert.Nil(t, dig(m, "spec", "local", "fsType"), "a Block PV has no filesystem")
	assert.Equal(t, "fast", dig(m, "spec", "storageClassName"))
	assert.Equal(t, []any{"worker-1.example.com"}, dig(m, "spec", "nodeAffinity", "required", "nodeSelectorTerms", 0, "matchExpressions", 0, "values"))
}

func TestPersistentVolumeCarriesTheTemplate(t *testing.T) {
	v := available(spec.ModeFilesystem)
	v.Spec.Template = &spec.Template{Metadata: spec.TemplateMetadata{
		Labels:      map[string]string{"tier": "gold"},
		Annotations: map[string]string{"example.com/owner": "storage team"},
	}}
	pv, err := NewPersistentVolume(v, Options{})
	require.NoError(t, err)
	m := decoded(t, pv)
	assert.Equal(t, map[string]any{"tier": "gold", "salt-volumes.io/node": "node-1", "salt-volumes.io/uuid": v.Spec.UUID}, dig(m, "metadata", "labels"))
	assert.Equal(t, map[string]any{"example.com/owner": "storage team"}, dig(m, "metadata", "annotations"))
	pv, err = NewPersistentVolume(available(spec.ModeFilesystem), Options{})
	require.NoError(t, err)
	assert.Nil(t, dig(decoded(t, pv), "metadata", "annotations"), "no template, no annotations")
}

func TestPersistentVolumeRefusals(t *testing.T) {
	pending := available(spec.ModeFilesystem)
	pending.Status.Phase = saltvolumes.Pending
	_, err := NewPersistentVolume(pending, Options{})
	assert.ErrorContains(t, err, "volume data-1 is Pending: a PersistentVolume needs an Available volume")

	_, err = NewPersistentVolume(available(spec.ModeFilesystem), Options{ReclaimPolicy: "Recycle"})
	assert.ErrorContains(t, err, `reclaim policy "Recycle": use Retain or Delete`)

	_, err = NewPersistentVolume(available(spec.ModeFilesystem), Options{Hostname: "Node 1"})
	assert.ErrorContains(t, err, "--hostname")

	_, err = NewPersistentVolume(available(spec.ModeBlock), Options{MountOptions: []string{"discard"}})
	assert.ErrorContains(t, err, "a Block volume is not mounted")

	forged := available(spec.ModeFilesystem)
	forged.Status.PersistentPath = "/"
	_, err = NewPersistentVolume(forged, Options{})
	assert.ErrorContains(t, err, `its persistent path "/" is not the one its UUID names`)
}

func TestStorageClass(t *testing.T) {
	sc, err := NewStorageClass(ClassOptions{})
	require.NoError(t, err)
	m := decoded(t, sc)
	assert.Equal(t, "storage.k8s.io/v1", m["apiVersion"])
	assert.Equal(t, "StorageClass", m["kind"])
	assert.Equal(t, "salt-volumes", dig(m, "metadata", "name"))
	assert.Equal(t, DefaultProvisioner, m["provisioner"])
	assert.Equal(t, "Delete", m["reclaimPolicy"])
	assert.Equal(t, "WaitForFirstConsumer", m["volumeBindingMode"])
	assert.Nil(t, m["mountOptions"])
	assert.Nil(t, m["parameters"])

	sc, err = NewStorageClass(ClassOptions{Name: "fast", FSType: "xfs", MkfsOptions: "-m crc=1", ReclaimPolicy: "Retain"})
	require.NoError(t, err)
	m = decoded(t, sc)
	assert.Equal(t, map[string]any{"fsType": "xfs", "mkfsOptions": "-m crc=1"}, m["parameters"])
	assert.Equal(t, "Retain", m["reclaimPolicy"])

	sc, err = NewStorageClass(ClassOptions{Static: true})
	require.NoError(t, err)
	m = decoded(t, sc)
	assert.Equal(t, "kubernetes.io/no-provisioner", m["provisioner"])
	assert.Equal(t, "Retain", m["reclaimPolicy"])

	_, err = NewStorageClass(ClassOptions{ReclaimPolicy: "Recycle"})
	assert.ErrorContains(t, err, `reclaim policy "Recycle"`)
	_, err = NewStorageClass(ClassOptions{Static: true, FSType: "xfs"})
	assert.ErrorContains(t, err, "--static")
}
