// Package deploy checks the files an operator installs from deploy/.
package deploy

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const unit = "../../deploy/salt-volumes.service"

// The shipped unit runs serve as its own user in the master's group, hides
// the master's key directory, and keeps systemd's exposure score low.
func TestServeUnit(t *testing.T) {
	b, err := os.ReadFile(unit)
	require.NoError(t, err)
	text := string(b)
	assert.Contains(t, text, "\nUser=salt-volumes\n")
	// Its groups come from the user database: a group named here that
	// the machine lacks (a master running as root has no salt group)
	// stops the unit from starting at all (216/GROUP).
	assert.NotContains(t, text, "\nSupplementaryGroups=")
	assert.Regexp(t, `(?m)^InaccessiblePaths=.*-/etc/salt/pki( |$)`, text)
	assert.Regexp(t, `(?m)^CapabilityBoundingSet=$`, text)

	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	out, _ := exec.Command("systemd-analyze", "security", "--offline=true", "--no-pager", unit).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for salt-volumes.service: ([0-9.]+)`).FindSubmatch(out)
	require.NotNil(t, m, "%s", out)
	score, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	t.Logf("systemd-analyze security: %.1f", score)
	assert.LessOrEqual(t, score, 2.0, "the unit's exposure rose:\n%s", out)

	// verify parses every directive; the binary is not installed here.
	out, _ = exec.Command("systemd-analyze", "verify", unit).CombinedOutput()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" || strings.Contains(line, "/usr/local/bin/salt-volumes is not executable") {
			continue
		}
		t.Errorf("systemd-analyze verify: %s", line)
	}
}
