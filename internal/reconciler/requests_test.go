package reconciler

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// churning is a store in which someone else writes the volume before each
// of our updates lands: every update meets a conflict.
type churning struct {
	store.Store
	updates int
}

func (c *churning) Update(v *volume.Volume) error {
	c.updates++
	cur, err := c.Store.Get(v.Spec.Name)
	if err != nil {
		return err
	}
	return &store.ConflictError{Name: v.Spec.Name, Current: cur}
}

// A request that never gets written is an error, not an accepted request:
// the API must not answer 202 for a deletion nobody recorded.
func TestRequestThatNeverLandsIsAnError(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "volumes.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	v := &volume.Volume{Spec: *sparseSpec("busy")}
	v.Status.Phase = volume.Available
	require.NoError(t, st.Create(v))
	c := &churning{Store: st}
	r := New(c, nil, nil, Options{}, nil)

	_, err = r.Delete("busy", false)
	require.Error(t, err)
	assert.ErrorContains(t, err, "kept changing")
	var ce *store.ConflictError
	assert.ErrorAs(t, err, &ce, "the cause is kept for the API's status mapping")
	assert.Equal(t, 5, c.updates)
	got, err := st.Get("busy")
	require.NoError(t, err)
	assert.False(t, got.DeleteRequested, "nothing was recorded")
}
