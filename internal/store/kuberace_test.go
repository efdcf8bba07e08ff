package store

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// failingWrites fails the status write and the finalizer removal, once
// each: an API server that went away between a create's two steps.
type failingWrites struct {
	dynamic.NamespaceableResourceInterface
	status, update atomic.Bool
}

func (f *failingWrites) UpdateStatus(ctx context.Context, u *unstructured.Unstructured, o metav1.UpdateOptions) (*unstructured.Unstructured, error) {
	if f.status.CompareAndSwap(true, false) {
		return nil, errors.New("connection refused")
	}
	return f.NamespaceableResourceInterface.UpdateStatus(ctx, u, o)
}

func (f *failingWrites) Update(ctx context.Context, u *unstructured.Unstructured, o metav1.UpdateOptions, sub ...string) (*unstructured.Unstructured, error) {
	if f.update.CompareAndSwap(true, false) {
		return nil, errors.New("connection refused")
	}
	return f.NamespaceableResourceInterface.Update(ctx, u, o, sub...)
}

// failingClient hands out failingWrites for the Volume resource.
type failingClient struct {
	dynamic.Interface
	fw *failingWrites
}

func (f failingClient) Resource(schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return f.fw
}

// A create whose status write failed, and whose object could not be let go
// either, leaves an object carrying our finalizer. The cache must hold it
// (it reads as a volume accepted and not started: it was kept out of the
// cache until it next changed or a relist, which this test showed before
// the fix), and a kubectl delete of it finishes once the backend lets it go
// (that part held already: the deletion's own event brought it in).
func TestKubeCreateThatLostItsStatusWrite(t *testing.T) {
	var fw *failingWrites
	s := openTestKubeWith(t, func(d dynamic.Interface) dynamic.Interface {
		fw = &failingWrites{NamespaceableResourceInterface: d.Resource(VolumeResource)}
		return failingClient{d, fw}
	})
	c := testKube(t)
	fw.status.Store(true)
	fw.update.Store(true)

	v := vol("raced")
	require.Error(t, s.Create(context.Background(), v))
	admin := dynamicClient(t, c.AdminKubeconfig).Resource(VolumeResource)
	u, err := admin.Get(context.Background(), "raced", metav1.GetOptions{})
	require.NoError(t, err, "the object should have stayed (its let-go failed)")
	assert.Contains(t, u.GetFinalizers(), Finalizer)

	require.Eventually(t, func() bool { _, err := s.Get("raced"); return err == nil }, 5*time.Second, 20*time.Millisecond,
		"the object is on the API server but not in the cache")

	out, err := c.Kubectl("delete", "volume", "raced", "--wait=false")
	require.NoError(t, err, out)
	var marked *volume.Volume
	require.Eventually(t, func() bool {
		got, err := s.Get("raced")
		marked = got
		return err == nil && got.DeletionMarked
	}, 5*time.Second, 20*time.Millisecond, "the deletion never reached the cache")
	require.NoError(t, s.Delete(context.Background(), marked))
	require.Eventually(t, func() bool {
		_, err := admin.Get(context.Background(), "raced", metav1.GetOptions{})
		return isNotFound(err)
	}, 10*time.Second, 50*time.Millisecond, "the object hangs on our finalizer")
}
