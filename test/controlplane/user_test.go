package controlplane

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// serveUID is an unprivileged uid with no passwd entry: serve as its own
// user, in the master's group only (deploy/salt-volumes.service runs it as
// salt-volumes, a member of the salt group).
const serveUID = 64123

// Serve runs as a user of its own that shares only the master's group: it
// reads the master's event bus (a socket of mode 0660 on 3007 and 3008) and
// its job cache on disk, and publishes through the request server, with
// salt-api out of reach so that nothing hides an unreadable cache; it can
// read neither the master's private key nor its root key.
func TestServeAsItsOwnUser(t *testing.T) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)

	sock, err := os.Stat(s.EventSocket())
	require.NoError(t, err)
	// 3006 makes the socket 0600 (the ipc transport binds it under umask
	// 0177): serve as its own user reads events through salt-api there
	// (docs/operations.md), and salt-api must then be reachable.
	viaSSE := sock.Mode().Perm()&0o060 != 0o060
	if viaSSE {
		assert.True(t, strings.HasPrefix(s.Version(), "3006"), "Salt %s's event socket is %v", s.Version(), sock.Mode().Perm())
	}
	masterGID := sock.Sys().(*syscall.Stat_t).Gid
	cred := &syscall.Credential{Uid: serveUID, Gid: serveUID, Groups: []uint32{masterGID}}

	// The test's own directories are root's (0700); a master's are
	// traversable (verify_env makes them under umask 022). Only the
	// path to the socket and the job cache is opened up.
	jobs := filepath.Join(s.Root, "var", "cache", "salt", "master", "jobs")
	for _, d := range []string{binDir, s.Root, s.SockDir, filepath.Dir(s.SockDir), jobs} {
		for p := d; p != "/" && p != "/tmp" && strings.HasPrefix(p, "/tmp/"); p = filepath.Dir(p) {
			require.NoError(t, os.Chmod(p, 0o755))
		}
	}

	p := newPlane(t, s)
	p.Credential = cred
	if viaSSE {
		p.Events = "events:\n  source: sse\n"
	} else {
		p.APIURL = fmt.Sprintf("http://127.0.0.1:%d", saltstack.FreePort(t)) // nothing listens
	}
	p.Jobs += "  publish: master\n"
	p.Start("")
	require.Equal(t, serveUID, procUID(t, p.Cmd.Process.Pid), "serve does not run as its own user")

	_, errs, code := p.CLI("create", "own-user", "--node", s.MinionID, "--size", "32Mi", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, "%s\n%s", errs, serveproc.Tail(p.LogText(), 3000))
	v := getJSON(t, p, "own-user")
	uuids = append(uuids, v.Spec.UUID)
	assert.Equal(t, "Available", v.Status.Phase.String())
	assert.NotContains(t, p.LogText(), "salt.jobCache is not a readable directory")

	for _, key := range []string{
		filepath.Join(s.Conf, "pki", "master", "master.pem"),
		filepath.Join(s.Root, "var", "cache", "salt", "master", ".root_key"),
	} {
		if _, err := os.Stat(key); err != nil {
			key = findUnder(t, s.Root, filepath.Base(key))
		}
		cat := exec.Command("head", "-c", "1", key)
		cat.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		got, err := cat.CombinedOutput()
		assert.Error(t, err, "serve's user read %s", key)
		assert.Contains(t, string(got), "Permission denied", key)
	}

	_, errs, code = p.CLI("rm", "own-user", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
}

// procUID is the real uid of a running process.
func procUID(t *testing.T, pid int) int {
	t.Helper()
	st, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	require.NoError(t, err)
	return int(st.Sys().(*syscall.Stat_t).Uid)
}

// findUnder finds a file by name under root.
func findUnder(t *testing.T, root, name string) string {
	t.Helper()
	var found string
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == name && found == "" {
			found = path
		}
		return nil
	})
	require.NotEmpty(t, found, "no %s under %s", name, root)
	return found
}
