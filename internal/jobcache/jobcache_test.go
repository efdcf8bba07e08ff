package jobcache

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/salt-volumes/salt-volumes/internal/saltapi"
)

// countingAPI stands in for salt-api: it counts the lookups that reach it.
type countingAPI struct {
	saltapi.Jobs
	n atomic.Int64
}

func (c *countingAPI) ListJob(context.Context, string) (saltapi.JobInfo, error) {
	c.n.Add(1)
	return saltapi.JobInfo{Known: true, Function: "from-salt-api"}, nil
}

func writeJob(t *testing.T, o *Overlay, jid string, returns map[string]any) {
	t.Helper()
	dir, err := o.jidDir(jid)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(dir, 0o700))
	load, err := msgpack.Marshal(map[string]any{"jid": jid, "fun": "state.apply", "minions": []string{"node-1"}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".load.p"), load, 0o600))
	for minion, ret := range returns {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, minion), 0o700))
		b, err := msgpack.Marshal(map[string]any{"return": ret, "retcode": 0})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, minion, "return.p"), b, 0o600))
	}
}

// A job the cache on disk does not hold costs salt-api nothing unless this
// control plane published it: a minion's forged returns under made-up jids
// never reach salt-api.
func TestAbsentJobsOfOthersAreNotAskedOfSaltAPI(t *testing.T) {
	api := &countingAPI{}
	mine := map[string]bool{"20261126000000000002": true}
	o := &Overlay{Jobs: api, Dir: t.TempDir(), Published: func(jid string) bool { return mine[jid] }}
	writeJob(t, o, "20261126000000000001", map[string]any{"node-1": map[string]any{"x": true}})

	info, err := o.ListJob(context.Background(), "20261126000000000001")
	require.NoError(t, err)
	assert.True(t, info.Known)
	assert.Equal(t, "state.apply", info.Function)
	assert.Contains(t, info.Returns, "node-1")
	assert.Zero(t, api.n.Load(), "a job on disk was asked of salt-api")

	for range 100 {
		info, err = o.ListJob(context.Background(), "20261126999999999999")
		require.NoError(t, err)
		assert.False(t, info.Known)
	}
	assert.Zero(t, api.n.Load(), "an absent job nobody here published went to salt-api")

	info, err = o.ListJob(context.Background(), "20261126000000000002")
	require.NoError(t, err)
	assert.Equal(t, "from-salt-api", info.Function, "our own job, not on disk yet, is asked of salt-api")
	assert.EqualValues(t, 1, api.n.Load())
}

// A cache it cannot use (here a hash_type it does not know; a file it may
// not read is the same case) still leaves every job to salt-api.
func TestCacheErrorsFallBackToSaltAPI(t *testing.T) {
	api := &countingAPI{}
	o := &Overlay{Jobs: api, Dir: filepath.Join(t.TempDir(), "jobs"), HashType: "nonsense"}
	info, err := o.ListJob(context.Background(), "20261126000000000003")
	require.NoError(t, err)
	assert.Equal(t, "from-salt-api", info.Function)
	assert.EqualValues(t, 1, api.n.Load())
}
