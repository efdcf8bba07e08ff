package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/salt-volumes/salt-volumes/internal/volume"
	"github.com/salt-volumes/salt-volumes/test/kubecluster"
)

var (
	kubeOnce sync.Once
	kubeC    *kubecluster.Cluster
	kubeErr  error
)

// testKube is one real API server (with the Volume resource and the RBAC
// manifest applied) shared by this package's tests.
func testKube(t *testing.T) *kubecluster.Cluster {
	t.Helper()
	kubeOnce.Do(func() {
		tools, err := kubecluster.Tools("../..")
		if err != nil {
			kubeErr = err
			return
		}
		dir, err := os.MkdirTemp("", "store-kube")
		if err != nil {
			kubeErr = err
			return
		}
		kubeC, kubeErr = kubecluster.Start(context.Background(), dir, tools, "../../deploy/kubernetes/rbac.yaml")
		if kubeErr != nil {
			return
		}
		if out, err := kubeC.Kubectl("apply", "-f", "../../deploy/kubernetes/volume-crd.yaml"); err != nil {
			kubeErr = errors.New(out)
			return
		}
		if out, err := kubeC.Kubectl("wait", "--for", "condition=Established", "--timeout", "60s", "crd/volumes.salt-volumes.io"); err != nil {
			kubeErr = errors.New(out)
		}
	})
	require.NoError(t, kubeErr, "the Kubernetes backend tests need kube-apiserver (make setup builds it)")
	return kubeC
}

// dynamicClient is a client as the control plane's user (kubeconfig
// "salt-volumes", which has only what rbac.yaml grants) or as admin.
func dynamicClient(t *testing.T, kubeconfig string) dynamic.Interface {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	dc, err := dynamic.NewForConfig(rc)
	require.NoError(t, err)
	return dc
}

// openTestKube opens the backend as serve would, after clearing every
// Volume object left by an earlier test (the resource is cluster-wide).
func openTestKube(t *testing.T) *Kube { return openTestKubeWith(t, nil) }

