package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

const uid = "5b0c6a4e-8a7e-4c57-9a43-1b2f6f3c9d10"

func testClaim(mut ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	class := "sv"
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "apps", UID: uid, Annotations: map[string]string{
			annProvisioner: DefaultProvisioner, annSelectedNode: "node-1"}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}
	for _, m := range mut {
		m(pvc)
	}
	return pvc
}

func testClass(mut ...func(*storagev1.StorageClass)) *storagev1.StorageClass {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "sv"}, Provisioner: DefaultProvisioner, VolumeBindingMode: &wffc}
	for _, m := range mut {
		m(sc)
	}
	return sc
}

func TestDecideClaim(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	immediate := storagev1.VolumeBindingImmediate
	retain := corev1.PersistentVolumeReclaimRetain
	cases := []struct {
		name   string
		pvc    *corev1.PersistentVolumeClaim
		sc     *storagev1.StorageClass
		minion string
		wait   bool
		refuse string // substring of the refusal
		check  func(t *testing.T, d claimDecision)
	}{
		{name: "filesystem claim", pvc: testClaim(), sc: testClass(), minion: "node-1", check: func(t *testing.T, d claimDecision) {
			assert.Equal(t, "pvc-"+uid, d.Spec.Name)
			assert.Equal(t, uid, d.Spec.UUID, "the claim's UID is the volume UUID: a retry finds the first try")
			assert.Equal(t, "node-1", d.Spec.Node)
			assert.Equal(t, spec.ModeFilesystem, d.Spec.Mode)
			assert.Equal(t, "ext4", d.Spec.FSType)
			assert.EqualValues(t, 1<<30, d.Spec.SizeBytes)
			assert.Equal(t, "Delete", d.Claim.ReclaimPolicy, "StorageClass default")
			assert.Equal(t, "apps", d.Claim.Namespace)
		}},
		{name: "class parameters", pvc: testClaim(), minion: "node-1",
			sc: testClass(func(sc *storagev1.StorageClass) {
				sc.Parameters = map[string]string{"fsType": "xfs", "mkfsOptions": "-m crc=1 -L data", "mode": "Filesystem"}
				sc.ReclaimPolicy = &retain
			}),
			check: func(t *testing.T, d claimDecision) {
				assert.Equal(t, "xfs", d.Spec.FSType)
				assert.Equal(t, []string{"-m", "crc=1", "-L", "data"}, d.Spec.MkfsOptions)
				assert.Equal(t, "Retain", d.Claim.ReclaimPolicy)
			}},
		{name: "small xfs claim gets xfs's minimum", minion: "node-1",
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) {
				p.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("10Mi")
			}),
			sc:    testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"fsType": "xfs"} }),
			check: func(t *testing.T, d claimDecision) { assert.EqualValues(t, spec.MinXFSSize, d.Spec.SizeBytes) }},
		{name: "encrypted class", pvc: testClaim(), minion: "node-1",
			sc: testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"encryption": "keyfile"} }),
			check: func(t *testing.T, d claimDecision) {
				require.NotNil(t, d.Spec.Encryption)
				assert.Equal(t, "keyfile", d.Spec.Encryption.Provider)
				assert.EqualValues(t, 1<<30+spec.LUKSHeaderBytes, d.Spec.SizeBytes, "the claim's 1Gi inside, the LUKS2 header beside it")
			}},
		{name: "encryption provider not in this release", minion: "node-1", pvc: testClaim(), refuse: "encryption.provider: \"tpm2\" is not available in this release",
			sc: testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"encryption": "tpm2"} })},
		{name: "master keys need a name known beforehand", minion: "node-1", pvc: testClaim(), refuse: "parameter encryption=master: a master key is put in pillar (salt_volumes:keys:NAME) before its volume is made",
			sc: testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"encryption": "master"} })},
		{name: "encrypted block claim", minion: "node-1",
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeMode = &block }),
			sc:  testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"encryption": "keyfile"} }),
			check: func(t *testing.T, d claimDecision) {
				assert.Equal(t, spec.ModeBlock, d.Spec.Mode)
				assert.EqualValues(t, 1<<30+spec.LUKSHeaderBytes, d.Spec.SizeBytes, "the opened device is the claim's size: no table inside")
				assert.Equal(t, "/dev/mapper/sv-"+uid, d.Spec.PersistentPath())
			}},
		{name: "block claim", minion: "node-1", sc: testClass(),
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeMode = &block }),
			check: func(t *testing.T, d claimDecision) {
				assert.Equal(t, spec.ModeBlock, d.Spec.Mode)
				assert.Empty(t, d.Spec.FSType)
				assert.Greater(t, d.Spec.SizeBytes, int64(1<<30), "room for the GPT")
			}},
		{name: "not our provisioner", pvc: testClaim(), sc: testClass(func(sc *storagev1.StorageClass) { sc.Provisioner = "other.io/x" }), minion: "node-1", wait: true},
		{name: "PV controller has not asked yet", minion: "node-1", sc: testClass(), wait: true,
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) { delete(p.Annotations, annProvisioner) })},
		{name: "beta annotation counts", minion: "node-1", sc: testClass(),
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) {
				delete(p.Annotations, annProvisioner)
				p.Annotations[annBetaProvisioner] = DefaultProvisioner
			}),
			check: func(t *testing.T, d claimDecision) { require.NotNil(t, d.Spec) }},
		{name: "no node selected yet", sc: testClass(), wait: true,
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) { delete(p.Annotations, annSelectedNode) })},
		{name: "bound already", minion: "node-1", sc: testClass(), wait: true,
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeName = "pv-x" })},
		{name: "being deleted", minion: "node-1", sc: testClass(), wait: true,
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) { now := metav1.Now(); p.DeletionTimestamp = &now })},
		{name: "selector", minion: "node-1", sc: testClass(), refuse: "selector",
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) {
				p.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "fast"}}
			})},
		{name: "a CSI snapshot as data source", minion: "node-1", sc: testClass(), refuse: "VolumeSnapshots of snapshot.storage.k8s.io are for CSI drivers",
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) {
				g := "snapshot.storage.k8s.io"
				p.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &g, Kind: "VolumeSnapshot", Name: "snap"}
			})},
		{name: "a data source in another namespace", minion: "node-1", sc: testClass(), refuse: "within the claim's own namespace",
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) {
				ns := "other"
				p.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "src", Namespace: &ns}
			})},
		{name: "immediate binding", minion: "node-1", pvc: testClaim(), refuse: "WaitForFirstConsumer",
			sc: testClass(func(sc *storagev1.StorageClass) { sc.VolumeBindingMode = &immediate })},
		{name: "node without a minion", pvc: testClaim(), sc: testClass(), refuse: "not a Salt minion"},
		{name: "shared access", minion: "node-1", sc: testClass(), refuse: "ReadWriteMany",
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) {
				p.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
			})},
		{name: "unknown parameter", minion: "node-1", pvc: testClaim(), refuse: "unknown parameter(s) fstype",
			sc: testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"fstype": "xfs"} })},
		{name: "mode conflicts with the claim", minion: "node-1", pvc: testClaim(), refuse: "parameter mode=Block",
			sc: testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"mode": "Block"} })},
		{name: "fsType on a block claim", minion: "node-1", refuse: "Filesystem claims only",
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeMode = &block }),
			sc:  testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"fsType": "ext4"} })},
		{name: "mkfs option outside the allow-list", minion: "node-1", pvc: testClaim(), refuse: "parameter mkfsOptions",
			sc: testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"mkfsOptions": "-F"} })},
		{name: "bad fsType", minion: "node-1", pvc: testClaim(), refuse: "fsType",
			sc: testClass(func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"fsType": "btrfs"} })},
		{name: "no size", minion: "node-1", sc: testClass(), refuse: "requests.storage",
			pvc: testClaim(func(p *corev1.PersistentVolumeClaim) { p.Spec.Resources.Requests = nil })},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := decideClaim(c.pvc, c.sc, DefaultProvisioner, c.minion)
			switch {
			case c.wait:
				assert.True(t, d.Wait, "%+v", d)
				assert.Nil(t, d.Spec)
			case c.refuse != "":
				assert.Contains(t, d.Refuse, c.refuse)
				assert.Nil(t, d.Spec, "nothing is provisioned for a refused claim")
			default:
				require.Empty(t, d.Refuse)
				require.NotNil(t, d.Spec)
				c.check(t, d)
			}
		})
	}
}

