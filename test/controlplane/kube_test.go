package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/kube"
	"github.com/salt-volumes/salt-volumes/test/kubecluster"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// kubeEnv is a real Salt stack, a real Kubernetes control plane and serve
// in Kubernetes mode with the identity deploy/kubernetes/rbac.yaml grants.
type kubeEnv struct {
	s     *saltstack.Stack
	k     *kubecluster.Cluster
	p     *plane
	uuids *[]string
}

func startKube(t *testing.T) *kubeEnv {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	tools, err := kubecluster.Tools(s.Repo)
	require.NoError(t, err, "building the Kubernetes binaries (scripts/kube-tools.sh)")
	dir := filepath.Join(s.Root, "kube")
	ctx := context.Background()
	k, err := kubecluster.Start(ctx, dir, tools, filepath.Join(s.Repo, "deploy", "kubernetes", "rbac.yaml"))
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(k.Logs(3000))
		}
		k.Stop()
	})
	require.NoError(t, k.AddNode(ctx, s.MinionID))
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	p := newPlane(t, s)
	p.Start(kubeConfig(k))
	return &kubeEnv{s: s, k: k, p: p, uuids: &uuids}
}

func kubeConfig(k *kubecluster.Cluster) string {
	return fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n", k.ControlKubeconfig)
}

func (e *kubeEnv) pv(t *testing.T, name string) (*corev1.PersistentVolume, error) {
	return e.k.Admin.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
}

// eventually polls (the test's view, not the product's) until ok or the
// limit.
var eventually = testenv.Eventually

func (e *kubeEnv) pvGone(t *testing.T, name string) {
	t.Helper()
	eventually(t, 30*time.Second, "PV "+name+" deleted", func() (bool, string) {
		pv, err := e.pv(t, name)
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("phase %s finalizers %v deleting %v", pv.Status.Phase, pv.Finalizers, pv.DeletionTimestamp != nil)
	})
}

func (e *kubeEnv) create(t *testing.T, name, size string, extra ...string) saltvolumes.View {
	t.Helper()
	out, errs, code := e.p.CLI(append([]string{"create", name, "--node", e.s.MinionID, "--size", size, "--wait", "--timeout", "2m"}, extra...)...)
	require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
	v := getJSON(t, e.p, name)
	*e.uuids = append(*e.uuids, v.Spec.UUID)
	return v
}

func (e *kubeEnv) claim(t *testing.T, name, class, size string, mutate ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	for _, m := range mutate {
		m(pvc)
	}
	got, err := e.k.Admin.CoreV1().PersistentVolumeClaims("default").Create(context.Background(), pvc, metav1.CreateOptions{})
	require.NoError(t, err)
	return got
}

// pod creates a pod using the claims; the scheduler places it (nothing
// runs it: there is no kubelet).
func (e *kubeEnv) pod(t *testing.T, name string, claims map[string]bool) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app"}}}}
	i := 0
	for claim, block := range claims {
		vol := fmt.Sprintf("v%d", i)
		i++
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		if block {
			pod.Spec.Containers[0].VolumeDevices = append(pod.Spec.Containers[0].VolumeDevices, corev1.VolumeDevice{Name: vol, DevicePath: "/dev/" + vol})
		} else {
			pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: vol, MountPath: "/" + vol})
		}
	}
	_, err := e.k.Admin.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{})
	require.NoError(t, err)
}

// deletePod removes a pod at once. A scheduled pod is normally deleted
// once its kubelet confirms the containers stopped; with no kubelet the
// test stands in for it with a zero grace period.
func (e *kubeEnv) deletePod(t *testing.T, name string) {
	zero := int64(0)
	err := e.k.Admin.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	require.NoError(t, err)
	eventually(t, 30*time.Second, "pod "+name+" gone", func() (bool, string) {
		_, err := e.k.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

func (e *kubeEnv) claimEvents(t *testing.T, name string) []corev1.Event {
	evs, err := e.k.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String()})
	require.NoError(t, err)
	return evs.Items
}

func hasEvent(evs []corev1.Event, reason, contains string) bool {
	return slices.ContainsFunc(evs, func(ev corev1.Event) bool {
		return ev.Reason == reason && ev.Source.Component == "salt-volumes" && strings.Contains(ev.Message, contains)
	})
}

// count adds up our events of a reason whose message contains a string
// (the recorder folds repeats into one event with a count).
func count(evs []corev1.Event, reason, contains string) int {
	n := 0
	for _, ev := range evs {
		if ev.Reason == reason && ev.Source.Component == "salt-volumes" && strings.Contains(ev.Message, contains) {
			n += max(int(ev.Count), 1)
		}
	}
	return n
}

func reasons(evs []corev1.Event) string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Source.Component+"/"+ev.Reason+": "+ev.Message)
	}
	return strings.Join(out, "\n")
}