// openTestKubeWith is openTestKube with the control plane's client wrapped
// (faults injected) before the backend starts using it.
func openTestKubeWith(t *testing.T, wrap func(dynamic.Interface) dynamic.Interface) *Kube {
	c := testKube(t)
	admin := dynamicClient(t, c.AdminKubeconfig).Resource(VolumeResource)
	ctx := context.Background()
	list, err := admin.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, u := range list.Items {
		u.SetFinalizers(nil)
		_, err := admin.Update(ctx, &u, metav1.UpdateOptions{})
		if err == nil {
			err = admin.Delete(ctx, u.GetName(), metav1.DeleteOptions{})
		}
		require.True(t, err == nil || isNotFound(err), "clearing %s: %v", u.GetName(), err)
	}
	require.Eventually(t, func() bool {
		l, err := admin.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	}, 10*time.Second, 50*time.Millisecond)
	client := dynamicClient(t, c.ControlKubeconfig)
	if wrap != nil {
		client = wrap(client)
	}
	s, err := OpenKube(ctx, KubeConfig{Client: client, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// What kubectl users do, and what two replicas see of each other.
func TestKubeObjects(t *testing.T) {
	s := openTestKube(t)
	c := testKube(t)
	kubectl := func(stdin string, args ...string) string {
		t.Helper()
		if stdin != "" {
			f := filepath.Join(t.TempDir(), "in.yaml")
			require.NoError(t, os.WriteFile(f, []byte(stdin), 0o600))
			args = append(args, "-f", f)
		}
		out, err := c.Kubectl(args...)
		require.NoError(t, err, out)
		return out
	}

	t.Run("an applied Volume is a new volume whose uuid is the object's uid", func(t *testing.T) {
		kubectl("apiVersion: salt-volumes.io/v1alpha1\nkind: Volume\nmetadata:\n  name: applied\nspec:\n  node: node-1\n  sparseLoopDevice: {size: 1Gi}\n", "apply")
		uid := kubectl("", "get", "volume", "applied", "-o", "jsonpath={.metadata.uid}")
		eventually(t, "the watch brings it", func() bool { _, err := s.Get("applied"); return err == nil })
		v, _ := s.Get("applied")
		assert.Equal(t, volume.Unknown, v.Status.Phase, "nothing ran for it yet")
		assert.Equal(t, uid, v.Spec.UUID)
		assert.Equal(t, "Filesystem", v.Spec.Mode, "the API server's default")
		assert.False(t, v.CreatedAt.IsZero())

		v.Status.Phase, v.Status.JobID, v.Status.Step = volume.Pending, "20261124120000000001", "formatting"
		require.NoError(t, s.Update(context.Background(), v))
		assert.Equal(t, []string{Finalizer}, finalizers(t, c, "applied"), "our first write takes the finalizer")
		out := kubectl("", "get", "volumes")
		assert.Regexp(t, `(?m)^applied\s+node-1\s+sparse\s+1Gi\s+Filesystem\s+Pending\s+`, out)
		assert.Equal(t, "False Pending formatting", kubectl("", "get", "volume", "applied", "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].reason} {.status.conditions[?(@.type=="Ready")].message}`))
	})

	t.Run("kubectl delete marks the volume; Delete lets it go", func(t *testing.T) {
		kubectl("", "annotate", "volume", "applied", WipeAnnotation+"=true")
		kubectl("", "delete", "volume", "applied", "--wait=false")
		eventually(t, "the mark reaches the cache", func() bool { v, _ := s.Get("applied"); return v != nil && v.DeleteRequested })
		v, _ := s.Get("applied")
		assert.True(t, v.DeletionMarked)
		assert.True(t, v.Wipe, "the wipe annotation")
		assert.Contains(t, kubectl("", "get", "volume", "applied", "-o", "name"), "volume.salt-volumes.io/applied", "kept while we hold it")
		require.NoError(t, s.Delete(context.Background(), v))
		_, err := s.Get("applied")
		assert.ErrorIs(t, err, ErrNotFound)
		assert.Empty(t, kubectl("", "get", "volume", "applied", "--ignore-not-found", "-o", "name"))
	})

	t.Run("a second replica sees the first one's writes, and a fenced writer stops", func(t *testing.T) {
		b, err := OpenKube(context.Background(), KubeConfig{Client: dynamicClient(t, c.ControlKubeconfig)})
		require.NoError(t, err)
		defer b.Close()
		v := vol("shared")
		require.NoError(t, s.Create(context.Background(), v))
		eventually(t, "b sees a's create", func() bool { got, err := b.Get("shared"); return err == nil && got.Revision == v.Revision })
		got, _ := b.Get("shared")
		got.DeleteRequested = true
		require.NoError(t, b.Update(context.Background(), got))
		eventually(t, "a sees b's update", func() bool { x, _ := s.Get("shared"); return x.DeleteRequested })

		var deposed error
		w := s.Fenced(func() error { return deposed })
		cur, _ := s.Get("shared")
		cur.Status.Message = "by the leader"
		require.NoError(t, w.Update(context.Background(), cur))
		deposed = errors.New("the lease went to replica b")
		cur.Status.Message = "by a deposed leader"
		assert.ErrorIs(t, w.Update(context.Background(), cur), ErrFenced)
		assert.ErrorIs(t, w.Create(context.Background(), vol("late")), ErrFenced)
		assert.ErrorIs(t, w.Delete(context.Background(), cur), ErrFenced)
		require.NoError(t, b.CatchUp(context.Background()))
		x, _ := b.Get("shared")
		assert.Equal(t, "by the leader", x.Status.Message)
		_, err = b.Get("late")
		assert.ErrorIs(t, err, ErrNotFound)
	})

	t.Run("migrating from bbolt into Volume objects and back", func(t *testing.T) {
		src, err := Open(filepath.Join(t.TempDir(), "v.db"))
		require.NoError(t, err)
		defer src.Close()
		for _, n := range []string{"m1", "m2"} {
			v := vol(n)
			v.Status.Phase, v.Status.DevicePath = volume.Available, "/dev/loop9"
			require.NoError(t, src.Create(context.Background(), v))
		}
		dst := openTestKube(t)
		n, err := Migrate(context.Background(), src, dst)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.Contains(t, kubectl("", "get", "volumes"), "Available")
		_, err = Migrate(context.Background(), src, dst)
		assert.ErrorContains(t, err, "already holds 2 volumes")
		// And back out of the objects into a new file: the same records.
		back, err := Open(filepath.Join(t.TempDir(), "back.db"))
		require.NoError(t, err)
		defer back.Close()
		n, err = Migrate(context.Background(), dst, back)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		require.NoError(t, Verify(src, back))
	})
}

func finalizers(t *testing.T, c *kubecluster.Cluster, name string) []string {
	u, err := dynamicClient(t, c.AdminKubeconfig).Resource(VolumeResource).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return u.GetFinalizers()
}

func isNotFound(err error) bool {
	var se interface{ Status() metav1.Status }
	return errors.As(err, &se) && se.Status().Code == 404
}
