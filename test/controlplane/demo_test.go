package controlplane

import (
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestDemo runs make demo's program the way README tells a new user to,
// stopped with the Ctrl-C it asks for, with Kubernetes and HTTPS: the
// kubectl-applied Volume and the CLI's become Available, the claim's pod
// really runs on the kubelet and writes on its provisioned volume, the
// people's logins are printed, and everything is deleted on the way out.
func TestDemo(t *testing.T) {
	saltstack.Need(t)
	// As a terminal runs it: a process group of its own, stopped by the
	// Ctrl-C it asks for, sent to the whole group.
	cmd := exec.Command(bin("salt-volumes-demo"), "--kubernetes", "--tls", "--bin", binDir, "--listen", "127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var buf testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	testenv.EventuallyEvery(t, 15*time.Minute, 200*time.Millisecond, "the demo asks for Ctrl-C", func() (bool, string) {
		select {
		case err = <-done:
			t.Fatalf("the demo ended before asking for Ctrl-C: %v\n%s", err, buf.String())
		default:
		}
		return strings.Contains(buf.String(), "Ctrl-C (or SIGTERM) stops everything"), ""
	})
	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGINT), "Ctrl-C")
	select {
	case err = <-done:
	case <-time.After(10 * time.Minute):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		err = <-done
	}
	text := buf.String()
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
	_, after, _ := strings.Cut(text, "deleting the demo volumes")
	assert.NotContains(t, after, "salt-volumes: ", "each deletion at Ctrl-C goes through serve, still up (no error)")
	assert.Regexp(t, `(?m)^volume demo-block deleted$`, after, "and is followed until the volume is gone")
	assert.True(t, strings.HasSuffix(strings.TrimSpace(text), "==> stopped"), "the demo tears down and says so")
	if t.Failed() {
		t.Log(text)
	}
}