func (e *kubeEnv) storageClass(t *testing.T, name string, params map[string]string) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	del := corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: kube.DefaultProvisioner,
		VolumeBindingMode: &wffc, ReclaimPolicy: &del, Parameters: params}
	_, err := e.k.Admin.StorageV1().StorageClasses().Create(context.Background(), sc, metav1.CreateOptions{})
	require.NoError(t, err)
}

// jobDuration is a job's duration as the master sees it: from its
// salt/job/<jid>/new event to its return event, by their _stamp.
func jobDuration(t *testing.T, bus *saltstack.Listener, jid string) time.Duration {
	t.Helper()
	var begin, end time.Time
	stamp := func(ev saltstack.Event) time.Time {
		s, _ := ev.Data["_stamp"].(string)
		ts, err := time.Parse("2006-01-02T15:04:05.999999-07:00", s)
		require.NoError(t, err, "stamp %q", s)
		return ts
	}
	_, ok := bus.Collect(10*time.Second, func(ev saltstack.Event) bool {
		switch {
		case ev.Tag == "salt/job/"+jid+"/new":
			begin = stamp(ev)
		case strings.HasPrefix(ev.Tag, "salt/job/"+jid+"/ret/"):
			end = stamp(ev)
		}
		return !begin.IsZero() && !end.IsZero()
	})
	require.True(t, ok, "the new and ret events of job %s", jid)
	return end.Sub(begin)
}

