package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// store migrate as an operator runs it (bbolt to bbolt here; etcd both
// ways is internal/store's TestMigrateRoundTrip): the copy is verified and
// said, a target that holds volumes is refused with exit 1 and left alone,
// bad flags are a usage error.
func TestStoreMigrate(t *testing.T) {
	dir := t.TempDir()
	from, to := filepath.Join(dir, "old.db"), filepath.Join(dir, "new.db")
	st, err := store.Open(from)
	require.NoError(t, err)
	for i := range 3 {
		name := fmt.Sprintf("m-%d", i)
		require.NoError(t, st.Create(context.Background(), &volume.Volume{Spec: spec.Spec{Name: name, UUID: fmt.Sprintf("3f2504e0-4f89-41d3-9a0c-%012d", i), Node: "n",
			SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}, CreatedAt: time.Unix(1, 0).UTC()}))
	}
	// A service token and an audit entry go with the volumes.
	tokens := &access.Tokens{Records: st}
	secret, _, err := tokens.CreateService(context.Background(), "prometheus", access.Viewer, 0, "bootstrap")
	require.NoError(t, err)
	(&access.Audit{Records: st}).Record(context.Background(), access.Entry{User: "alice", Method: "POST", Route: "/api/v1/volumes", Volume: "m-0", Decision: "allowed"})
	require.NoError(t, st.Close())

	migrate := func(args ...string) (int, string, string) {
		var out, errw bytes.Buffer
		code := run(append([]string{"store", "migrate"}, args...), &out, &errw)
		return code, out.String(), errw.String()
	}
	code, out, errs := migrate("--from", "bbolt:"+from, "--to", "bbolt:"+to)
	require.Equal(t, exitOK, code, errs)
	assert.Contains(t, out, "migrated 3 volumes")
	assert.Contains(t, out, "every record the same")
	assert.Contains(t, out, "migrated 2 token and audit records")
	moved, err := store.Open(to)
	require.NoError(t, err)
	p, err := (&access.Tokens{Records: moved}).Check(context.Background(), secret)
	require.NoError(t, err, "the token works on the new store")
	assert.Equal(t, "token:prometheus", p.User)
	trail, err := (&access.Audit{Records: moved}).List(context.Background(), access.Filter{})
	require.NoError(t, err)
	require.Len(t, trail, 1)
	assert.Equal(t, "alice", trail[0].User)
	require.NoError(t, moved.Close())

	code, _, errs = migrate("--from", "bbolt:"+from, "--to", "bbolt:"+to)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errs, "the target already holds 3 volumes")

	code, _, errs = migrate("--from", "bbolt:"+from, "--to", "zfs:/x")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, `--to "zfs:/x": write bbolt:FILE, etcd:URL[,URL...] or kubernetes:KUBECONFIG`)
	code, _, _ = migrate("--from", "bbolt:"+from)
	assert.Equal(t, exitUsage, code)
}
