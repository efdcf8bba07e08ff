package salt

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
)

// The Salt modules from the saltext.volumes wheel (make dist), installed
// into the Salt under test's environment and nothing in the master's
// file_roots but the formulas: no saltutil.sync_all, and a volume is
// prepared and removed by the formulas, with the beacon and the engine
// found by Salt's loader too.
func TestModulesFromTheSaltExtension(t *testing.T) {
	repo, err := saltstack.RepoRoot()
	require.NoError(t, err)
	wheels := t.TempDir()
	out, err := exec.Command(filepath.Join(repo, "scripts", "saltext.sh"), wheels).CombinedOutput()
	require.NoError(t, err, "%s", out)
	whl := strings.TrimSpace(string(out))
	require.FileExists(t, whl)
	ext := t.TempDir()
	py := filepath.Join(saltstack.VenvDir(repo), "bin", "python")
	out, err = exec.Command(py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", ext, whl).CombinedOutput()
	require.NoError(t, err, "%s", out)

	s := saltstack.StartOpts(t, binary, saltstack.Options{Extension: ext})
	var uuids []string
	cleanupNode(t, s, &uuids)
	_, err = os.Stat(filepath.Join(s.Root, "var", "cache", "salt", "minion", "extmods", "modules", "salt_volumes.py"))
	require.True(t, os.IsNotExist(err), "nothing was synced")

	out2, code := s.Salt(s.MinionID, "sys.list_functions", "salt_volumes", "--out=json", "--static")
	require.Equal(t, 0, code, out2)
	fns, _ := saltstack.JSON(t, out2)[s.MinionID].([]any)
	assert.Contains(t, fns, "salt_volumes.prepare", "the execution module comes from the extension")
	assert.Contains(t, fns, "salt_volumes.apply_volume")
	out2, code = s.Salt(s.MinionID, "sys.list_state_functions", "salt_volumes", "--out=json", "--static")
	require.Equal(t, 0, code, out2)
	assert.Contains(t, out2, "salt_volumes.prepared")
	out2, code = s.Salt(s.MinionID, "beacons.list_available", "--out=json", "--static")
	require.Equal(t, 0, code, out2)
	assert.Contains(t, out2, "salt_volumes", "the beacon comes from the extension")

	u := uuid.NewString()
	uuids = append(uuids, u)
	pillar := saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volume": vol("ext-vol", u, s.MinionID, nil)}})
	out2, code = s.Salt(s.MinionID, "state.apply", "salt_volumes.prepared", pillar, "--out=json", "--static")
	require.Equal(t, 0, code, out2)
	res := states(t, saltstack.JSON(t, out2), s.MinionID)
	v := res["salt_volumes ext-vol"]["volume"].(map[string]any)
	assert.Equal(t, "/dev/disk/by-uuid/"+u, v["persistentPath"])
	out2, code = s.Salt(s.MinionID, "state.apply", "salt_volumes.unprepared", pillar, "--out=json", "--static")
	require.Equal(t, 0, code, out2)
	_, err = os.Stat(filepath.Join(s.StateDir, "volumes", u+".json"))
	assert.True(t, os.IsNotExist(err), "the volume's record is gone")

	// The master's loader finds the engine too, from the same package.
	cmd := exec.Command(py, "-c", `import sys, salt.config, salt.loader
opts = salt.config.master_config(sys.argv[1])
print("salt_volumes.start" in salt.loader.engines(opts, {}, {}, {}))`, filepath.Join(s.Conf, "master"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+ext)
	out3, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out3)
	assert.Equal(t, "True", lastLine(string(out3)), "the engine comes from the extension: %s", out3)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
