package controlplane

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// UpgradeToEnv names the virtualenv of the Salt a master is upgraded to
// (make test-salt SALT=3006|3007 sets it to the pinned release's).
const upgradeToEnv = "SALT_VOLUMES_UPGRADE_TO"

// The master is upgraded to another Salt line while serve runs: serve finds
// the new master's bus by itself (whatever its framing), gets a new token
// when the old one is refused (3008 keeps tokens elsewhere: an upgrade
// invalidates them), and the volumes made before stay Available untouched.
func TestSaltUpgradeUnderServe(t *testing.T) {
	to := os.Getenv(upgradeToEnv)
	if to == "" {
		t.Skipf("%s is not set: make test-salt SALT=3006 (or 3007) runs this, upgrading that line's master to the pinned release", upgradeToEnv)
	}
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	from := s.Version()
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	p := newPlane(t, s)
	p.Start("")

	before := map[string]string{} // name -> uuid
	for _, args := range [][]string{
		{"create", "up-fs", "--node", s.MinionID, "--size", "32Mi", "--wait", "--timeout", "2m"},
		{"create", "up-blk", "--node", s.MinionID, "--size", "32Mi", "--mode", "Block", "--wait", "--timeout", "2m"},
	} {
		out, errs, code := p.CLI(args...)
		require.Equal(t, 0, code, "on Salt %s: %s", from, out+errs)
		v := getJSON(t, p, args[1])
		before[args[1]] = v.Spec.UUID
		uuids = append(uuids, v.Spec.UUID)
	}
	reconnects := p.Metric("salt_volumes_event_reconnects_total")
	tokens := p.Metric("salt_volumes_master_tokens_total")
	launched := p.Metric("salt_volumes_jobs_launched_total")

	// serve's reconnect is watched while the master is replaced: the
	// harness itself waits for the minion before it returns.
	stopped := time.Now()
	back := make(chan time.Duration, 1)
	go func() {
		for time.Since(stopped) < 3*time.Minute {
			n, err1 := p.MetricValue("salt_volumes_event_reconnects_total")
			up, err2 := p.MetricValue("salt_volumes_event_source_connected")
			if err1 == nil && err2 == nil && n > reconnects && up == 1 {
				back <- time.Since(stopped)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(back)
	}()
	s.UpgradeMaster(to)
	upgraded := s.Version()
	require.NotEqual(t, from, upgraded)
	t.Logf("master upgraded from Salt %s to %s: its minion answering again %s after the old master stopped", from, upgraded, time.Since(stopped).Round(100*time.Millisecond))
	took, ok := <-back
	require.True(t, ok, "serve reconnects to the upgraded master's bus")
	t.Logf("serve back on the upgraded master's bus %s after the old master stopped", took.Round(10*time.Millisecond))

	created := time.Now()
	out, errs, code := p.CLI("create", "up-after", "--node", s.MinionID, "--size", "32Mi", "--wait", "--timeout", "3m")
	require.Equal(t, 0, code, "on Salt %s: %s", upgraded, out+errs)
	uuids = append(uuids, getJSON(t, p, "up-after").Spec.UUID)
	t.Logf("first create on Salt %s: Available in %s", upgraded, time.Since(created).Round(10*time.Millisecond))
	assert.Greater(t, p.Metric("salt_volumes_master_tokens_total"), tokens, "a new token from the upgraded master")
	assert.Equal(t, launched+1, p.Metric("salt_volumes_jobs_launched_total"), "one job for the new volume, none again for the old ones")

	for name, uuid := range before {
		v := getJSON(t, p, name)
		assert.Equal(t, "Available", v.Status.Phase.String(), name)
		assert.Equal(t, uuid, v.Spec.UUID, name)
	}
	for _, name := range []string{"up-fs", "up-blk", "up-after"} {
		out, errs, code := p.CLI("rm", name, "--wait", "--timeout", "2m")
		require.Equal(t, 0, code, "deleting %s on Salt %s: %s", name, upgraded, out+errs)
	}
}
