package controlplane

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/volume"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestReinstalledNodeKeepsVolumes: a node reinstalled with its disks
// intact (a new minion key under the same id, the node's records and the
// volumes' signatures kept) has its volumes as they were: Available
// throughout, never prepared again or wiped, their data there, and they
// are managed through the new key as before.
func TestReinstalledNodeKeepsVolumes(t *testing.T) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	state := s.AddMinion("node-r")
	disk := testenv.FakeDisk(t, 32<<20)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(state, uuids, t.Logf) })
	out, code := s.SyncAll("*")
	require.Equal(t, 0, code, out)
	p := newPlane(t, s)
	p.Start("")
	ctx := context.Background()

	_, errs, code := p.CLI("create", "kept-sparse", "--node", "node-r", "--size", "32Mi", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
	_, errs, code = p.CLI("create", "kept-raw", "--node", "node-r", "--device", disk.Path, "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
	jobs := map[string]string{}
	for _, n := range []string{"kept-sparse", "kept-raw"} {
		v := getJSON(t, p, n)
		uuids = append(uuids, v.Spec.UUID)
		jobs[n] = v.Status.JobID
	}
	sparse := getJSON(t, p, "kept-sparse")
	mp := t.TempDir()
	require.NoError(t, exec.Command("mount", sparse.Status.PersistentPath, mp).Run())
	require.NoError(t, os.WriteFile(filepath.Join(mp, "kept"), []byte("before the reinstall"), 0o600))
	require.NoError(t, exec.Command("umount", mp).Run())

	before, after := s.ReinstallMinion("node-r")
	require.NotEmpty(t, before)
	assert.NotEqual(t, before, after, "a new minion key")

	// The node's own records and the UUIDs on its disks say prepared.
	listed, err := exec.Command(bin("salt-volume-exec"), "--state-dir", state, "list").Output()
	require.NoError(t, err)
	for _, u := range uuids {
		assert.Contains(t, string(listed), u, "the reinstalled node still knows its volumes")
	}
	assert.Equal(t, 2, strings.Count(string(listed), `"state":"prepared"`), "%s", listed)
	// serve, restarted too, follows the volumes as they were: nothing is
	// prepared again.
	p.Stop()
	p.Start("")
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		for n, job := range jobs {
			v := getJSON(t, p, n)
			require.Equal(t, volume.Available, v.Status.Phase, "%s: %s %s", n, v.Status.Reason, v.Status.Message)
			require.Equal(t, job, v.Status.JobID, "%s: not prepared again", n)
		}
		time.Sleep(time.Second)
	}
	require.NoError(t, exec.Command("mount", sparse.Status.PersistentPath, mp).Run())
	b, err := os.ReadFile(filepath.Join(mp, "kept"))
	require.NoError(t, exec.Command("umount", mp).Run())
	require.NoError(t, err)
	assert.Equal(t, "before the reinstall", string(b))

	// Managed through the new key as before. The new minion cache has no
	// salt_volumes modules: serve's first run finds them missing, asks the
	// node to sync them, and runs again.
	for n := range jobs {
		_, errs, code := p.CLI("rm", n, "--wait", "--timeout", "2m")
		require.Equal(t, 0, code, "%s: %s", n, errs)
	}
	_, err = p.Client().Get(ctx, "kept-raw")
	assert.Error(t, err)
	assert.Contains(t, p.LogText(), "asked it to sync them")
	listed, err = exec.Command(bin("salt-volume-exec"), "--state-dir", state, "list").Output()
	require.NoError(t, err)
	assert.NotContains(t, string(listed), uuids[0])
}