// checkUI opens the web UI in headless Chromium and reads the volume's row:
// its PV column, and its delete button disabled with the reason.
func (e *kubeEnv) checkUI(t *testing.T, name, pvText string) {
	t.Helper()
	exe := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1400, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, time.Minute)
	defer cancelT()
	tr := `#volumes tbody tr[data-volume="` + name + `"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(e.p.URL+"/"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", e.p.Token),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible(`#nodes tr[data-node="node-1"]`),
		chromedp.Click(`#nodes tr[data-node="node-1"] a`),
		chromedp.WaitVisible(tr)))
	pv, err := chromedp.Run(ctx, chromedp.Text(tr+" td.pv"))
	require.NoError(t, err)
	assert.Equal(t, pvText, pv)
	disabled, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('`+tr+` button.delete').disabled`))
	require.NoError(t, err)
	assert.True(t, disabled, "the delete button is disabled")
	why, err := chromedp.Run(ctx, chromedp.Text(tr+` .reason[id^="why-"]`))
	require.NoError(t, err)
	assert.Contains(t, why, pvText, "the reason is shown next to it")
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(artifacts(t), "kube-bound.png"), buf, 0o644))
}

// TestKubernetes runs the Kubernetes scenarios against a real
// kube-apiserver, kube-controller-manager and kube-scheduler.
func TestKubernetes(t *testing.T) {
	e := startKube(t)
	ctx := context.Background()
	// The class as the guide makes it: salt-volumes storageclass | kubectl apply -f -
	sc, errs, code := e.p.CLI("storageclass")
	require.Equal(t, 0, code, errs)
	scFile := filepath.Join(e.s.Root, "storageclass.yaml")
	require.NoError(t, os.WriteFile(scFile, []byte(sc), 0o600))
	out, err := e.k.Kubectl("apply", "-f", scFile)
	require.NoError(t, err, out)

	t.Run("publish and unpublish", func(t *testing.T) {
		_, errs, code := e.p.CLI("create", "kv-bad", "--node", e.s.MinionID, "--size", "64Mi", "--label", "salt-volumes.io/uuid=x")
		assert.Equal(t, 2, code)
		assert.Contains(t, errs, `template.metadata.labels["salt-volumes.io/uuid"]`, "a template may not set the labels that decide which PVs are ours")
		v := e.create(t, "kv-pub", "64Mi", "--label", "tier=gold", "--annotation", "example.com/owner=storage team")
		require.NotNil(t, v.Status.PersistentVolume, "an Available volume has its PV")
		assert.Equal(t, "Available", v.Status.PersistentVolume.Phase)
		pv, err := e.pv(t, "kv-pub")
		require.NoError(t, err)
		assert.Equal(t, "/dev/disk/by-uuid/"+v.Spec.UUID, pv.Spec.Local.Path)
		assert.Equal(t, "ext4", *pv.Spec.Local.FSType)
		assert.Equal(t, v.Status.Size, pv.Spec.Capacity.Storage().Value(), "capacity is the device's real size")
		assert.Equal(t, corev1.PersistentVolumeFilesystem, *pv.Spec.VolumeMode)
		assert.Equal(t, kube.DefaultStaticClass, pv.Spec.StorageClassName, "a class of its own by default: no claim of the provisioning class binds it")
		assert.Equal(t, corev1.PersistentVolumeReclaimRetain, pv.Spec.PersistentVolumeReclaimPolicy)
		assert.Contains(t, pv.Finalizers, kube.Finalizer)
		assert.Equal(t, v.Spec.UUID, pv.Labels[kube.LabelUUID])
		assert.Equal(t, "gold", pv.Labels["tier"], "the PV carries the volume's template")
		assert.Equal(t, "storage team", pv.Annotations["example.com/owner"])
		sel, err := e.k.Admin.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{LabelSelector: "tier=gold"})
		require.NoError(t, err)
		require.Len(t, sel.Items, 1, "a label selector finds it")
		req := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0]
		assert.Equal(t, corev1.LabelHostname, req.Key)
		assert.Equal(t, []string{"node-1"}, req.Values)
		out, _, code = e.p.CLI("get", "kv-pub")
		require.Equal(t, 0, code)
		assert.Regexp(t, `(?m)^kv-pub\s.*\sAvailable\s+Available\s`, out, "the CLI shows the PV's phase")

		out, errs, code := e.p.CLI("rm", "kv-pub", "--wait", "--timeout", "1m")
		require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
		e.pvGone(t, "kv-pub")
		_, err = os.Stat(filepath.Join(e.s.StateDir, "sparse", v.Spec.UUID))
		assert.True(t, os.IsNotExist(err), "the sparse file is gone: %v", err)
	})

	t.Run("deletion refused while Bound, allowed once Released", func(t *testing.T) {
		v := e.create(t, "kv-bound", "64Mi")
		e.claim(t, "c-bound", kube.DefaultStaticClass, "32Mi", func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "kv-bound" })
		eventually(t, 30*time.Second, "claim bound and seen by salt-volumes", func() (bool, string) {
			got := getJSON(t, e.p, "kv-bound")
			pv := got.Status.PersistentVolume
			return pv != nil && pv.Phase == "Bound" && !got.Deletable, fmt.Sprintf("%+v deletable=%v", pv, got.Deletable)
		})
		got := getJSON(t, e.p, "kv-bound")
		assert.Equal(t, "default/c-bound", got.Status.PersistentVolume.Claim)
		assert.Contains(t, got.DeleteBlockedReason, "Bound to default/c-bound", "the UI disables the button with this reason")
		out, _, _ := e.p.CLI("get", "kv-bound")
		assert.Contains(t, out, "Bound:default/c-bound", "the CLI shows the claim")
		e.checkUI(t, "kv-bound", "Bound to default/c-bound")
		_, errs, code := e.p.CLI("rm", "kv-bound")
		assert.Equal(t, 3, code, "rm of a volume whose PV is Bound is refused (exit 3): %s", errs)
		assert.Contains(t, errs, "Bound to default/c-bound")
		_, err := os.Stat(filepath.Join(e.s.StateDir, "sparse", v.Spec.UUID))
		require.NoError(t, err, "refused: the data is still there")
		_, err = e.pv(t, "kv-bound")
		require.NoError(t, err, "refused: the PV is still there")

		// Growing it through the CLI: the PV's capacity follows, and the
		// bound claim's (no kubelet here: that is salt-volumes' doing).
		out, errs, code = e.p.CLI("resize", "kv-bound", "--size", "96Mi", "--wait", "--timeout", "1m")
		require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
		eventually(t, 30*time.Second, "PV and claim at 96Mi", func() (bool, string) {
			pv, err := e.pv(t, "kv-bound")
			if err != nil {
				return false, err.Error()
			}
			pvc, err := e.k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "c-bound", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got := pv.Spec.Capacity.Storage().String() + " " + pvc.Status.Capacity.Storage().String()
			return got == "96Mi 96Mi", got
		})
		grown := getJSON(t, e.p, "kv-bound")
		assert.Equal(t, int64(96<<20), grown.Status.Size)
		assert.Equal(t, saltvolumes.Available, grown.Status.Phase)
		eventually(t, 10*time.Second, "the claim's VolumeResizeSuccessful event", func() (bool, string) {
			evs := e.claimEvents(t, "c-bound")
			return hasEvent(evs, "VolumeResizeSuccessful", "kv-bound grown to 96Mi"), reasons(evs)
		})

		require.NoError(t, e.k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "c-bound", metav1.DeleteOptions{}))
		eventually(t, 30*time.Second, "PV Released", func() (bool, string) {
			got := getJSON(t, e.p, "kv-bound")
			pv := got.Status.PersistentVolume
			return pv != nil && pv.Phase == "Released" && got.Deletable, fmt.Sprintf("%+v", pv)
		})
		out, errs, code = e.p.CLI("rm", "kv-bound", "--wait", "--timeout", "1m")
		require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
		e.pvGone(t, "kv-bound")
		_, err = os.Stat(filepath.Join(e.s.StateDir, "sparse", v.Spec.UUID))
		assert.True(t, os.IsNotExist(err), "the sparse file is gone")
	})

	t.Run("PV deleted out of band", func(t *testing.T) {
		e.create(t, "kv-oob", "64Mi")
		out, err := e.k.Kubectl("delete", "pv", "kv-oob", "--wait=false")
		require.NoError(t, err, out)
		eventually(t, 30*time.Second, "volume Failed", func() (bool, string) {
			got := getJSON(t, e.p, "kv-oob")
			return got.Status.Phase == saltvolumes.Failed && got.Status.Reason == "PersistentVolumeDeleted", got.Status.Phase.String() + " " + got.Status.Reason
		})
		got := getJSON(t, e.p, "kv-oob")
		assert.Contains(t, got.Status.Message, "salt-volumes rm kv-oob")
		assert.True(t, got.Deletable)
		out, errs, code := e.p.CLI("rm", "kv-oob", "--wait", "--timeout", "1m")
		require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
		e.pvGone(t, "kv-oob")
	})

	t.Run("a PV removed for good is recreated", func(t *testing.T) {
		v := e.create(t, "kv-gone", "64Mi")
		pv, err := e.pv(t, "kv-gone")
		require.NoError(t, err)
		// While serve is down, someone deletes the PV and strips its
		// finalizers: it is gone for good. It never had a claim, so
		// salt-volumes publishes it again when it comes back. (With serve
		// up, the PV is seen Terminating first and the volume fails: the
		// previous subtest.)
		e.p.Stop()
		require.NoError(t, e.k.Admin.CoreV1().PersistentVolumes().Delete(ctx, "kv-gone", metav1.DeleteOptions{}))
		eventually(t, 30*time.Second, "PV gone", func() (bool, string) {
			cur, err := e.pv(t, "kv-gone")
			if apierrors.IsNotFound(err) {
				return true, ""
			}
			if err == nil && len(cur.Finalizers) > 0 {
				cur.Finalizers = nil
				_, err = e.k.Admin.CoreV1().PersistentVolumes().Update(ctx, cur, metav1.UpdateOptions{})
			}
			return false, fmt.Sprint(err)
		})
		e.p.Start(kubeConfig(e.k))
		eventually(t, 30*time.Second, "PV recreated", func() (bool, string) {
			again, err := e.pv(t, "kv-gone")
			if err != nil {
				return false, err.Error()
			}
			return again.UID != pv.UID && again.Labels[kube.LabelUUID] == v.Spec.UUID, string(again.UID)
		})
		assert.Equal(t, saltvolumes.Available, getJSON(t, e.p, "kv-gone").Status.Phase)
		out, errs, code := e.p.CLI("rm", "kv-gone", "--wait", "--timeout", "1m")
		require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
		e.pvGone(t, "kv-gone")
	})

	t.Run("an older serve's PVs in the provisioning class move to the static one at start, unless Bound", func(t *testing.T) {
		// serve as it was before #48: the PVs of volumes made with the
		// CLI went into salt-volumes, the class claims are provisioned
		// from, and any claim of it naming one bound it.
		e.p.Stop()
		e.p.Start(kubeConfig(e.k) + "  storageClass: salt-volumes\n")
		e.create(t, "kv-old", "64Mi")
		e.create(t, "kv-old-bound", "64Mi")
		e.claim(t, "c-old", "salt-volumes", "32Mi", func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "kv-old-bound" })
		eventually(t, 30*time.Second, "the claim of the provisioning class naming it bound it", func() (bool, string) {
			pv, err := e.pv(t, "kv-old-bound")
			if err != nil {
				return false, err.Error()
			}
			return pv.Status.Phase == corev1.VolumeBound, string(pv.Status.Phase)
		})
		old, err := e.pv(t, "kv-old")
		require.NoError(t, err)
		require.Equal(t, "salt-volumes", old.Spec.StorageClassName)

		// The upgrade: serve with its default configuration.
		e.p.Stop()
		e.p.Start(kubeConfig(e.k))
		eventually(t, 30*time.Second, "the unclaimed PV moved to "+kube.DefaultStaticClass, func() (bool, string) {
			pv, err := e.pv(t, "kv-old")
			if err != nil {
				return false, err.Error()
			}
			return pv.Spec.StorageClassName == kube.DefaultStaticClass, pv.Spec.StorageClassName
		})
		moved, err := e.pv(t, "kv-old")
		require.NoError(t, err)
		assert.Equal(t, old.UID, moved.UID, "the same PV, its class changed")
		assert.Equal(t, corev1.VolumeAvailable, moved.Status.Phase)
		eventually(t, 10*time.Second, "the Bound one reported", func() (bool, string) {
			return strings.Contains(e.p.LogText(), "stays in its class while a claim holds it"), ""
		})
		kept, err := e.pv(t, "kv-old-bound")
		require.NoError(t, err)
		assert.Equal(t, "salt-volumes", kept.Spec.StorageClassName, "a Bound PV keeps its class")
		assert.Equal(t, corev1.VolumeBound, kept.Status.Phase)

		require.NoError(t, e.k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "c-old", metav1.DeleteOptions{}))
		eventually(t, 30*time.Second, "PV Released", func() (bool, string) {
			got := getJSON(t, e.p, "kv-old-bound")
			pv := got.Status.PersistentVolume
			return pv != nil && pv.Phase == "Released" && got.Deletable, fmt.Sprintf("%+v", pv)
		})
		for _, n := range []string{"kv-old", "kv-old-bound"} {
			out, errs, code := e.p.CLI("rm", n, "--wait", "--timeout", "1m")
			require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
			e.pvGone(t, n)
		}
	})

	t.Run("killed between PV create and Available converges", func(t *testing.T) {
		e.p.Stop()
		e.p.Env = []string{failpoint.CrashEnv + "=pv-created"}
		e.p.Start(kubeConfig(e.k))
		out, errs, code := e.p.CLI("create", "kv-crash", "--node", "node-1", "--size", "64Mi")
		require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
		done := make(chan error, 1)
		go func() { done <- e.p.Cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatal("serve did not crash after creating the PV")
		}
		e.p.Cmd = nil
		e.p.LogFile.Close()
		pv, err := e.pv(t, "kv-crash")
		require.NoError(t, err, "the PV was created before the crash")
		e.p.Env = nil
		e.p.Start(kubeConfig(e.k))
		v := e.p.Watch("kv-crash").Until(t, time.Minute, phaseIs("Available"))
		last := v[len(v)-1].Volume
		*e.uuids = append(*e.uuids, last.Spec.UUID)
		require.NotNil(t, last.Status.PersistentVolume)
		again, err := e.pv(t, "kv-crash")
		require.NoError(t, err)
		assert.Equal(t, pv.UID, again.UID, "the PV made before the crash is the volume's: not duplicated, not replaced")
		out, errs, code = e.p.CLI("rm", "kv-crash", "--wait", "--timeout", "1m")
		require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
		e.pvGone(t, "kv-crash")
	})

	t.Run("dynamic provisioning to Bound, and deletion with the claim", func(t *testing.T) {
		// Salt's own subscriber times the job as the master sees it.
		bus := e.s.Listen()
		start := time.Now()
		fsClaim := e.claim(t, "c-dyn-fs", "salt-volumes", "100Mi")
		blockClaim := e.claim(t, "c-dyn-block", "salt-volumes", "10Mi", func(c *corev1.PersistentVolumeClaim) {
			m := corev1.PersistentVolumeBlock
			c.Spec.VolumeMode = &m
		})
		e.pod(t, "app", map[string]bool{"c-dyn-fs": false, "c-dyn-block": true})
		bound := map[string]time.Duration{}
		eventually(t, 2*time.Minute, "both claims Bound", func() (bool, string) {
			var states []string
			for _, n := range []string{"c-dyn-fs", "c-dyn-block"} {
				c, err := e.k.Admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					return false, err.Error()
				}
				if _, seen := bound[n]; !seen && c.Status.Phase == corev1.ClaimBound {
					bound[n] = time.Since(start)
				}
				states = append(states, n+"="+string(c.Status.Phase))
			}
			return len(bound) == 2, strings.Join(states, " ")
		})
		pod, err := e.k.Admin.CoreV1().Pods("default").Get(ctx, "app", metav1.GetOptions{})
		require.NoError(t, err)
		eventually(t, 30*time.Second, "pod scheduled", func() (bool, string) {
			pod, err = e.k.Admin.CoreV1().Pods("default").Get(ctx, "app", metav1.GetOptions{})
			return err == nil && pod.Spec.NodeName != "", fmt.Sprint(err)
		})
		assert.Equal(t, "node-1", pod.Spec.NodeName, "the scheduler bound the pod to the node of its volumes")

		for claim, want := range map[*corev1.PersistentVolumeClaim]int64{fsClaim: 100 << 20, blockClaim: 10 << 20} {
			name := "pvc-" + string(claim.UID)
			v := getJSON(t, e.p, name)
			*e.uuids = append(*e.uuids, v.Spec.UUID)
			assert.Equal(t, saltvolumes.Available, v.Status.Phase)
			require.NotNil(t, v.Claim)
			assert.Equal(t, claim.Name, v.Claim.Name)
			assert.GreaterOrEqual(t, v.Status.Size, want, "%s: the usable size is at least the request", claim.Name)
			pv, err := e.pv(t, name)
			require.NoError(t, err)
			assert.Equal(t, kube.DefaultProvisioner, pv.Annotations["pv.kubernetes.io/provisioned-by"])
			assert.Equal(t, corev1.PersistentVolumeReclaimDelete, pv.Spec.PersistentVolumeReclaimPolicy)
			assert.Equal(t, claim.Name, pv.Spec.ClaimRef.Name)
			assert.GreaterOrEqual(t, pv.Spec.Capacity.Storage().Value(), want)
			// Events are recorded asynchronously (client-go's broadcaster):
			// the claim can be Bound a moment before its last one lands.
			eventually(t, 10*time.Second, "the claim's provisioning events", func() (bool, string) {
				evs := e.claimEvents(t, claim.Name)
				return hasEvent(evs, "Provisioning", name) && hasEvent(evs, "ProvisioningSucceeded", name), reasons(evs)
			})
			if claim == fsClaim {
				job := jobDuration(t, bus, v.Status.JobID)
				t.Logf("metric pvc_created_to_bound_ms %d", bound[claim.Name].Milliseconds())
				t.Logf("metric salt_job_duration_ms %d (job %s: its new and ret events on the master bus)", job.Milliseconds(), v.Status.JobID)
			}
		}

		// Deleting the claim (pod first) reclaims the volume on the node:
		// the class says Delete.
		e.deletePod(t, "app")
		fsName := "pvc-" + string(fsClaim.UID)
		fsUUID := getJSON(t, e.p, fsName).Spec.UUID
		require.NoError(t, e.k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "c-dyn-fs", metav1.DeleteOptions{}))
		e.pvGone(t, fsName)
		eventually(t, time.Minute, "volume gone from the control plane", func() (bool, string) {
			_, errs, code := e.p.CLI("get", fsName)
			return code != 0, errs
		})
		_, err = os.Stat(filepath.Join(e.s.StateDir, "sparse", fsUUID))
		assert.True(t, os.IsNotExist(err), "the sparse file is deleted on the node")
		_, err = os.Stat(filepath.Join(e.s.StateDir, "volumes", fsUUID+".json"))
		assert.True(t, os.IsNotExist(err), "the node's record is gone")
		// The Block one stays while its claim does.
		assert.Equal(t, saltvolumes.Available, getJSON(t, e.p, "pvc-"+string(blockClaim.UID)).Status.Phase)
	})

	t.Run("provisioning failures show as Events on the claim", func(t *testing.T) {
		e.storageClass(t, "sv-typo", map[string]string{"fstype": "xfs"})
		// -I 100 passes the option allow-list (a number) but mkfs.ext4
		// refuses it on the node: a failure only the Salt job can report.
		e.storageClass(t, "sv-badmkfs", map[string]string{"mkfsOptions": "-I 100"})
		typo := e.claim(t, "c-typo", "sv-typo", "64Mi")
		bad := e.claim(t, "c-badmkfs", "sv-badmkfs", "64Mi")
		e.pod(t, "app2", map[string]bool{"c-typo": false})
		e.pod(t, "app3", map[string]bool{"c-badmkfs": false})
		eventually(t, time.Minute, "Warning on the claim with a typo", func() (bool, string) {
			evs := e.claimEvents(t, "c-typo")
			return hasEvent(evs, "ProvisioningFailed", "unknown parameter(s) fstype"), reasons(evs)
		})
		_, _, code := e.p.CLI("get", "pvc-"+string(typo.UID))
		assert.NotEqual(t, 0, code, "nothing was created for a claim refused up front")
		eventually(t, 2*time.Minute, "Warning on the claim whose mkfs failed on the node", func() (bool, string) {
			evs := e.claimEvents(t, "c-badmkfs")
			return hasEvent(evs, "ProvisioningFailed", "PrepareFailed"), reasons(evs)
		})
		v := getJSON(t, e.p, "pvc-"+string(bad.UID))
		*e.uuids = append(*e.uuids, v.Spec.UUID)
		assert.Equal(t, saltvolumes.Failed, v.Status.Phase)
		// The claim goes: its failed volume is cleaned up (class: Delete).
		e.deletePod(t, "app3")
		require.NoError(t, e.k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "c-badmkfs", metav1.DeleteOptions{}))
		eventually(t, time.Minute, "failed volume deleted with its claim", func() (bool, string) {
			_, errs, code := e.p.CLI("get", "pvc-"+string(bad.UID))
			return code != 0, errs
		})
	})

	t.Run("a claim its node cannot hold goes back to the scheduler", func(t *testing.T) {
		huge := e.claim(t, "c-huge", "salt-volumes", "100Ti")
		name := "pvc-" + string(huge.UID)
		*e.uuids = append(*e.uuids, string(huge.UID))
		e.pod(t, "app4", map[string]bool{"c-huge": false})
		// node-1 refuses the size; the failed volume is deleted and the
		// claim's selected node removed; the scheduler places the pod
		// again (node-1 is the only node) and a new volume is tried.
		eventually(t, 2*time.Minute, "two refused attempts, the claim rescheduled after each", func() (bool, string) {
			evs := e.claimEvents(t, "c-huge")
			return count(evs, "Provisioning", name) >= 2 && count(evs, "Rescheduling", name) >= 2, reasons(evs)
		})
		evs := e.claimEvents(t, "c-huge")
		assert.True(t, hasEvent(evs, "ProvisioningFailed", "larger than the whole filesystem"), reasons(evs))

		// The claim goes: whatever attempt is under way, nothing is left.
		e.deletePod(t, "app4")
		require.NoError(t, e.k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "c-huge", metav1.DeleteOptions{}))
		eventually(t, time.Minute, "no volume left for the deleted claim", func() (bool, string) {
			_, errs, code := e.p.CLI("get", name)
			return code != 0, errs
		})
		_, err := os.Stat(filepath.Join(e.s.StateDir, "volumes", string(huge.UID)+".json"))
		assert.True(t, os.IsNotExist(err), "no record on the node")
	})

	t.Run("Kubernetes tokens: the REST API asks RBAC, as kubectl does", func(t *testing.T) {
		// Two service accounts: one may read Volumes, one may also create
		// and delete them; neither has the custom verb admin.
		manifest := filepath.Join(e.s.Root, "volume-users.yaml")
		require.NoError(t, os.WriteFile(manifest, []byte(volumeUsers), 0o600))
		out, err := e.k.Kubectl("apply", "-f", manifest)
		require.NoError(t, err, out)
		token := func(sa string) string {
			out, err := e.k.Kubectl("create", "token", sa, "-n", "default", "--duration", "1h", "--audience", "salt-volumes")
			require.NoError(t, err, out)
			return strings.TrimSpace(out)
		}
		reader := &client.Client{URL: e.p.URL, Token: token("volume-reader")}
		writer := &client.Client{URL: e.p.URL, Token: token("volume-writer")}
		forbidden := func(err error) string {
			t.Helper()
			var ce *client.Error
			require.ErrorAs(t, err, &ce)
			require.Equal(t, 403, ce.Status, ce.Error())
			return ce.Error()
		}
		p, err := reader.WhoAmI(ctx)
		require.NoError(t, err)
		assert.Equal(t, "k8s:system:serviceaccount:default:volume-reader", p.User)
		assert.Equal(t, "kubernetes", p.Kind)
		_, err = reader.List(ctx, "")
		require.NoError(t, err, "list volumes is granted")
		_, err = reader.Create(ctx, map[string]any{"name": "k8s-r", "node": e.s.MinionID, "sparseLoopDevice": map[string]any{"size": "16Mi"}})
		msg := forbidden(err)
		assert.Contains(t, msg, "k8s:system:serviceaccount:default:volume-reader may not create volumes.salt-volumes.io: Kubernetes RBAC does not allow it")

		v, err := writer.Create(ctx, map[string]any{"name": "k8s-w", "node": e.s.MinionID, "sparseLoopDevice": map[string]any{"size": "16Mi"}})
		require.NoError(t, err, "create volumes is granted")
		*e.uuids = append(*e.uuids, v.Spec.UUID)
		_, errs, code := e.p.CLI("wait", "k8s-w", "--for", "Available", "--timeout", "2m")
		require.Equal(t, 0, code, errs)
		// Its PV goes Pending -> Available by the PV controller a moment
		// later; until then a deletion is refused (CI saw it once).
		require.Eventually(t, func() bool {
			got, err := e.p.Client().Get(ctx, "k8s-w")
			return err == nil && got.Status.PersistentVolume != nil && got.Status.PersistentVolume.Phase == "Available"
		}, time.Minute, 50*time.Millisecond, "its PV Available")
		_, err = reader.Delete(ctx, "k8s-w", false)
		assert.Contains(t, forbidden(err), "may not delete volumes.salt-volumes.io k8s-w")
		// A snapshot is a create on the volume's snapshots subresource,
		// its deletion a delete of volumesnapshots: neither is granted.
		_, err = reader.TakeSnapshot(ctx, "k8s-w", "k8s-s")
		assert.Contains(t, forbidden(err), "may not create volumes.salt-volumes.io/snapshots k8s-w")
		_, err = writer.DeleteSnapshot(ctx, "k8s-s")
		assert.Contains(t, forbidden(err), "may not delete volumesnapshots.salt-volumes.io k8s-s")
		_, err = writer.Delete(ctx, "k8s-w", true)
		assert.Contains(t, forbidden(err), "may not admin volumes.salt-volumes.io k8s-w", "a wipe needs the verb admin")
		_, err = writer.Delete(ctx, "k8s-w", false)
		require.NoError(t, err)
		_, errs, code = e.p.CLI("wait", "k8s-w", "--for", "Deleted", "--timeout", "2m")
		require.Equal(t, 0, code, errs)

		bogus := &client.Client{URL: e.p.URL, Token: "not-a-kubernetes-token"}
		_, err = bogus.List(ctx, "")
		var ce *client.Error
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, 401, ce.Status)
		// A token made for the API server (any pod's, a kubeconfig's) is
		// not taken: only those made for serve's audience.
		out, err = e.k.Kubectl("create", "token", "volume-writer", "-n", "default", "--duration", "1h")
		require.NoError(t, err, out)
		_, err = (&client.Client{URL: e.p.URL, Token: strings.TrimSpace(out)}).List(ctx, "")
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, 401, ce.Status)
		assert.Contains(t, ce.Error(), "kubectl create token SERVICEACCOUNT --audience salt-volumes")

		out, errs, code = e.p.CLI("audit", "--user", "k8s:system:serviceaccount:default:volume-reader", "-o", "json")
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, `"decision": "refused"`)
		assert.Contains(t, out, `"volume": "k8s-r"`)
	})

	t.Run("serve's stderr is one format, client-go's lines included", func(t *testing.T) {
		c := e.p.OneLogFormat(t)
		t.Logf("logged by component: %v", c)
		assert.NotZero(t, c["kubernetes"], "the controller logged nothing: %v", c)
	})
}

// volumeUsers are two service accounts with Volume rights of their own.
const volumeUsers = `apiVersion: v1
kind: ServiceAccount
metadata: {name: volume-reader, namespace: default}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: volume-writer, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: volume-reader}
rules:
  - apiGroups: [salt-volumes.io]
    resources: [volumes]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: volume-writer}
rules:
  - apiGroups: [salt-volumes.io]
    resources: [volumes]
    verbs: [get, list, watch, create, delete, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: volume-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: volume-reader}
subjects: [{kind: ServiceAccount, name: volume-reader, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: volume-writer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: volume-writer}
subjects: [{kind: ServiceAccount, name: volume-writer, namespace: default}]
`
