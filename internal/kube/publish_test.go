package kube

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// What a node may report for each kind of volume before its PV is made:
// an LV in Block mode (ours, or an operator's given as rawBlockDevice) is
// named by its device-mapper link, never by a UUID link of ours.
func TestPublishable(t *testing.T) {
	const u = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	lvLink := spec.DMUUIDLinkPrefix + "LVM-" + strings.Repeat("a1B2", 16)
	vol := func(s spec.Spec, path string) *volume.Volume {
		s.Name, s.UUID, s.Node = "v", u, "node-1"
		v := &volume.Volume{Spec: s}
		v.Status.PersistentPath, v.Status.Size = path, 64<<20
		return v
	}
	lvm := &spec.LVMLogicalVolume{VGName: "vg0", Size: "64Mi"}
	raw := &spec.RawBlockDevice{DevicePath: "/dev/vg0/lv0"}
	for _, tc := range []struct {
		name string
		v    *volume.Volume
		ok   bool
	}{
		{"sparse Filesystem", vol(spec.Spec{Mode: spec.ModeFilesystem, SparseLoopDevice: &spec.SparseLoopDevice{Size: "64Mi"}}, "/dev/disk/by-uuid/"+u), true},
		{"sparse Block", vol(spec.Spec{Mode: spec.ModeBlock, SparseLoopDevice: &spec.SparseLoopDevice{Size: "64Mi"}}, "/dev/disk/by-partuuid/"+u), true},
		{"lvmLogicalVolume Filesystem", vol(spec.Spec{Mode: spec.ModeFilesystem, LVMLogicalVolume: lvm}, "/dev/disk/by-uuid/"+u), true},
		{"lvmLogicalVolume Block", vol(spec.Spec{Mode: spec.ModeBlock, LVMLogicalVolume: lvm}, lvLink), true},
		{"rawBlockDevice Block on an LV", vol(spec.Spec{Mode: spec.ModeBlock, RawBlockDevice: raw}, lvLink), true},
		{"a sparse Block volume claiming an LV link", vol(spec.Spec{Mode: spec.ModeBlock, SparseLoopDevice: &spec.SparseLoopDevice{Size: "64Mi"}}, lvLink), false},
		{"another volume's link", vol(spec.Spec{Mode: spec.ModeFilesystem, SparseLoopDevice: &spec.SparseLoopDevice{Size: "64Mi"}}, "/dev/disk/by-uuid/00000000-0000-4000-8000-000000000000"), false},
		{"the root filesystem", vol(spec.Spec{Mode: spec.ModeBlock, LVMLogicalVolume: lvm}, "/"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := publishable(&tc.v.Spec, tc.v.Status.Status)
			if tc.ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, "a PV needs the link its UUID names")
			}
		})
	}
	noSize := vol(spec.Spec{Mode: spec.ModeFilesystem, SparseLoopDevice: &spec.SparseLoopDevice{Size: "64Mi"}}, "/dev/disk/by-uuid/"+u)
	noSize.Status.Size = 0
	assert.Error(t, publishable(&noSize.Spec, noSize.Status.Status))
}

// An Available volume without a PV gets one again (Republish), unless it
// was adopted: those are never offered to claims.
func TestObserveNeverRepublishesAdopted(t *testing.T) {
	c := New(fake.NewSimpleClientset(), Config{}, nil)
	const u = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	v := &volume.Volume{Spec: spec.Spec{Name: "v", UUID: u, Node: "node-1"}}
	v.Status.Phase = volume.Available
	assert.True(t, c.Observe(context.Background(), v).Republish, "a volume of ours with no PV")
	v.Origin = volume.OriginSalt
	assert.False(t, c.Observe(context.Background(), v).Republish, "an adopted volume")
}

// The PV serve publishes and the one salt-volumes pv prints come from one
// builder: for the same volume and class they differ only in what makes a
// PV the control plane's (its managed-by label and finalizer).
func TestOnePersistentVolumeBuilder(t *testing.T) {
	const u = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	s := spec.Spec{Name: "v", UUID: u, Node: "node-1", Mode: spec.ModeFilesystem, FSType: "xfs",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "64Mi"},
		Template:         &spec.Template{Metadata: spec.TemplateMetadata{Labels: map[string]string{"tier": "gold"}}}}
	v := &volume.Volume{Spec: s}
	v.Status.Phase = volume.Available
	v.Status.PersistentPath, v.Status.Size = "/dev/disk/by-uuid/"+u, 64<<20

	c := New(fake.NewSimpleClientset(), Config{StorageClass: "local"}, nil)
	published, err := c.build(v)
	require.NoError(t, err)
	printed, err := NewPersistentVolume(v.View(), Options{StorageClass: "local"})
	require.NoError(t, err)

	assert.Equal(t, printed.Spec, published.Spec)
	assert.Equal(t, ManagedBy, published.Labels[LabelManagedBy])
	assert.Equal(t, []string{Finalizer}, published.Finalizers)
	delete(published.Labels, LabelManagedBy)
	assert.Equal(t, printed.Labels, published.Labels)
	assert.Equal(t, map[string]string{"tier": "gold", LabelUUID: u, LabelNode: "node-1"}, printed.Labels)
	assert.Empty(t, printed.Finalizers, "a static PV nobody watches must not be held by our finalizer")
}

