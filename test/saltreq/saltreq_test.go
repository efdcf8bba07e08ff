// Package saltreq tests the client of the master's request server against a
// real salt-master with the control plane's least-privilege eauth account.
package saltreq

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/jobcache"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/saltreq"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

var binary string

func TestMain(m *testing.M) { testenv.MainWithExec(m, &binary) }

// tokenLife is the test master's token_expire: short, so that a token
// runs out during the test, yet longer than the first subtest's two jobs
// take on a loaded machine (5.9 s once in CI with 4 s, which renewed the
// token in the middle of it).
const tokenLife = 15 * time.Second

func TestMasterRequestServer(t *testing.T) {
	s := saltstack.StartOpts(t, binary, saltstack.Options{MasterExtra: fmt.Sprintf("token_expire: %d\n", int(tokenLife.Seconds()))})
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	_, ret := s.Ports()
	master := fmt.Sprintf("tcp://127.0.0.1:%d", ret)
	ctx := context.Background()
	newClient := func(password string) *saltreq.Client {
		c, err := saltreq.New(saltreq.Config{URL: master, Username: s.APIUser, Password: password, Eauth: "file", Timeout: 20 * time.Second})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return c
	}
	c := newClient(s.APIPass)
	jobs := &jobcache.Overlay{Jobs: testenv.NoSaltAPI{}, Dir: filepath.Join(s.Root, "var", "cache", "salt", "master", "jobs")}
	settled := func(jid string) saltapi.JobInfo {
		t.Helper()
		var info saltapi.JobInfo
		testenv.Eventually(t, time.Minute, "job "+jid+" returned", func() (bool, string) {
			var err error
			info, err = jobs.ListJob(ctx, jid)
			return err == nil && len(info.Returns) > 0, fmt.Sprint(err)
		})
		return info
	}

	t.Run("a volume prepared and removed through the request server", func(t *testing.T) {
		u := uuid.NewString()
		t.Cleanup(func() { testenv.Cleanup(s.StateDir, []string{u}, t.Logf) })
		vol := map[string]any{"name": "req-1", "uuid": u, "node": s.MinionID, "sparseLoopDevice": map[string]any{"size": "16Mi"}}
		job, err := c.LocalAsync(ctx, s.MinionID, "salt_volumes.apply_volume", []any{"prepared", []any{vol}, false}, nil)
		require.NoError(t, err)
		assert.Equal(t, []string{s.MinionID}, job.Minions)
		assert.Regexp(t, `^\d{20}$`, job.JID)
		info := settled(job.JID)
		assert.Contains(t, string(info.Returns[s.MinionID].Return), `"result":true`)
		_, err = os.Stat(filepath.Join(s.StateDir, "sparse", u))
		require.NoError(t, err, "the sparse file exists")

		job, err = c.LocalAsync(ctx, s.MinionID, "salt_volumes.apply_volume", []any{"unprepared", []any{vol}, false}, nil)
		require.NoError(t, err)
		settled(job.JID)
		_, err = os.Stat(filepath.Join(s.StateDir, "sparse", u))
		assert.True(t, os.IsNotExist(err), "the sparse file is gone")
		assert.Equal(t, 1, c.Logins(), "one token for both")
	})

	t.Run("a function outside the account's ACL is refused by the master", func(t *testing.T) {
		_, err := c.LocalAsync(ctx, s.MinionID, "cmd.run", []any{"id"}, nil)
		var me *saltreq.Error
		require.ErrorAs(t, err, &me)
		assert.Equal(t, "AuthorizationError", me.Name)
		assert.Contains(t, err.Error(), "external_auth ACL")
		_, err = c.LocalAsync(ctx, s.MinionID, "state.apply", []any{"top"}, nil)
		require.ErrorAs(t, err, &me, "a state outside salt_volumes")
		assert.Equal(t, "AuthorizationError", me.Name)
		// Even our own formula: state.apply's keywords (localconfig,
		// saltenv) would let the account run other code; only
		// salt_volumes.apply_volume and a sync from base are allowed.
		for _, tc := range []struct {
			fun   string
			arg   []any
			kwarg map[string]any
		}{
			{"state.apply", []any{"salt_volumes"}, map[string]any{"localconfig": "/tmp/c.yml"}},
			{"state.sls", []any{"salt_volumes"}, map[string]any{"saltenv": "other"}},
			{"saltutil.sync_all", []any{"other"}, nil},
			{"saltutil.sync_all", nil, map[string]any{"saltenv": "other"}},
		} {
			_, err = c.LocalAsync(ctx, s.MinionID, tc.fun, tc.arg, tc.kwarg)
			require.ErrorAs(t, err, &me, "%s %v %v", tc.fun, tc.arg, tc.kwarg)
			assert.Equal(t, "AuthorizationError", me.Name, "%s %v %v", tc.fun, tc.arg, tc.kwarg)
		}
	})

	t.Run("a wrong password is refused, naming the settings", func(t *testing.T) {
		bad := newClient("not-the-password")
		_, err := bad.LocalAsync(ctx, s.MinionID, "test.ping", nil, nil)
		var me *saltreq.Error
		require.ErrorAs(t, err, &me)
		assert.Equal(t, "AuthenticationError", me.Name)
		assert.Contains(t, err.Error(), "salt.password")
		assert.NotContains(t, err.Error(), "not-the-password", "the password is never shown")
	})

	t.Run("an unknown minion starts no job", func(t *testing.T) {
		_, err := c.LocalAsync(ctx, "no-such-minion", "test.ping", nil, nil)
		assert.ErrorIs(t, err, saltapi.ErrNoMinions)
	})

	t.Run("an expired token is renewed", func(t *testing.T) {
		before := c.Logins()
		time.Sleep(tokenLife + time.Second)
		job, err := c.LocalAsync(ctx, s.MinionID, "test.ping", nil, nil)
		require.NoError(t, err)
		settled(job.JID)
		assert.Equal(t, before+1, c.Logins(), "a new token for the expired one")
	})

	t.Run("a token the master dropped is renewed once", func(t *testing.T) {
		long := newClient(s.APIPass)
		_, err := long.LocalAsync(ctx, s.MinionID, "test.ping", nil, nil)
		require.NoError(t, err)
		// The master forgets its tokens (a wiped token_dir), while the
		// client still holds one it believes valid.
		toks, _ := filepath.Glob(filepath.Join(s.Root, "var", "cache", "salt", "master", "tokens", "*"))
		require.NotEmpty(t, toks, "the master keeps its tokens under its cachedir")
		for _, f := range toks {
			require.NoError(t, os.Remove(f))
		}
		before := long.Logins()
		job, err := long.LocalAsync(ctx, s.MinionID, "test.ping", nil, nil)
		require.NoError(t, err)
		settled(job.JID)
		assert.Equal(t, before+1, long.Logins())
	})

	t.Run("requests 11 s apart: the master's heartbeat never reads as a reply", func(t *testing.T) {
		// The master pings a connection 10 s after it opened and every 10 s
		// (zmq_heartbeat_ivl): a connection kept from the first request
		// would hand the PING to the second as its reply.
		_, err := c.LocalAsync(ctx, s.MinionID, "test.ping", nil, nil)
		require.NoError(t, err)
		time.Sleep(11 * time.Second)
		job, err := c.LocalAsync(ctx, s.MinionID, "test.ping", nil, nil)
		require.NoError(t, err)
		settled(job.JID)
	})

	t.Run("the master restarted between requests: the client reconnects", func(t *testing.T) {
		s.Restart("master")
		s.WaitForMinion(s.MinionID, 5*time.Second, 90*time.Second)
		job, err := c.LocalAsync(ctx, s.MinionID, "test.ping", nil, nil)
		require.NoError(t, err)
		settled(job.JID)
	})

	t.Run("no master listening: a clear error within the timeout", func(t *testing.T) {
		gone, err := saltreq.New(saltreq.Config{URL: fmt.Sprintf("tcp://127.0.0.1:%d", saltstack.FreePort(t)), Username: s.APIUser, Password: s.APIPass, Eauth: "file", Timeout: 3 * time.Second})
		require.NoError(t, err)
		defer gone.Close()
		_, err = gone.LocalAsync(ctx, s.MinionID, "test.ping", nil, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "salt master")
	})
}
