package controlplane

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
)

// TestDemo runs make demo's program the way README tells a new user to
// (--once tears it down after showing everything), with Kubernetes and
// HTTPS: the kubectl-applied Volume and the CLI's become Available, the
// claim's pod really runs on the kubelet and writes on its provisioned
// volume, the people's logins are printed, and everything is deleted on the
// way out.
func TestDemo(t *testing.T) {
	saltstack.Need(t)
	cmd := exec.Command(bin("salt-volumes-demo"), "--once", "--kubernetes", "--tls", "--bin", binDir, "--listen", "127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	text := string(out)
	require.NoError(t, err, text)
	assert.Regexp(t, `(?m)^\s+demo-fs\s+node-1\s+sparse\s+1Gi\s+Filesystem\s+Available\s`, text, "kubectl get volumes lists the applied Volume")
	assert.Regexp(t, `(?m)^\s+demo-block\s+node-1\s+sparse\s+512Mi\s+Block\s+Available\s`, text, "and the one the CLI made")
	assert.Regexp(t, regexp.MustCompile(`(?m)^\s+pod/demo-app condition met$`), text, "the claim's pod runs")
	assert.Contains(t, text, "written by demo-app at ", "the pod wrote on its volume")
	assert.Regexp(t, `(?m)^export SALT_VOLUMES_URL=https://127\.0\.0\.1:\d+$`, text, "--tls: serve speaks HTTPS")
	assert.Regexp(t, `(?m)^export SALT_VOLUMES_CA=/.+/ca\.crt$`, text, "and the CLI is told the CA (it ran every step through it)")
	assert.Regexp(t, `(?m)^user alice password [0-9a-f]{24} eauth file$`, text)
	assert.Regexp(t, `(?m)^user carol password [0-9a-f]{24} eauth file$`, text)
	assert.Regexp(t, `(?m)^node-2\s`, text, "the second minion is listed among the nodes")
	assert.Contains(t, text, "deleting the demo volumes")
	assert.True(t, strings.HasSuffix(strings.TrimSpace(text), "==> stopped"), "the demo tears down and says so")
	if t.Failed() {
		t.Log(text)
	}
}
