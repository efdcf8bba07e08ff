package requests

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

func sparse(t *testing.T, name, size string) *spec.Spec {
	t.Helper()
	u := uuid.NewSHA1(uuid.NameSpaceOID, []byte(name))
	s, err := spec.Parse(strings.NewReader(fmt.Sprintf(`{"name":%q,"uuid":%q,"node":"node-1","sparseLoopDevice":{"size":%q}}`, name, u, size)))
	require.NoError(t, err)
	return s
}

func open(t *testing.T) *store.Bolt {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "volumes.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// available stores a prepared volume as the reconciler leaves it.
func available(t *testing.T, st store.Store, name, size string) {
	t.Helper()
	v := &volume.Volume{Spec: *sparse(t, name, size)}
	v.Status.Phase = volume.Available
	v.Status.PreparedSize = v.Spec.Bytes()
	require.NoError(t, st.Create(context.Background(), v))
}

// churning is a store in which someone else writes the volume before each
// of our updates lands: every update meets a conflict.
type churning struct {
	store.Store
	updates int
}

func (c *churning) Update(_ context.Context, v *volume.Volume) error {
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
	st := open(t)
	available(t, st, "busy", "1Gi")
	c := &churning{Store: st}
	_, err := New(c, 0).Delete(context.Background(), "busy", false)
	require.Error(t, err)
	assert.ErrorContains(t, err, "kept changing")
	var ce *store.ConflictError
	assert.ErrorAs(t, err, &ce, "the cause is kept for the API's status mapping")
	assert.Equal(t, 5, c.updates)
	got, err := st.Get("busy")
	require.NoError(t, err)
	assert.False(t, got.DeleteRequested, "nothing was recorded")
}

// Every refusal names the field or the reason and changes nothing in the
// store; what is accepted is written as a request only.
func TestRequestsRefuseWithoutWriting(t *testing.T) {
	st := open(t)
	s := New(st, 2)
	available(t, st, "data", "1Gi")
	before, err := st.Get("data")
	require.NoError(t, err)

	var re *ResizeError
	_, err = s.Resize(context.Background(), "data", "512Mi")
	require.ErrorAs(t, err, &re)
	assert.Equal(t, "size", re.Field)
	assert.Contains(t, re.Reason, "shrinking is refused")
	_, err = s.Resize(context.Background(), "data", "lots")
	require.ErrorAs(t, err, &re)
	assert.Equal(t, "size", re.Field)
	_, err = s.Resize(context.Background(), "data", "")
	require.ErrorAs(t, err, &re)
	assert.Contains(t, re.Reason, "missing")

	var de *DeleteError
	_, err = s.Forget(context.Background(), "data")
	require.ErrorAs(t, err, &de)
	assert.Contains(t, de.Reason, "only a Failed volume can be forgotten")

	var ne *NodeForgetError
	_, err = s.ForgetNode(context.Background(), "node-2", []string{"data", "nothing"})
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, []string{"data", "nothing"}, ne.Missing)

	after, err := st.Get("data")
	require.NoError(t, err)
	assert.Equal(t, before.Revision, after.Revision, "a refused request wrote nothing")

	// The limit: one more fits, the next is refused and counted.
	_, err = s.Create(context.Background(), sparse(t, "second", "1Gi"))
	require.NoError(t, err)
	var le *LimitError
	_, err = s.Create(context.Background(), sparse(t, "third", "1Gi"))
	require.ErrorAs(t, err, &le)
	assert.Equal(t, int64(1), s.Refused.API.Value())
	_, err = st.Get("third")
	assert.True(t, errors.Is(err, store.ErrNotFound))
}

// A growth is recorded as the volume's new spec and a Pending status that
// the reconciler's prepare run picks up; asking again for the same size is
// accepted, for another size refused until the growth is done.
func TestResizeRecordsTheGrowth(t *testing.T) {
	st := open(t)
	s := New(st, 0)
	available(t, st, "data", "1Gi")
	v, err := s.Resize(context.Background(), "data", "2Gi")
	require.NoError(t, err)
	assert.Equal(t, int64(2<<30), v.Spec.Bytes())
	assert.Equal(t, volume.Pending, v.Status.Phase)
	assert.Equal(t, volume.ReasonResizing, v.Status.Reason)
	assert.True(t, volume.GrowthAsked(v))
	got, err := st.Get("data")
	require.NoError(t, err)
	assert.Equal(t, v.Revision, got.Revision)

	_, err = s.Resize(context.Background(), "data", "2Gi")
	require.NoError(t, err, "the same growth asked again")
	_, err = s.Resize(context.Background(), "data", "3Gi")
	var re *ResizeError
	require.ErrorAs(t, err, &re, "growing while the last growth runs")
	assert.True(t, re.Conflict)
}
