package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/salt-volumes/salt-volumes/test/kubecluster"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestPods: pods on a real kubelet use the volumes, as MetalK8s's own
// scenarios check (tests/post/features/volume.feature): data that
// outlives its pod, a Block volume through volumeDevices, a volume kept
// while a running pod's claim holds it, and a provisioned claim whose pod
// starts and writes; and, also from there, PV protection and a Volume
// whose StorageClass is gone. Volumes are Volume objects applied with
// kubectl.
func TestPods(t *testing.T) {
	s, k, must, uuids := withKubelet(t, "volumes,pv,pvc,pods")
	ctx := context.Background()
	must("", "apply", "-f", filepath.Join(s.Repo, "deploy", "kubernetes", "volume-crd.yaml"))
	must("", "apply", "-f", filepath.Join(s.Repo, "deploy", "kubernetes", "volumesnapshot-crd.yaml"))
	must("", "wait", "--for", "condition=Established", "--timeout", "60s", "crd/volumes.salt-volumes.io", "crd/volumesnapshots.salt-volumes.io")
	p := newPlane(t, s)
	p.StoreConfig = "# no store file: the volumes are Volume objects\n"
	// The PVs of Volume objects in a class of their own (the default since
	// #48), which the claims of the first subtests name.
	p.Start(fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n  volumeObjects: true\n  storageClass: salt-volumes-static\n", k.ControlKubeconfig))
	class := "salt-volumes-static"
	volumeMode := func(block bool) *corev1.PersistentVolumeMode {
		m := corev1.PersistentVolumeFilesystem
		if block {
			m = corev1.PersistentVolumeBlock
		}
		return &m
	}
	apply := func(name, spec string) string {
		must("apiVersion: salt-volumes.io/v1alpha1\nkind: Volume\nmetadata:\n  name: "+name+"\nspec:\n  node: "+s.MinionID+"\n  "+spec+"\n", "apply")
		*uuids = append(*uuids, must("", "get", "volume", name, "-o", "jsonpath={.metadata.uid}"))
		must("", "wait", "--for", "jsonpath={.status.phase}=Available", "--timeout", "2m", "volume/"+name)
		return (*uuids)[len(*uuids)-1]
	}
	claim := func(name, volume, size string, block bool, sc *string) {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: sc, VolumeName: volume, VolumeMode: volumeMode(block),
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
		_, err := k.Admin.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	// newClass makes a StorageClass of ours (WaitForFirstConsumer).
	newClass := func(name string, reclaim corev1.PersistentVolumeReclaimPolicy) string {
		wffc := storagev1.VolumeBindingWaitForFirstConsumer
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: "salt-volumes.io/sparse",
			VolumeBindingMode: &wffc, ReclaimPolicy: &reclaim}
		_, err := k.Admin.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
		require.NoError(t, err)
		return name
	}
	// pod runs script in busybox with the claim at /data (or the block
	// device at /dev/data) and returns the pod's phase once it ended.
	pod := func(name, claimName string, block bool, script string) {
		t.Helper()
		c := corev1.Container{Name: "c", Image: kubecluster.BusyboxImage, ImagePullPolicy: corev1.PullNever, Command: []string{"/bin/sh", "-c", script}}
		if block {
			c.VolumeDevices = []corev1.VolumeDevice{{Name: "v", DevicePath: "/dev/data"}}
		} else {
			c.VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}
		}
		po := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{
			HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{c},
			TerminationGracePeriodSeconds: new(int64),
			Volumes:                       []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}},
		}}
		_, err := k.Admin.CoreV1().Pods("default").Create(ctx, po, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	podPhase := func(name string) corev1.PodPhase {
		po, err := k.Admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return po.Status.Phase
	}
	waitPod := func(name string, want corev1.PodPhase) {
		t.Helper()
		eventually(t, 2*time.Minute, "pod "+name+" "+string(want), func() (bool, string) {
			ph := podPhase(name)
			if ph == corev1.PodFailed && want != corev1.PodFailed {
				t.Fatalf("pod %s failed: %s", name, must("", "get", "pod", name, "-o", "jsonpath={.status}"))
			}
			return ph == want, string(ph)
		})
	}
	deletePod := func(name string) {
		t.Helper()
		zero := int64(0)
		require.NoError(t, k.Admin.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
		eventually(t, time.Minute, "pod "+name+" gone", func() (bool, string) {
			_, err := k.Admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	}

	t.Run("data written by one pod is read by the next", func(t *testing.T) {
		apply("pod-fs", "sparseLoopDevice: {size: 16Mi}")
		claim("fs-data", "pod-fs", "16Mi", false, &class)
		started := time.Now()
		pod("writer", "fs-data", false, "echo persisted > /data/file && sync")
		waitPod("writer", corev1.PodSucceeded)
		t.Logf("first pod on the volume: created -> Succeeded in %s", time.Since(started).Round(100*time.Millisecond))
		deletePod("writer")
		pod("reader", "fs-data", false, `test "$(cat /data/file)" = persisted`)
		waitPod("reader", corev1.PodSucceeded)
		deletePod("reader")
	})

	t.Run("a Block volume is a device in the pod", func(t *testing.T) {
		apply("pod-block", "mode: Block\n  sparseLoopDevice: {size: 16Mi}")
		claim("block-data", "pod-block", "8Mi", true, &class) // the GPT partition is the file less its tables
		pod("block-writer", "block-data", true, "test -b /dev/data && echo raw-bytes | dd of=/dev/data bs=512 count=1 conv=sync,fsync")
		waitPod("block-writer", corev1.PodSucceeded)
		deletePod("block-writer")
		pod("block-reader", "block-data", true, `test "$(dd if=/dev/data bs=9 count=1 2>/dev/null)" = raw-bytes`)
		waitPod("block-reader", corev1.PodSucceeded)
		deletePod("block-reader")
	})

	t.Run("a running pod's claim keeps its Volume and PV; both go once pod and claim are deleted", func(t *testing.T) {
		pod("holder", "fs-data", false, "sleep 3600")
		waitPod("holder", corev1.PodRunning)
		must("", "delete", "volume", "pod-fs", "--wait=false")
		eventually(t, 30*time.Second, "the deletion waits, saying why", func() (bool, string) {
			out, _ := k.Kubectl("get", "volume", "pod-fs", "-o", "jsonpath={.status.step}")
			return strings.Contains(out, "deletion waits: its PersistentVolume pod-fs is Bound to default/fs-data"), out
		})
		time.Sleep(2 * time.Second)
		assert.Equal(t, corev1.PodRunning, podPhase("holder"), "the pod runs on")
		_, err := k.Admin.CoreV1().PersistentVolumes().Get(ctx, "pod-fs", metav1.GetOptions{})
		assert.NoError(t, err, "the PV is kept")
		deletePod("holder")
		require.NoError(t, k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "fs-data", metav1.DeleteOptions{}))
		eventually(t, 2*time.Minute, "Volume pod-fs gone", func() (bool, string) {
			out, _ := k.Kubectl("get", "volume", "pod-fs", "--ignore-not-found", "-o", "jsonpath={.metadata.name} {.status.phase} {.status.message}")
			return strings.TrimSpace(out) == "", out
		})
		_, err = os.Stat(filepath.Join(s.StateDir, "sparse", (*uuids)[0]))
		assert.True(t, os.IsNotExist(err), "its storage reclaimed")
	})

	t.Run("a raw Volume on a disk of the node: applied with kubectl, used by a pod, deleted without wiping", func(t *testing.T) {
		disk := testenv.FakeDisk(t, 32<<20)
		u := apply("pod-raw", "rawBlockDevice: {devicePath: "+disk.Path+"}")
		assert.Regexp(t, `(?m)^pod-raw\s+`+s.MinionID+`\s+raw\s+32Mi\s+Filesystem\s+Available\s+`, must("", "get", "volumes"))
		claim("raw-data", "pod-raw", "32Mi", false, &class)
		pod("raw-writer", "raw-data", false, "echo on-raw > /data/file && sync")
		waitPod("raw-writer", corev1.PodSucceeded)
		deletePod("raw-writer")
		require.NoError(t, k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "raw-data", metav1.DeleteOptions{}))
		must("", "delete", "volume", "pod-raw", "--timeout", "2m")
		out, err := exec.Command("blkid", "-p", "-o", "value", "-s", "UUID", disk.Path).Output()
		require.NoError(t, err)
		assert.Equal(t, u, strings.TrimSpace(string(out)), "without the wipe annotation the filesystem stays on the disk")
	})

	t.Run("PV protection: a PV deleted first stays while its Volume lives; both go with the Volume", func(t *testing.T) {
		u := apply("pod-protect", "sparseLoopDevice: {size: 16Mi}")
		must("", "delete", "pv", "pod-protect", "--wait=false")
		time.Sleep(3 * time.Second)
		pv, err := k.Admin.CoreV1().PersistentVolumes().Get(ctx, "pod-protect", metav1.GetOptions{})
		require.NoError(t, err, "the PV is kept")
		assert.NotNil(t, pv.DeletionTimestamp, "marked for deletion (Terminating)")
		assert.Contains(t, pv.Finalizers, "salt-volumes.io/storage")
		// The Volume stays, its data kept, and says why it can no longer
		// be offered to claims and how to finish.
		eventually(t, 30*time.Second, "the Volume says its PV is being deleted", func() (bool, string) {
			out, _ := k.Kubectl("get", "volume", "pod-protect", "-o", "jsonpath={.status.phase} {.status.message}")
			return strings.HasPrefix(out, "Failed ") && strings.Contains(out, "its PersistentVolume pod-protect is being deleted outside salt-volumes (kubectl delete pv); the data is kept"), out
		})
		_, err = os.Stat(filepath.Join(s.StateDir, "sparse", u))
		require.NoError(t, err, "its storage is still there")
		must("", "delete", "volume", "pod-protect", "--timeout", "2m")
		eventually(t, time.Minute, "the PV goes with its Volume", func() (bool, string) {
			_, err := k.Admin.CoreV1().PersistentVolumes().Get(ctx, "pod-protect", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		_, err = os.Stat(filepath.Join(s.StateDir, "sparse", u))
		assert.True(t, os.IsNotExist(err), "its storage reclaimed")
	})

	t.Run("a Volume whose StorageClass is gone is deleted cleanly", func(t *testing.T) {
		name := newClass("short-lived", corev1.PersistentVolumeReclaimRetain)
		claim("kept", "", "16Mi", false, &name)
		pod("kept-writer", "kept", false, "echo kept > /data/file && sync")
		waitPod("kept-writer", corev1.PodSucceeded)
		pvc, err := k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "kept", metav1.GetOptions{})
		require.NoError(t, err)
		vol := pvc.Spec.VolumeName
		u := strings.TrimPrefix(vol, "pvc-")
		*uuids = append(*uuids, u)
		deletePod("kept-writer")
		require.NoError(t, k.Admin.StorageV1().StorageClasses().Delete(ctx, "short-lived", metav1.DeleteOptions{}))
		require.NoError(t, k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "kept", metav1.DeleteOptions{}))
		eventually(t, time.Minute, "its PV Released (reclaim policy Retain keeps the Volume)", func() (bool, string) {
			out, _ := k.Kubectl("get", "volume", vol, "-o", "jsonpath={.status.phase} {.status.persistentVolume.phase}")
			return out == "Available Released", out
		})
		must("", "delete", "volume", vol, "--timeout", "2m")
		_, err = k.Admin.CoreV1().PersistentVolumes().Get(ctx, vol, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "its PV gone: %v", err)
		_, err = os.Stat(filepath.Join(s.StateDir, "sparse", u))
		assert.True(t, os.IsNotExist(err), "its storage reclaimed")
	})

	t.Run("a provisioned claim's pod starts and writes", func(t *testing.T) {
		name := newClass("sparse", corev1.PersistentVolumeReclaimDelete)
		claim("dyn", "", "32Mi", false, &name)
		started := time.Now()
		pod("dyn-writer", "dyn", false, "echo provisioned > /data/file && sync && cat /data/file")
		waitPod("dyn-writer", corev1.PodSucceeded)
		t.Logf("pod of a WaitForFirstConsumer claim: created -> Succeeded in %s", time.Since(started).Round(100*time.Millisecond))
		pvc, err := k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "dyn", metav1.GetOptions{})
		require.NoError(t, err)
		vol := pvc.Spec.VolumeName
		*uuids = append(*uuids, strings.TrimPrefix(vol, "pvc-"))
		assert.Equal(t, "Available", must("", "get", "volume", vol, "-o", "jsonpath={.status.phase}"), "the provisioned volume is a Volume object")
		deletePod("dyn-writer")
		require.NoError(t, k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "dyn", metav1.DeleteOptions{}))
		eventually(t, 2*time.Minute, "the provisioned Volume goes with its claim (reclaim policy Delete)", func() (bool, string) {
			out, _ := k.Kubectl("get", "volume", vol, "--ignore-not-found", "-o", "name")
			return strings.TrimSpace(out) == "", out
		})
	})

	t.Run("a running pod's claim is cloned by a second claim, and restored from a snapshot", func(t *testing.T) {
		name := newClass("clonable", corev1.PersistentVolumeReclaimDelete)
		claim("origin", "", "32Mi", false, &name)
		// The first pod keeps running: the snapshot its clone starts from
		// freezes its mounted filesystem for the copy.
		// Ready once it wrote (the kubelet runs the probe: no exec or
		// logs through the API server here).
		po := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "origin-writer", Namespace: "default"}, Spec: corev1.PodSpec{
			HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "c", Image: kubecluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:        []string{"/bin/sh", "-c", "echo original > /data/file.tmp && sync && mv /data/file.tmp /data/file && sleep 3600"},
				VolumeMounts:   []corev1.VolumeMount{{Name: "v", MountPath: "/data"}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-e", "/data/file"}}}, PeriodSeconds: 1}}},
			Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "origin"}}}},
		}}
		_, err := k.Admin.CoreV1().Pods("default").Create(ctx, po, metav1.CreateOptions{})
		require.NoError(t, err)
		must("", "wait", "--for", "condition=Ready", "--timeout", "2m", "pod/origin-writer")
		pvc, err := k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "origin", metav1.GetOptions{})
		require.NoError(t, err)
		origin := pvc.Spec.VolumeName
		*uuids = append(*uuids, strings.TrimPrefix(origin, "pvc-"))

		withSource := func(claimName string, ref *corev1.TypedObjectReference) {
			t.Helper()
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: "default"},
				Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &name, DataSourceRef: ref,
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}}}}
			_, err := k.Admin.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{})
			require.NoError(t, err)
		}
		withSource("copy", &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "origin"})
		pod("copy-reader", "copy", false, `test "$(cat /data/file)" = original && echo copy-only > /data/mine && sync`)
		waitPod("copy-reader", corev1.PodSucceeded)
		pvc, err = k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "copy", metav1.GetOptions{})
		require.NoError(t, err)
		clone := pvc.Spec.VolumeName
		*uuids = append(*uuids, strings.TrimPrefix(clone, "pvc-"))
		assert.NotEqual(t, must("", "get", "volume", origin, "-o", "jsonpath={.metadata.uid}"), must("", "get", "volume", clone, "-o", "jsonpath={.metadata.uid}"))
		evs := must("", "get", "events", "--field-selector", "involvedObject.name=copy", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{'\\n'}{end}")
		assert.Contains(t, evs, "a clone of snapshot pvc-"+string(pvc.UID))
		// The snapshot taken for the clone goes once the clone is ready:
		// the origin can be deleted later.
		eventually(t, time.Minute, "the clone's snapshot deleted", func() (bool, string) {
			out, _, _ := p.CLI("snapshot", "ls", origin)
			return !strings.Contains(out, "pvc-"), out
		})
		// A VolumeSnapshot object of ours, made with kubectl, restored by
		// a claim's dataSourceRef.
		must("apiVersion: salt-volumes.io/v1alpha1\nkind: VolumeSnapshot\nmetadata:\n  name: nightly\n  namespace: default\nspec:\n  source: {persistentVolumeClaimName: origin}\n", "apply")
		must("", "wait", "--for", "jsonpath={.status.readyToUse}=true", "--timeout", "2m", "volumesnapshots.salt-volumes.io/nightly")
		listed := must("", "get", "volumesnapshots.salt-volumes.io")
		assert.Contains(t, listed, "nightly")
		assert.Contains(t, listed, origin)
		nightly := must("", "get", "volumesnapshots.salt-volumes.io", "nightly", "-o", "jsonpath={.status.snapshot}")
		assert.Regexp(t, `^default-nightly-[0-9a-f]{16}$`, nightly, "named for namespace and name, told apart by their hash")
		out, errs, code := p.CLI("snapshot", "get", nightly)
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "Ready")
		// Copy-on-write space is a thick LV's: on a sparse volume the
		// object fails naming its field, and nothing is taken.
		must("apiVersion: salt-volumes.io/v1alpha1\nkind: VolumeSnapshot\nmetadata:\n  name: sized\n  namespace: default\nspec:\n  source: {persistentVolumeClaimName: origin}\n  copyOnWriteSize: 8Mi\n", "apply")
		must("", "wait", "--for", "jsonpath={.status.phase}=Failed", "--timeout", "2m", "volumesnapshots.salt-volumes.io/sized")
		assert.Contains(t, must("", "get", "volumesnapshots.salt-volumes.io", "sized", "-o", "jsonpath={.status.message}"), "spec.copyOnWriteSize: only a thick LVM snapshot sets space aside")
		out, _, _ = p.CLI("snapshot", "ls", origin)
		assert.NotContains(t, out, "sized", "no snapshot taken")
		must("", "delete", "volumesnapshots.salt-volumes.io", "sized", "--timeout", "2m")
		group := "salt-volumes.io"
		withSource("restored", &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "nightly"})
		// The origin's data, without what the clone's pod wrote in its own.
		pod("restored-reader", "restored", false, `test "$(cat /data/file)" = original && test ! -e /data/mine`)
		waitPod("restored-reader", corev1.PodSucceeded)
		pvc, err = k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "restored", metav1.GetOptions{})
		require.NoError(t, err)
		*uuids = append(*uuids, strings.TrimPrefix(pvc.Spec.VolumeName, "pvc-"))

		// Issue #48: snapshots stay in their namespace. A tenant may create
		// claims, pods' claims and VolumeSnapshot objects in namespace evil.
		must("", "apply", "-f", filepath.Join(s.Repo, "deploy", "kubernetes", "volumesnapshot-policy.yaml"))
		must(`apiVersion: v1
kind: Namespace
metadata: {name: evil}
---
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: tenant, namespace: evil}
rules:
  - apiGroups: [""]
    resources: [persistentvolumeclaims]
    verbs: [create, get, list]
  - apiGroups: [salt-volumes.io]
    resources: [volumesnapshots]
    verbs: [create, get, list, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: tenant, namespace: evil}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant}
`, "apply")
		out, errs, code = p.CLI("snapshot", "create", origin, "api-nightly", "--wait")
		require.Equal(t, 0, code, "%s%s", out, errs)
		evilClaim := func(claimName, ref string) {
			t.Helper()
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: "evil"},
				Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &name,
					DataSourceRef: &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: ref},
					AccessModes:   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:     corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}}}}
			_, err := k.Admin.CoreV1().PersistentVolumeClaims("evil").Create(ctx, pvc, metav1.CreateOptions{})
			require.NoError(t, err)
			po := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: "evil"}, Spec: corev1.PodSpec{
				HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "c", Image: kubecluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
					Command: []string{"/bin/sh", "-c", `test "$(cat /data/file)" = original`}, VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}}},
				Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}},
			}}
			_, err = k.Admin.CoreV1().Pods("evil").Create(ctx, po, metav1.CreateOptions{})
			require.NoError(t, err)
		}
		evilEvents := func(claimName string) string {
			return must("", "get", "events", "-n", "evil", "--field-selector", "involvedObject.name="+claimName, "-o", "jsonpath={range .items[*]}{.reason}: {.message}{'\\n'}{end}")
		}
		claimPhase := func(ns, claimName string) string {
			return must("", "get", "pvc", claimName, "-n", ns, "-o", "jsonpath={.status.phase}")
		}
		// (1) A claim of namespace evil names the operator's API snapshot,
		// default's snapshot by its control-plane name, and by the name it
		// had before: refused, naming no node, never Bound.
		steal := map[string]string{"steal-api": "api-nightly", "steal-ns": nightly, "steal-old": "default-nightly"}
		for c, ref := range steal {
			evilClaim(c, ref)
		}
		for c, ref := range steal {
			eventually(t, time.Minute, "the refusal on claim evil/"+c, func() (bool, string) {
				evs := evilEvents(c)
				return strings.Contains(evs, "ProvisioningFailed: dataSourceRef: VolumeSnapshot "+ref+": no snapshot of that object in namespace evil"), evs
			})
			for _, l := range strings.Split(evilEvents(c), "\n") {
				if strings.HasPrefix(l, "ProvisioningFailed") {
					assert.NotContains(t, l, s.MinionID, "the refusal does not say where the snapshot is")
				}
			}
		}
		// (3) Admission: the tenant's object may name a claim of its
		// namespace only; a volume, or an existing snapshot, needs admin on
		// volumes.
		tenant := []string{"--as", "tenant", "-n", "evil"}
		snapObj := func(objName, source string) string {
			return "apiVersion: salt-volumes.io/v1alpha1\nkind: VolumeSnapshot\nmetadata:\n  name: " + objName + "\nspec:\n  source: {" + source + "}\n"
		}
		try := func(stdin string, args ...string) (string, error) {
			// Not in this subtest's TempDir: kubectl -f splits its name at
			// the comma.
			f, err := os.CreateTemp("", "volumesnapshot-*.yaml")
			require.NoError(t, err)
			defer os.Remove(f.Name())
			_, err = f.WriteString(stdin)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			return k.Kubectl(append(args, "-f", f.Name())...)
		}
		// The policy takes a moment to be enforced once created: an
		// object let through before that is deleted.
		refused := false
		for i := 0; i < 60 && !refused; i++ {
			probe := fmt.Sprintf("prod-%d", i)
			out, err = try(snapObj(probe, "volume: "+origin), append([]string{"create"}, tenant...)...)
			refused = err != nil && strings.Contains(out, "spec.source.volume: a snapshot of any volume needs the verb admin on volumes.salt-volumes.io")
			if err == nil {
				must("", "delete", "-n", "evil", "volumesnapshots.salt-volumes.io", probe, "--timeout", "2m")
			}
			if !refused {
				time.Sleep(time.Second)
			}
		}
		require.True(t, refused, "the tenant's snapshot of a volume was not refused: %s\n%s", out, must("", "get", "validatingadmissionpolicy", "-o", "yaml"))
		out, err = try(snapObj("bind", "snapshotName: api-nightly"), append([]string{"create"}, tenant...)...)
		require.Error(t, err, out)
		assert.Contains(t, out, "spec.source.snapshotName: binding an existing snapshot to a namespace needs the verb admin")
		out, err = try(snapObj("other-claim", "persistentVolumeClaimName: origin"), append([]string{"create"}, tenant...)...)
		require.NoError(t, err, "a tenant snapshots claims of its namespace: %s", out)
		must("", "wait", "-n", "evil", "--for", "jsonpath={.status.phase}=Failed", "--timeout", "2m", "volumesnapshots.salt-volumes.io/other-claim")
		assert.Contains(t, must("", "get", "-n", "evil", "volumesnapshots.salt-volumes.io", "other-claim", "-o", "jsonpath={.status.message}"), "claim origin not found in namespace evil")

		// An operator binds the API snapshot to evil/granted: evil's claims
		// restore it by that object's name; another object cannot bind it
		// too; deleting the object releases it and keeps it.
		must(snapObj("granted", "snapshotName: api-nightly"), "create", "-n", "evil")
		must("", "wait", "-n", "evil", "--for", "jsonpath={.status.readyToUse}=true", "--timeout", "2m", "volumesnapshots.salt-volumes.io/granted")
		assert.Equal(t, "api-nightly", must("", "get", "-n", "evil", "volumesnapshots.salt-volumes.io", "granted", "-o", "jsonpath={.status.snapshot}"))
		must(snapObj("grab", "snapshotName: api-nightly"), "create", "-n", "team")
		must("", "wait", "-n", "team", "--for", "jsonpath={.status.phase}=Failed", "--timeout", "2m", "volumesnapshots.salt-volumes.io/grab")
		assert.Contains(t, must("", "get", "-n", "team", "volumesnapshots.salt-volumes.io", "grab", "-o", "jsonpath={.status.message}"), "belongs to VolumeSnapshot evil/granted")
		evilClaim("granted-copy", "granted")
		eventually(t, 2*time.Minute, "pod evil/granted-copy read the origin's data", func() (bool, string) {
			po, err := k.Admin.CoreV1().Pods("evil").Get(ctx, "granted-copy", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if po.Status.Phase == corev1.PodFailed {
				t.Fatalf("pod evil/granted-copy failed: %v", po.Status)
			}
			return po.Status.Phase == corev1.PodSucceeded, string(po.Status.Phase)
		})
		grantedPVC, err := k.Admin.CoreV1().PersistentVolumeClaims("evil").Get(ctx, "granted-copy", metav1.GetOptions{})
		require.NoError(t, err)
		*uuids = append(*uuids, strings.TrimPrefix(grantedPVC.Spec.VolumeName, "pvc-"))
		must("", "delete", "-n", "evil", "volumesnapshots.salt-volumes.io", "granted", "--timeout", "2m")
		_, errs, code = p.CLI("snapshot", "get", "api-nightly")
		assert.Equal(t, 0, code, "a bound snapshot is released, not deleted: %s", errs)
		must("", "delete", "-n", "team", "volumesnapshots.salt-volumes.io", "grab", "--timeout", "2m")

		// (2) team/a-backup and team-a/backup are two snapshots: deleting
		// one leaves the other's.
		must(snapObj("a-backup", "volume: "+origin), "create", "-n", "team")
		must(snapObj("backup", "volume: "+origin), "create", "-n", "team-a")
		must("", "wait", "-n", "team", "--for", "jsonpath={.status.readyToUse}=true", "--timeout", "2m", "volumesnapshots.salt-volumes.io/a-backup")
		must("", "wait", "-n", "team-a", "--for", "jsonpath={.status.readyToUse}=true", "--timeout", "2m", "volumesnapshots.salt-volumes.io/backup")
		one := must("", "get", "-n", "team", "volumesnapshots.salt-volumes.io", "a-backup", "-o", "jsonpath={.status.snapshot}")
		two := must("", "get", "-n", "team-a", "volumesnapshots.salt-volumes.io", "backup", "-o", "jsonpath={.status.snapshot}")
		assert.NotEqual(t, one, two)
		must("", "delete", "-n", "team", "volumesnapshots.salt-volumes.io", "a-backup", "--timeout", "2m")
		_, errs, code = p.CLI("snapshot", "get", one)
		assert.Equal(t, 4, code, errs)
		out, errs, code = p.CLI("snapshot", "get", two)
		assert.Equal(t, 0, code, "team-a/backup's snapshot went with team/a-backup: %s", errs)
		assert.Contains(t, out, "Ready")
		must("", "delete", "-n", "team-a", "volumesnapshots.salt-volumes.io", "backup", "--timeout", "2m")
		for c := range steal {
			assert.Equal(t, "Pending", claimPhase("evil", c), "claim evil/%s was never bound", c)
		}
		for _, c := range []string{"steal-api", "steal-ns", "steal-old", "granted-copy"} {
			require.NoError(t, k.Admin.CoreV1().Pods("evil").Delete(ctx, c, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
			require.NoError(t, k.Admin.CoreV1().PersistentVolumeClaims("evil").Delete(ctx, c, metav1.DeleteOptions{}))
		}
		must("", "delete", "-n", "evil", "volumesnapshots.salt-volumes.io", "other-claim", "--timeout", "2m")
		_, errs, code = p.CLI("snapshot", "rm", "api-nightly", "--wait")
		require.Equal(t, 0, code, errs)

		// Deleting the object deletes the snapshot on its node first.
		must("", "delete", "volumesnapshots.salt-volumes.io", "nightly", "--timeout", "2m")
		_, errs, code = p.CLI("snapshot", "get", nightly)
		assert.Equal(t, 4, code, errs)

		// A source that is not ours is refused on the claim, with the reason.
		csi := "snapshot.storage.k8s.io"
		withSource("from-csi", &corev1.TypedObjectReference{APIGroup: &csi, Kind: "VolumeSnapshot", Name: "x"})
		pod("csi-reader", "from-csi", false, "true")
		eventually(t, time.Minute, "the refusal on the claim", func() (bool, string) {
			evs := must("", "get", "events", "--field-selector", "involvedObject.name=from-csi", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{'\\n'}{end}")
			return strings.Contains(evs, "ProvisioningFailed: dataSource VolumeSnapshot"), evs
		})
		for _, po := range []string{"origin-writer", "copy-reader", "restored-reader", "csi-reader"} {
			deletePod(po)
		}
		for _, c := range []string{"origin", "copy", "restored", "from-csi"} {
			require.NoError(t, k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, c, metav1.DeleteOptions{}))
		}
		eventually(t, 2*time.Minute, "the four volumes go with their claims", func() (bool, string) {
			out, _ := k.Kubectl("get", "volume", "-o", "name")
			return !strings.Contains(out, origin) && !strings.Contains(out, clone) && !strings.Contains(out, pvc.Spec.VolumeName) &&
				!strings.Contains(out, grantedPVC.Spec.VolumeName), out
		})
	})

	pvCapacity := func(name string) string {
		pv, err := k.Admin.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return pv.Spec.Capacity.Storage().String()
	}
	claimCapacity := func(name string) string {
		pvc, err := k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return pvc.Status.Capacity.Storage().String()
	}

	t.Run("a claim that asks for more grows its volume under the running pod", func(t *testing.T) {
		// xfs: this host's root may not grow a mounted ext4 (resize2fs
		// needs CAP_SYS_RESOURCE there); xfs_growfs needs no more than
		// mounting did.
		wffc, del, yes := storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, true
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "growable"}, Provisioner: "salt-volumes.io/sparse",
			VolumeBindingMode: &wffc, ReclaimPolicy: &del, AllowVolumeExpansion: &yes, Parameters: map[string]string{"fsType": "xfs"}}
		_, err := k.Admin.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
		require.NoError(t, err)
		claim("grows", "", "300Mi", false, &sc.Name)
		// The pod ends once its mounted filesystem is larger than 300 MB
		// (xfs of 300Mi: 241664 KiB; of 400Mi: 344064), with the file
		// written before intact: what its user would see.
		pod("grower", "grows", false, `echo before > /data/f && sync && while :; do s=$(df -Pk /data | awk 'NR==2{print $2}'); echo "size $s"; [ "$s" -gt 300000 ] && break; sleep 1; done; test "$(cat /data/f)" = before`)
		waitPod("grower", corev1.PodRunning)
		pvc, err := k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "grows", metav1.GetOptions{})
		require.NoError(t, err)
		vol := pvc.Spec.VolumeName
		*uuids = append(*uuids, strings.TrimPrefix(vol, "pvc-"))
		require.Equal(t, "300Mi", pvCapacity(vol))

		started := time.Now()
		must("", "patch", "pvc", "grows", "--type", "merge", "-p", `{"spec":{"resources":{"requests":{"storage":"400Mi"}}}}`)
		eventually(t, 2*time.Minute, "the running pod sees its filesystem grown", func() (bool, string) {
			logs, _ := k.Kubectl("logs", "grower")
			return podPhase("grower") == corev1.PodSucceeded, string(podPhase("grower")) + ": " + logs
		})
		t.Logf("claim asked for 400Mi -> the running pod saw its filesystem grow: %s", time.Since(started).Round(100*time.Millisecond))
		eventually(t, time.Minute, "PV and claim at 400Mi", func() (bool, string) {
			got := pvCapacity(vol) + " " + claimCapacity("grows")
			return got == "400Mi 400Mi", got
		})
		assert.Equal(t, "400Mi", must("", "get", "volume", vol, "-o", "jsonpath={.spec.sparseLoopDevice.size}"), "the Volume object says the new size")
		assert.Equal(t, "Available", must("", "get", "volume", vol, "-o", "jsonpath={.status.phase}"))
		eventually(t, 10*time.Second, "the claim's resize events", func() (bool, string) {
			evs := must("", "get", "events", "--field-selector", "involvedObject.name=grows", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{'\\n'}{end}")
			return strings.Contains(evs, "Resizing: salt-volumes is growing volume "+vol+" to 400Mi") && strings.Contains(evs, "VolumeResizeSuccessful"), evs
		})
		deletePod("grower")

		// Asking for less is the API server's to refuse (claims never shrink).
		out, err := k.Kubectl("patch", "pvc", "grows", "--type", "merge", "-p", `{"spec":{"resources":{"requests":{"storage":"300Mi"}}}}`)
		require.Error(t, err, out)
		assert.Contains(t, out, "can not be less than status.capacity")
	})

	t.Run("a Volume object edited to a larger size grows, its PV and claim too", func(t *testing.T) {
		apply("edited", "sparseLoopDevice: {size: 16Mi}")
		claim("edited-data", "edited", "16Mi", false, &class)
		pod("edited-writer", "edited-data", false, "echo persisted > /data/file && sync")
		waitPod("edited-writer", corev1.PodSucceeded)
		deletePod("edited-writer")
		// No pod mounts it now: the ext4 grows offline.
		must("", "patch", "volume", "edited", "--type", "merge", "-p", `{"spec":{"sparseLoopDevice":{"size":"32Mi"}}}`)
		eventually(t, 2*time.Minute, "Volume Available, PV and claim at 32Mi", func() (bool, string) {
			got := must("", "get", "volume", "edited", "-o", "jsonpath={.status.phase}") + " " + pvCapacity("edited") + " " + claimCapacity("edited-data")
			return got == "Available 32Mi 32Mi", got
		})
		pod("edited-reader", "edited-data", false, `test "$(cat /data/file)" = persisted && test "$(df -k /data | awk 'NR==2{print $2}')" -gt 24000`)
		waitPod("edited-reader", corev1.PodSucceeded)
		deletePod("edited-reader")
		out, err := k.Kubectl("patch", "volume", "edited", "--type", "merge", "-p", `{"spec":{"sparseLoopDevice":{"size":"16Mi"}}}`)
		require.Error(t, err, out)
		assert.Contains(t, out, "size can only grow")
	})
}

