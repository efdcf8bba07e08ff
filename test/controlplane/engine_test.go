package controlplane

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
)

// servePIDs lists the processes running salt-volumes serve with config.
func servePIDs(config string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(bytes.TrimRight(cmd, "\x00"), []byte{0})
		if len(args) >= 4 && filepath.Base(string(args[0])) == "salt-volumes" && string(args[1]) == "serve" && string(args[3]) == config {
			pids = append(pids, pid)
		}
	}
	return pids
}

func healthy(url string) bool {
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// TestMasterEngine runs serve as a Salt engine of a real salt-master: the
// master starts it, restarts it after a kill, and stops it on its way out.
func TestMasterEngine(t *testing.T) {
	repo := saltstack.Need(t)
	// The engine's config file is written before the master starts it.
	cfgDir, err := os.MkdirTemp("/tmp", "sv-engine")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(cfgDir) })
	config := filepath.Join(cfgDir, "control.yaml")
	extra := fmt.Sprintf(`engines_dirs: [%s/salt/_engines]
engines:
  - salt_volumes:
      config: %s
      binary: %s
      max_backoff: 2
`, repo, config, bin("salt-volumes"))
	s := saltstack.StartWith(t, bin("salt-volume-exec"), true, extra)
	t.Cleanup(func() {
		for _, pid := range servePIDs(config) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	p := newPlane(t, s)
	p.Config = config
	p.WriteConfig("")

	// The master started the engine before the config existed: serve
	// failed and is retried with backoff (capped at 2 s here; a serve that
	// ran a minute starts over from 1 s) until the file is there.
	wait := func(what string, limit time.Duration, ok func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !ok() {
			if time.Since(start) > limit {
				b, _ := os.ReadFile(filepath.Join(s.Root, "log", "master"))
				t.Fatalf("%s: not within %s\nmaster log (tail):\n%s", what, limit, serveproc.Tail(string(b), 4000))
			}
			time.Sleep(100 * time.Millisecond)
		}
		return time.Since(start)
	}
	wait("serve started by the master", 2*time.Minute, func() bool { return healthy(p.URL) })
	pids := servePIDs(config)
	require.Len(t, pids, 1, "one serve")

	require.NoError(t, syscall.Kill(pids[0], syscall.SIGKILL))
	took := wait("serve restarted after kill -9", 30*time.Second, func() bool {
		now := servePIDs(config)
		return len(now) == 1 && now[0] != pids[0] && healthy(p.URL)
	})
	t.Logf("serve back %.1f s after kill -9", took.Seconds())

	s.StopMaster()
	wait("serve gone with the master", 20*time.Second, func() bool { return len(servePIDs(config)) == 0 })
	require.False(t, healthy(p.URL))
}
