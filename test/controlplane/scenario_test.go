package controlplane

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestScenario runs the Vagrant cluster's end-to-end scenario (the same
// salt-volumes-e2e binary make vagrant-e2e runs on the master) on loopback:
// two minions on this machine stand in for the two nodes, loop devices for
// their spare disks. Node 1's disks are given on the command line, node 2's
// come from its grain, as in the cluster.
func TestScenario(t *testing.T) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	state2 := s.AddMinion("node-2")
	t.Cleanup(func() {
		testenv.Cleanup(s.StateDir, nil, t.Logf)
		testenv.Cleanup(state2, nil, t.Logf)
	})
	out, code := s.SyncAll("*")
	require.Equal(t, 0, code, out)

	d1, d2 := testenv.FakeDisk(t, 320<<20).Path, testenv.FakeDisk(t, 64<<20).Path
	d3, d4 := testenv.FakeDisk(t, 320<<20).Path, testenv.FakeDisk(t, 64<<20).Path
	out, code = s.Salt("node-2", "grains.set", "salt_volumes_e2e:disks", `["`+d3+`","`+d4+`"]`, "force=True", "--out=json")
	require.Equal(t, 0, code, out)

	p := newPlane(t, s)
	p.Start("")
	tokenFile := filepath.Join(s.Root, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(p.Token+"\n"), 0o600))

	e2e := exec.Command(bin("salt-volumes-e2e"),
		"--cli", bin("salt-volumes"),
		"--salt", filepath.Join(s.Venv, "bin", "salt"), "--salt-config", s.Conf,
		"--node", "node-1="+d1+","+d2, "--node", "node-2", "--timeout", "3m")
	// The token from a file, as an operator on the master would give it.
	e2e.Env = append(os.Environ(), "SALT_VOLUMES_URL="+p.URL, "SALT_VOLUMES_TOKEN=", "SALT_VOLUMES_TOKEN_FILE="+tokenFile)
	outb, err := e2e.CombinedOutput()
	t.Logf("salt-volumes-e2e:\n%s", outb)
	require.NoError(t, err, "the scenario failed")
	assert.Contains(t, string(outb), "PASSED: 8 volumes on 2 nodes")
	assert.Equal(t, 8, strings.Count(string(outb), "checked on the node"), "every volume was checked on its node")

	// Nothing of the scenario is left in the control plane.
	out, _, code = p.CLI("ls", "-o", "json")
	require.Equal(t, 0, code)
	assert.JSONEq(t, `{"items": []}`, out)
}