// The upgrade (#48): the PVs of volumes made with the CLI, the API, the UI
// or Volume objects went into the provisioning class salt-volumes, where
// any tenant's claim naming one could bind it. The leader moves those no
// claim holds into kubernetes.storageClass (salt-volumes-static by
// default); a Bound one keeps its class and is reported once; a claim's
// own PV, and anything a follower sees, is left alone.
func TestObserveMovesUnclaimedPVsToTheStaticClass(t *testing.T) {
	ctx := context.Background()
	vol := func(name, u string, claim *saltvolumes.Claim) *volume.Volume {
		v := &volume.Volume{Spec: spec.Spec{Name: name, UUID: u, Node: "node-1", Mode: spec.ModeBlock,
			RawBlockDevice: &spec.RawBlockDevice{DevicePath: "/dev/sdb"}}, Claim: claim}
		v.Status.Phase = volume.Available
		v.Status.PersistentPath, v.Status.Size = "/dev/disk/by-partuuid/"+u, 64<<20
		return v
	}
	free := vol("free", "3f2504e0-4f89-41d3-9a0c-0305e82c3301", nil)
	bound := vol("bound", "3f2504e0-4f89-41d3-9a0c-0305e82c3302", nil)
	claimed := vol("claimed", "3f2504e0-4f89-41d3-9a0c-0305e82c3303", &saltvolumes.Claim{Namespace: "apps", Name: "data", UID: "u", StorageClass: "salt-volumes", ReclaimPolicy: "Delete"})
	pvOf := func(v *volume.Volume, ref *corev1.ObjectReference) *corev1.PersistentVolume {
		pv, err := buildPV(&v.Spec, v.Status.Status, pvParams{class: DefaultStorageClass, managed: true})
		require.NoError(t, err)
		pv.Spec.ClaimRef = ref
		pv.UID = types.UID(v.Spec.UUID) // as the API server gives each its own
		if ref != nil {
			pv.Status.Phase = corev1.VolumeBound
		} else {
			pv.Status.Phase = corev1.VolumeAvailable
		}
		return pv
	}
	cs := fake.NewSimpleClientset(
		pvOf(free, nil),
		pvOf(bound, &corev1.ObjectReference{Namespace: "tenant", Name: "steal", UID: "t"}),
		pvOf(claimed, &corev1.ObjectReference{Namespace: "apps", Name: "data", UID: "u"}))
	classOf := func(name string) string {
		pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		return pv.Spec.StorageClassName
	}
	start := func(leading bool) (*Controller, *syncBuffer) {
		var buf syncBuffer
		c := New(cs, Config{StorageClass: DefaultStaticClass, Leading: func() bool { return leading }}, slog.New(slog.NewTextHandler(&buf, nil)))
		c.SetVolumes(&fakeVolumes{})
		ctx, cancel := context.WithCancel(ctx)
		require.NoError(t, c.Start(ctx, 10*time.Second))
		t.Cleanup(func() { c.Stop(); cancel() })
		return c, &buf
	}

	f, _ := start(false)
	f.Observe(ctx, free)
	assert.Equal(t, DefaultStorageClass, classOf("free"), "a follower moves nothing")

	c, log := start(true)
	c.Observe(ctx, free)
	assert.Equal(t, DefaultStaticClass, classOf("free"), "an unclaimed PV of an operator's volume is moved")
	assert.Contains(t, log.String(), "PersistentVolume moved")
	require.NotNil(t, free.Status.PersistentVolume)
	assert.Equal(t, "Available", free.Status.PersistentVolume.Phase)

	for range 2 {
		c.Observe(ctx, bound)
	}
	assert.Equal(t, DefaultStorageClass, classOf("bound"), "a Bound PV keeps its class")
	assert.Equal(t, 1, strings.Count(log.String(), "stays in its class while a claim holds it"), "and is reported once: %s", log)
	assert.Contains(t, log.String(), "claim=tenant/steal")

	c.Observe(ctx, claimed)
	assert.Equal(t, DefaultStorageClass, classOf("claimed"), "a claim's own PV stays in its claim's class")

	updates := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "update" && a.GetResource().Resource == "persistentvolumes" {
			updates++
		}
	}
	c.Observe(ctx, free)
	for _, a := range cs.Actions() {
		if a.GetVerb() == "update" && a.GetResource().Resource == "persistentvolumes" {
			updates--
		}
	}
	assert.Equal(t, 0, updates, "a PV already in its class is not written again")
}
