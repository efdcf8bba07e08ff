package kube

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// fakeVolumes records what the controller asks of the reconciler.
type fakeVolumes struct {
	mu          sync.Mutex
	provisioned []string
}

func (f *fakeVolumes) Get(string) (*volume.Volume, error) { return nil, store.ErrNotFound }
func (f *fakeVolumes) Provision(_ context.Context, s *spec.Spec, _ *saltvolumes.Claim) (*volume.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.provisioned = append(f.provisioned, s.Name)
	return &volume.Volume{Spec: *s}, nil
}
func (f *fakeVolumes) Resize(context.Context, string, string) (*volume.Volume, error) {
	return nil, errors.New("no")
}
func (f *fakeVolumes) Touch(string) {}
func (f *fakeVolumes) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.provisioned)
}

// Only the leader acts: a follower provisions no claim, queues none (it
// used to re-queue every claim of the cluster every 2 s) and releases no
// finalizer; on taking over it provisions what is waiting. Stop waits for
// the workers, after which nothing more is provisioned.
func TestOnlyTheLeaderActs(t *testing.T) {
	orphan := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "gone", Finalizers: []string{Finalizer},
		DeletionTimestamp: &metav1.Time{Time: time.Now()},
		Labels:            map[string]string{LabelManagedBy: ManagedBy, LabelUUID: uid}}}
	cs := fake.NewSimpleClientset(testClaim(), testClass(), orphan)
	var leading atomic.Bool
	c := New(cs, Config{Leading: leading.Load}, nil)
	vols := &fakeVolumes{}
	c.SetVolumes(vols)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, c.Start(ctx, 10*time.Second))

	time.Sleep(1500 * time.Millisecond) // a follower's second
	assert.Zero(t, vols.count(), "a follower provisioned a claim")
	assert.Zero(t, c.claims.Len(), "a follower keeps claims queued")
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, "gone", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, pv.Finalizers, Finalizer, "a follower released a PV's finalizer")

	leading.Store(true)
	require.Eventually(t, func() bool { return vols.count() == 1 }, 10*time.Second, 10*time.Millisecond,
		"the new leader did not provision the waiting claim")
	// The orphaned PV is released on its next event, now that we lead.
	pv.Labels["touched"] = "1"
	_, err = cs.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := cs.CoreV1().PersistentVolumes().Get(ctx, "gone", metav1.GetOptions{})
		return err == nil && len(got.Finalizers) == 0
	}, 10*time.Second, 10*time.Millisecond, "the leader did not release the deleted volume's PV")

	c.Stop()
	other := testClaim(func(p *corev1.PersistentVolumeClaim) { p.Name, p.UID = "late", "6b0c6a4e-8a7e-4c57-9a43-1b2f6f3c9d11" })
	_, err = cs.CoreV1().PersistentVolumeClaims("apps").Create(ctx, other, metav1.CreateOptions{})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, 1, vols.count(), "a claim was provisioned after Stop returned")
}

// serve says so when the PVs of operators' volumes share a class with the
// claims it provisions (any claim of the class could bind them), and is
// quiet when they have a class of their own.
func TestWarnsWhenStaticPVsShareAProvisioningClass(t *testing.T) {
	for _, tc := range []struct {
		static string
		warned bool
	}{{"sv", true}, {"salt-volumes-static", false}} {
		var buf syncBuffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		c := New(fake.NewSimpleClientset(testClass()), Config{StorageClass: tc.static}, log)
		c.SetVolumes(&fakeVolumes{})
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, c.Start(ctx, 10*time.Second))
		c.Stop()
		cancel()
		assert.Equal(t, tc.warned, strings.Contains(buf.String(), "any claim of that class, in any namespace, can bind one"), tc.static)
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
