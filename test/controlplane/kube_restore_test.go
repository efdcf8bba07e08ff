package controlplane

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/salt-volumes/salt-volumes/internal/kube"
	"github.com/salt-volumes/salt-volumes/test/kubecluster"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestKubeRestore: a claim's volume put back to a VolumeSnapshot of its
// namespace by annotating the claim, against a real kube-apiserver and
// PV controller, real Salt and a real loop device: refused by the node
// while the volume is mounted, done once it is not, not again after a
// restart of serve; another namespace's snapshot of the very same volume
// is refused with an Event, the data left as it is. No kubelet: the data
// is written, and the volume mounted, on the node's side.
func TestKubeRestore(t *testing.T) {
	began := time.Now()
	s, k := saltAndKube(t)
	ctx := context.Background()
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
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
	// The resource before serve starts: it watches it from the start.
	must("", "apply", "-f", filepath.Join(s.Repo, "deploy", "kubernetes", "volumesnapshot-crd.yaml"))
	must("", "wait", "--for", "condition=Established", "--timeout", "60s", "crd/volumesnapshots.salt-volumes.io")
	p := newPlane(t, s)
	p.Start(kubeConfig(k))
	t.Logf("Salt, the API server and serve up: %s", time.Since(began).Round(100*time.Millisecond))

	// An operator's volume and its claim (salt-volumes-static, no class
	// object: bound at once by the PV controller).
	_, errs, code := p.CLI("create", "rs-data", "--node", s.MinionID, "--size", "32Mi", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
	v := getJSON(t, p, "rs-data")
	uuids = append(uuids, v.Spec.UUID)
	class := kube.DefaultStaticClass
	claims := k.Admin.CoreV1().PersistentVolumeClaims("default")
	_, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "rs-claim"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeName: "rs-data",
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	must("", "wait", "--for", "jsonpath={.status.phase}=Bound", "--timeout", "60s", "pvc/rs-claim")

	// note writes text (unless "") in the volume's file "note", on the
	// node's side, and reads it back.
	note := func(text string) string {
		t.Helper()
		mp := t.TempDir()
		require.NoError(t, exec.Command("mount", v.Status.PersistentPath, mp).Run(), "mount %s", v.Status.PersistentPath)
		defer func() {
			require.NoError(t, exec.Command("umount", mp).Run())
			_ = exec.Command("udevadm", "settle").Run()
		}()
		f := filepath.Join(mp, "note")
		if text != "" {
			require.NoError(t, os.WriteFile(f, []byte(text), 0o600))
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		return string(b)
	}
	note("before")
	// The claim's own snapshot, and an operator's object
	// (spec.source.volume) in namespace other, of this very volume, taken
	// together.
	must("", "create", "namespace", "other")
	must("apiVersion: salt-volumes.io/v1alpha1\nkind: VolumeSnapshot\nmetadata: {name: nightly, namespace: default}\nspec:\n  source: {persistentVolumeClaimName: rs-claim}\n"+
		"---\napiVersion: salt-volumes.io/v1alpha1\nkind: VolumeSnapshot\nmetadata: {name: theirs, namespace: other}\nspec:\n  source: {volume: rs-data}\n", "apply")
	must("", "wait", "--for", "jsonpath={.status.readyToUse}=true", "--timeout", "60s", "volumesnapshots.salt-volumes.io/nightly")
	must("", "wait", "-n", "other", "--for", "jsonpath={.status.readyToUse}=true", "--timeout", "60s", "volumesnapshots.salt-volumes.io/theirs")
	note("after")

	// status waits for the claim's answer to request from to be want.
	status := func(from, want string) kube.RestoreStatus {
		t.Helper()
		var st kube.RestoreStatus
		eventually(t, time.Minute, "restore status "+want+" for "+from, func() (bool, string) {
			pvc, err := claims.Get(ctx, "rs-claim", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			raw := pvc.Annotations[kube.AnnRestoreStatus]
			st = kube.RestoreStatus{}
			return json.Unmarshal([]byte(raw), &st) == nil && st.From == from && st.Phase == want, raw
		})
		return st
	}
	// answered waits for the claim's request to be answered.
	answered := func() kube.RestoreStatus {
		t.Helper()
		var st kube.RestoreStatus
		eventually(t, time.Minute, "restore answered", func() (bool, string) {
			pvc, err := claims.Get(ctx, "rs-claim", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			raw := pvc.Annotations[kube.AnnRestoreStatus]
			st = kube.RestoreStatus{}
			return json.Unmarshal([]byte(raw), &st) == nil && st.Phase != "" && st.Phase != kube.RestoreRestoring, raw
		})
		return st
	}
	annotate := func(args ...string) {
		t.Helper()
		must("", append([]string{"annotate", "--overwrite", "pvc", "rs-claim"}, args...)...)
	}

	t.Run("the annotation puts the volume back to its namespace's snapshot once nothing uses it, once", func(t *testing.T) {
		// Mounted (as a pod's volume would be): the node refuses, naming
		// the mount; the claim says so; nothing changed, nothing retried.
		mp := t.TempDir()
		require.NoError(t, exec.Command("mount", v.Status.PersistentPath, mp).Run())
		started := time.Now()
		annotate(kube.AnnRestoreFrom + "=nightly")
		st := answered()
		t.Logf("annotated while mounted -> Failed on the claim: %s", time.Since(started).Round(100*time.Millisecond))
		assert.Equal(t, kube.RestoreFailed, st.Phase)
		assert.Contains(t, st.Message, "mounted on "+mp)
		assert.Contains(t, st.Message, "stop the pods that use claim rs-claim")
		evs := eventsOf(t, k, "rs-claim")
		assert.True(t, hasEvent(evs, "RestoreFailed", "mounted on "+mp), reasons(evs))
		b, err := os.ReadFile(filepath.Join(mp, "note"))
		require.NoError(t, err)
		assert.Equal(t, "after", string(b))
		require.NoError(t, exec.Command("umount", mp).Run())
		_ = exec.Command("udevadm", "settle").Run()

		// Unmounted, asked again (the status set empty: removed, it
		// would be written back from the snapshot's record).
		started = time.Now()
		annotate(kube.AnnRestoreStatus + "=")
		for try := 1; ; try++ {
			st = answered()
			// An LVM scan (udev's pvscan after the umount) opens every
			// block device for a moment: the node refuses the restore
			// then, naming it, as it should; the owner asks again.
			if st.Phase != kube.RestoreFailed || try == 5 || !strings.Contains(st.Message, "(lvm)") {
				break
			}
			t.Logf("try %d: %s", try, st.Message)
			time.Sleep(time.Second)
			annotate(kube.AnnRestoreStatus + "=")
		}
		require.Equal(t, kube.RestoreRestored, st.Phase, st.Message)
		t.Logf("annotated -> Restored on the claim: %s", time.Since(started).Round(100*time.Millisecond))
		assert.Equal(t, "nightly", st.From)
		assert.Equal(t, must("", "get", "volumesnapshots.salt-volumes.io", "nightly", "-o", "jsonpath={.status.snapshot}"), st.Snapshot)
		require.NotNil(t, st.FinishedAt)
		assert.Equal(t, "before", note(""), "the snapshot's content")
		after := getJSON(t, p, "rs-data")
		assert.Equal(t, v.Spec.UUID, after.Spec.UUID)
		assert.Equal(t, v.Status.PersistentPath, after.Status.PersistentPath)
		evs = eventsOf(t, k, "rs-claim")
		assert.True(t, hasEvent(evs, "Restoring", "back to VolumeSnapshot nightly"), reasons(evs))
		assert.True(t, hasEvent(evs, "Restored", "volume rs-data put back to VolumeSnapshot nightly"), reasons(evs))

		// Written since: a re-list (serve restarted) restores nothing again.
		note("since")
		p.Stop()
		p.Start(kubeConfig(k))
		time.Sleep(3 * time.Second)
		assert.Equal(t, st, status("nightly", kube.RestoreRestored), "the claim's record is the same")
		assert.Equal(t, "since", note(""), "not restored a second time")

		// The status dropped (as a replace-style GitOps sync does): written
		// back from the snapshot's record, not restored again.
		annotate(kube.AnnRestoreStatus + "-")
		back := status("nightly", kube.RestoreRestored)
		assert.Equal(t, st.Request, back.Request)
		assert.Contains(t, back.Message, "written back from the control plane's record")
		time.Sleep(2 * time.Second)
		assert.Equal(t, "since", note(""), "a dropped status restores nothing")
	})

	t.Run("another namespace's snapshot of the same volume is refused", func(t *testing.T) {
		theirs := must("", "get", "-n", "other", "volumesnapshots.salt-volumes.io", "theirs", "-o", "jsonpath={.status.snapshot}")
		started := time.Now()
		annotate(kube.AnnRestoreFrom + "=" + theirs)
		st := status(theirs, kube.RestoreRefused)
		t.Logf("annotated -> Refused on the claim: %s", time.Since(started).Round(100*time.Millisecond))
		assert.Equal(t, theirs, st.From)
		assert.Contains(t, st.Message, "no VolumeSnapshot "+theirs+" in namespace default")
		eventually(t, 30*time.Second, "RestoreRefused event", func() (bool, string) {
			evs := eventsOf(t, k, "rs-claim")
			return hasEvent(evs, "RestoreRefused", "a claim is restored only from a VolumeSnapshot object of its own namespace"), reasons(evs)
		})
		annotate(kube.AnnRestoreFrom + "=other/theirs")
		st = status("other/theirs", kube.RestoreRefused)
		assert.Contains(t, st.Message, `"other/theirs" is not the name of a VolumeSnapshot`)
		assert.Equal(t, "since", note(""), "nothing changed")
		snap, err := p.Client().Snapshot(ctx, theirs)
		require.NoError(t, err)
		assert.Nil(t, snap.Restore, "nothing was asked of the node")
	})
	t.Logf("TestKubeRestore: %s", time.Since(began).Round(100*time.Millisecond))
}

// eventsOf lists the Events of claim name in namespace default.
func eventsOf(t *testing.T, k *kubecluster.Cluster, name string) []corev1.Event {
	t.Helper()
	evs, err := k.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	require.NoError(t, err)
	return evs.Items
}
