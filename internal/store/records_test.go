package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// recordBackends opens each backend's records as serve does: bbolt and
// etcd beside their volumes, Secrets in the control plane's namespace as
// the user rbac.yaml grants.
func recordBackends() map[string]func(t *testing.T) Records {
	return map[string]func(t *testing.T) Records{
		"bbolt": func(t *testing.T) Records { return backends(t)["bbolt"](t).(Records) },
		"etcd":  func(t *testing.T) Records { return openTestEtcd(t, testPrefix(t)) },
		"kubernetes": func(t *testing.T) Records {
			rc, err := clientcmd.BuildConfigFromFlags("", testKube(t).ControlKubeconfig)
			require.NoError(t, err)
			cs, err := kubernetes.NewForConfig(rc)
			require.NoError(t, err)
			return &KubeRecords{Client: cs, Namespace: "salt-volumes", Timeout: 5 * time.Second}
		},
	}
}

func TestRecordsContract(t *testing.T) {
	for name, open := range recordBackends() {
		t.Run(name, func(t *testing.T) {
			r := open(t)
			ctx := context.Background()
			// Each run its own kind: the Kubernetes namespace outlives a run.
			kind := fmt.Sprintf("t%d", time.Now().UnixNano())
			_, err := r.GetRecord(ctx, kind, "a")
			require.ErrorIs(t, err, ErrNoRecord)
			list, err := r.ListRecords(ctx, kind)
			require.NoError(t, err)
			assert.Empty(t, list)

			require.NoError(t, r.PutRecord(ctx, kind, "b", []byte(`{"n":2}`)))
			require.NoError(t, r.PutRecord(ctx, kind, "a", []byte(`{"n":1}`)))
			require.NoError(t, r.PutRecord(ctx, kind, "a", []byte(`{"n":3}`)), "a put replaces")
			require.NoError(t, r.PutRecord(ctx, kind+"x", "a", []byte(`other kind`)))
			got, err := r.GetRecord(ctx, kind, "a")
			require.NoError(t, err)
			assert.Equal(t, `{"n":3}`, string(got))
			list, err = r.ListRecords(ctx, kind)
			require.NoError(t, err)
			assert.Equal(t, []Record{{Key: "a", Data: []byte(`{"n":3}`)}, {Key: "b", Data: []byte(`{"n":2}`)}}, list, "one kind, by key")

			require.NoError(t, r.DeleteRecord(ctx, kind, "a"))
			require.NoError(t, r.DeleteRecord(ctx, kind, "a"), "deleting twice is fine")
			_, err = r.GetRecord(ctx, kind, "a")
			require.ErrorIs(t, err, ErrNoRecord)
			got, err = r.GetRecord(ctx, kind+"x", "a")
			require.NoError(t, err)
			assert.Equal(t, "other kind", string(got))

			err = r.PutRecord(ctx, kind, "Not/A-Key", nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "lower-case letters")
			require.NoError(t, r.DeleteRecord(ctx, kind, "b"))
			require.NoError(t, r.DeleteRecord(ctx, kind+"x", "a"))
		})
	}
}

// FenceRecords: the leader's records beside Volume objects are written only
// while its still() holds; reads go on.
func TestFenceRecords(t *testing.T) {
	inner := backends(t)["bbolt"](t).(Records)
	ctx := context.Background()
	var deposed error
	r := FenceRecords(inner, func() error { return deposed })
	require.NoError(t, r.PutRecord(ctx, "snapshots", "s1", []byte("leader")))
	deposed = fmt.Errorf("the lease went to replica b")
	assert.ErrorIs(t, r.PutRecord(ctx, "snapshots", "s1", []byte("deposed")), ErrFenced)
	assert.ErrorIs(t, r.DeleteRecord(ctx, "snapshots", "s1"), ErrFenced)
	got, err := r.GetRecord(ctx, "snapshots", "s1")
	require.NoError(t, err)
	assert.Equal(t, "leader", string(got), "nothing written after the term ended")
}