// withKubelet starts real Salt and a Kubernetes control plane with a real
// kubelet whose node is the Salt minion, and returns kubectl as must
// (stdin, when given, is passed as -f) and the uuids to clean up. On
// failure it logs kubectl get of dump, the pods' and the cluster's logs.
func withKubelet(t *testing.T, dump string) (*saltstack.Stack, *kubecluster.Cluster, func(stdin string, args ...string) string, *[]string) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	// Registered before the cluster's Stop, so it runs after it: the
	// kubelet lets go of the volumes' devices first.
	uuids := new([]string)
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, *uuids, t.Logf) })
	tools, err := kubecluster.Tools(s.Repo)
	require.NoError(t, err, "building the Kubernetes binaries (scripts/kube-tools.sh)")
	start := time.Now()
	k, err := kubecluster.StartWithKubelet(context.Background(), filepath.Join(s.Root, "kube"), tools, filepath.Join(s.Repo, "deploy", "kubernetes", "rbac.yaml"), s.MinionID)
	if k != nil {
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := k.Kubectl("get", dump, "-A", "-o", "wide")
				t.Log(out)
				t.Log(k.PodLogs("salt-volumes", 4000))
				t.Log(k.Logs(3000))
			}
			k.Stop()
		})
	}
	require.NoError(t, err)
	t.Logf("control plane, containerd and kubelet up, node Ready: %s", time.Since(start).Round(100*time.Millisecond))
	must := func(stdin string, args ...string) string {
		t.Helper()
		if stdin != "" {
			f := filepath.Join(t.TempDir(), "in.yaml")
			require.NoError(t, os.WriteFile(f, []byte(stdin), 0o600))
			args = append(args, "-f", f)
		}
		out, err := k.Kubectl(args...)
		require.NoError(t, err, out)
		return strings.TrimSpace(out)
	}
	return s, k, must, uuids
}
