// Package saltapi tests the Go salt-api client against a real salt-api with
// the least-privilege eauth account the control plane uses.
package saltapi

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/jobcache"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var binary string

func TestMain(m *testing.M) { testenv.MainWithExec(m, &binary) }

func TestRealSaltAPI(t *testing.T) {
	s := saltstack.Start(t, binary, true)
	u := uuid.NewString()
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, []string{u}, t.Logf) })
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)

	c, err := saltapi.New(saltapi.Config{URL: s.APIURL(), Username: s.APIUser, Password: s.APIPass, Eauth: "file"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	ids, err := c.Minions(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{s.MinionID}, ids)

	spec := map[string]any{"name": "api-1", "uuid": u, "node": s.MinionID, "sparseLoopDevice": map[string]any{"size": "32Mi"}}
	// With who asked in the job's metadata, as the reconciler sends it.
	md := map[string]any{"salt-volumes": map[string]any{"requestedBy": map[string]any{"api-1": "alice"}}}
	job, err := c.LocalAsync(saltapi.WithMetadata(ctx, md), s.MinionID, "salt_volumes.apply_volume", []any{"prepared", []any{spec}, false}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{s.MinionID}, job.Minions)
	raw, err := c.Runner(ctx, "jobs.list_job", map[string]any{"jid": job.JID})
	require.NoError(t, err)
	var listed struct {
		Metadata map[string]any `json:"Metadata"`
	}
	require.NoError(t, json.Unmarshal(raw, &listed))
	assert.Equal(t, md, listed.Metadata, "the job cache keeps who asked")

	// Poll the job cache here only because this test has no event reader;
	// the control plane learns it from the bus.
	var rets map[string]json.RawMessage
	require.Eventually(t, func() bool {
		var found bool
		rets, found, err = c.LookupJID(ctx, job.JID)
		return err == nil && found && rets[s.MinionID] != nil
	}, time.Minute, 500*time.Millisecond)
	var states map[string]map[string]any
	require.NoError(t, json.Unmarshal(rets[s.MinionID], &states))
	require.Len(t, states, 1)
	for _, st := range states {
		assert.Equal(t, true, st["result"])
		assert.Equal(t, "/dev/disk/by-uuid/"+u, st["volume"].(map[string]any)["persistentPath"])
	}

	// The master's job cache read from disk answers as jobs.list_job does.
	viaAPI, err := c.ListJob(ctx, job.JID)
	require.NoError(t, err)
	local := &jobcache.Overlay{Jobs: testenv.NoSaltAPI{}, Dir: filepath.Join(s.Root, "var", "cache", "salt", "master", "jobs")}
	viaDisk, err := local.ListJob(ctx, job.JID)
	require.NoError(t, err, "read from disk, not passed on to salt-api")
	assert.True(t, viaDisk.Known)
	assert.Equal(t, viaAPI.Function, viaDisk.Function)
	require.Contains(t, viaDisk.Returns, s.MinionID)
	assert.Equal(t, viaAPI.Returns[s.MinionID].Retcode, viaDisk.Returns[s.MinionID].Retcode)
	assert.JSONEq(t, string(viaAPI.Returns[s.MinionID].Return), string(viaDisk.Returns[s.MinionID].Return))
	// A job the cache does not hold: unknown, without salt-api, unless
	// this control plane published it (then salt-api is asked).
	unknown, err := local.ListJob(ctx, "20000101000000000000")
	require.NoError(t, err, "an unknown job nobody here published is not asked of salt-api")
	assert.False(t, unknown.Known)
	local.Published = func(jid string) bool { return jid == "20000101000000000000" }
	_, err = local.ListJob(ctx, "20000101000000000000")
	assert.ErrorContains(t, err, "asked salt-api", "an unknown job of ours goes to salt-api")

	_, found, err := c.LookupJID(ctx, "20000101000000000000")
	require.NoError(t, err)
	assert.False(t, found, "an unknown job id")

	// The ACL allows nothing but the salt_volumes formulas.
	_, err = c.LocalAsync(ctx, s.MinionID, "cmd.run", []any{"id"}, nil)
	var apiErr *saltapi.Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 401, apiErr.Status)
	_, err = c.LocalAsync(ctx, s.MinionID, "state.apply", []any{"other_formula"}, nil)
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 401, apiErr.Status)
	// What a leaked password could do with state.apply or sync_all, whose
	// keyword arguments no ACL entry fully constrains: run other code as
	// root from a local config file or another branch. All refused now.
	evil := filepath.Join(s.Root, "evil-minion.conf")
	require.NoError(t, os.WriteFile(evil, []byte("file_roots: {base: [/tmp]}\n"), 0o644))
	for _, tc := range []struct {
		fun   string
		arg   []any
		kwarg map[string]any
	}{
		{"state.apply", []any{"salt_volumes"}, map[string]any{"localconfig": evil}},
		{"state.apply", []any{"salt_volumes.prepared"}, nil},
		{"state.sls", []any{"salt_volumes"}, map[string]any{"saltenv": "other"}},
		{"saltutil.sync_all", nil, map[string]any{"saltenv": "other"}},
		{"saltutil.sync_all", []any{"other"}, nil},
		{"saltutil.sync_all", nil, nil},
		{"salt_volumes.apply_volumes", []any{"prepared", []any{spec}, false}, nil},
	} {
		_, err = c.LocalAsync(ctx, s.MinionID, tc.fun, tc.arg, tc.kwarg)
		require.ErrorAs(t, err, &apiErr, "%s %v %v", tc.fun, tc.arg, tc.kwarg)
		assert.Equal(t, 401, apiErr.Status, "%s %v %v", tc.fun, tc.arg, tc.kwarg)
	}
	// Our function with a keyword it does not take: the ACL lets the call
	// through, the minion refuses it before anything runs.
	sneaky, err := c.LocalAsync(ctx, s.MinionID, "salt_volumes.apply_volume", []any{"prepared", []any{spec}, false}, map[string]any{"localconfig": evil})
	require.NoError(t, err)
	var refused json.RawMessage
	require.Eventually(t, func() bool {
		r, found, err := c.LookupJID(ctx, sneaky.JID)
		refused = r[s.MinionID]
		return err == nil && found && refused != nil
	}, time.Minute, 500*time.Millisecond)
	assert.Contains(t, string(refused), "localconfig", "refused, naming the keyword")
	assert.NotContains(t, string(refused), "persistentPath", "no state ran")
	// The one sync serve asks for: base.
	synced, err := c.LocalAsync(ctx, s.MinionID, "saltutil.sync_all", []any{"base"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{s.MinionID}, synced.Minions)
	_, err = c.Runner(ctx, "state.orchestrate", map[string]any{"arg": []any{"anything"}})
	require.ErrorAs(t, err, &apiErr)
	// The jobs runner beyond the two look-ups serve makes: list_jobs would
	// enumerate every job on the master, and with lookup_jid read their
	// returns (an administrator's pillar.items, cmd.run output).
	for _, fun := range []string{"jobs.list_jobs", "jobs.print_job", "manage.status"} {
		_, err = c.Runner(ctx, fun, nil)
		require.ErrorAs(t, err, &apiErr, fun)
		assert.Equal(t, 401, apiErr.Status, fun)
	}

	// salt-api forgets sessions when it restarts: one re-login and go on.
	logins := c.Logins
	s.Restart("api")
	require.Eventually(t, func() bool {
		_, err := c.Minions(ctx)
		return err == nil
	}, time.Minute, 500*time.Millisecond)
	assert.Equal(t, logins+1, c.Logins)

	job, err = c.LocalAsync(ctx, s.MinionID, "salt_volumes.apply_volume", []any{"unprepared", []any{spec}, false}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rets, found, err := c.LookupJID(ctx, job.JID)
		return err == nil && found && rets[s.MinionID] != nil
	}, time.Minute, 500*time.Millisecond)
}