// A Block volume's usable size (the partition) is at least the request,
// whatever the loop device's sector size.
func TestSparseSizeForBlockCoversTheRequest(t *testing.T) {
	s := &spec.Spec{Mode: spec.ModeBlock}
	for _, want := range []int64{1, 4 << 20, 10 << 20, 10<<20 + 1, 1 << 30, 3*(1<<30) + 12345} {
		size, err := sparseSizeFor(s, want)
		require.NoError(t, err)
		assert.Zero(t, size%(1<<20), "whole MiB")
		for _, ss := range []int{512, 4096} {
			_, l, err := gpt.Extent(size, ss)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, l, want, "request %d, file %d, sector %d", want, size, ss)
		}
		if size > spec.MinBlockSize {
			_, l, _ := gpt.Extent(size-(1<<20), 512)
			assert.Less(t, l, want, "one MiB less would be too small: the file is not oversized")
		}
	}
}

func TestReprovisionOnlyWhatAnotherNodeMayTake(t *testing.T) {
	tooBig := "volume pvc-" + uid + ": sparseLoopDevice.size: 100Ti is larger than the whole filesystem holding /var/lib/salt-volumes (50Gi): use a smaller size"
	failed := func(mut ...func(*volume.Volume)) *volume.Volume {
		v := &volume.Volume{Spec: spec.Spec{Name: "pvc-" + uid, UUID: uid, Node: "node-1"},
			Claim: &saltvolumes.Claim{Namespace: "apps", Name: "data", UID: uid}}
		v.Status.Phase, v.Status.Reason, v.Status.Message = volume.Failed, reconciler.ReasonPrepareFailed, tooBig
		for _, m := range mut {
			m(v)
		}
		return v
	}
	why := reprovision(failed(), testClaim())
	assert.Contains(t, why, "node-1 cannot hold it")
	assert.Contains(t, why, "larger than the whole filesystem")
	assert.NotEmpty(t, reprovision(failed(func(v *volume.Volume) {
		v.Status.Message = "volume x: sparseLoopDevice.size: 10Gi would commit 60Gi of 50Gi on /var/lib/salt-volumes, past the overcommit ratio 1"
	}), testClaim()), "past the overcommit ratio")

	for name, c := range map[string]struct {
		v   *volume.Volume
		pvc *corev1.PersistentVolumeClaim
	}{
		"mkfs refused an option (fails on every node)": {failed(func(v *volume.Volume) {
			v.Status.Message = "volume x: mkfs.ext4 -q -U ... -I 100: invalid inode size 100"
		}), testClaim()},
		"the minion did not answer": {failed(func(v *volume.Volume) { v.Status.Reason = reconciler.ReasonJobTimeout }), testClaim()},
		"not failed":                {failed(func(v *volume.Volume) { v.Status.Phase = volume.Pending }), testClaim()},
		"already being deleted":     {failed(func(v *volume.Volume) { v.DeleteRequested = true }), testClaim()},
		"published once": {failed(func(v *volume.Volume) {
			v.Status.PersistentVolume = &saltvolumes.PersistentVolume{Name: v.Spec.Name}
		}), testClaim()},
		"made through the API, no claim": {failed(func(v *volume.Volume) { v.Claim = nil }), testClaim()},
		"claim gone":                     {failed(), nil},
		"another claim by that name": {failed(), testClaim(func(c *corev1.PersistentVolumeClaim) {
			c.UID = "00000000-0000-4000-8000-000000000000"
		})},
		"claim bound": {failed(), testClaim(func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pv-x" })},
		"claim being deleted": {failed(), testClaim(func(c *corev1.PersistentVolumeClaim) {
			now := metav1.Now()
			c.DeletionTimestamp = &now
		})},
		"no node selected any more": {failed(), testClaim(func(c *corev1.PersistentVolumeClaim) {
			delete(c.Annotations, annSelectedNode)
		})},
	} {
		assert.Empty(t, reprovision(c.v, c.pvc), name)
	}
}
