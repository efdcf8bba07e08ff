// Package controlplane tests salt-volumes serve end to end: the real binary
// against a real salt-master, salt-minion and salt-api on loopback, real
// loop devices on the "node" (this machine).
package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sv-bin")
	if err == nil {
		err = testenv.Build(dir, "salt-volume-exec", "salt-volumes")
	}
	if err == nil {
		err = testenv.BuildAs(dir, "salt-volumes-e2e", "test/e2e")
	}
	if err == nil {
		err = testenv.BuildAs(dir, "salt-volumes-demo", "test/demo")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }

// plane is one salt-volumes serve process.
type plane struct {
	t      *testing.T
	stack  *saltstack.Stack
	cmd    *exec.Cmd
	URL    string
	Token  string
	Config string
	Store  string
	logf   *os.File
	events string
	// jobs is added to the salt: section: the master's job cache, read
	// from disk (serve's recommended setting on the master).
	jobs string
	// Env is added to serve's environment at the next Start.
	Env []string
	// StoreConfig replaces the "store: <file>" line (an etcd: section);
	// Log names the log file under the stack's log directory.
	StoreConfig string
	Log         string
}

func newPlane(t *testing.T, s *saltstack.Stack) *plane {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	p := &plane{t: t, stack: s, Token: hex.EncodeToString(b), Store: filepath.Join(s.Root, "control", "volumes.db"), Log: "control-plane"}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", saltstack.FreePort(t))
	p.Config = filepath.Join(s.Root, "control.yaml")
	p.events = fmt.Sprintf("events:\n  source: bus\n  socket: %s\n", s.EventSocket())
	p.jobs = fmt.Sprintf("  jobCache: %s\n", filepath.Join(s.Root, "var", "cache", "salt", "master", "jobs"))
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(s.Root, "log", p.Log))
			t.Logf("--- %s log (tail)\n%s", p.Log, tailStr(string(b), 6000))
		}
	})
	return p
}

func tailStr(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// LogText is what serve has logged so far.
func (p *plane) LogText() string {
	b, err := os.ReadFile(filepath.Join(p.stack.Root, "log", p.Log))
	require.NoError(p.t, err)
	return string(b)
}

func (p *plane) writeConfig(extra string) {
	storeCfg := "store: " + p.Store + "\n"
	if p.StoreConfig != "" {
		storeCfg = p.StoreConfig
	}
	cfg := fmt.Sprintf(`listen: %s
token: %s
%ssalt:
  url: %s
  username: %s
  password: %s
  eauth: file
%s%s%s`, strings.TrimPrefix(p.URL, "http://"), p.Token, storeCfg, p.stack.APIURL(), p.stack.APIUser, p.stack.APIPass, p.jobs, p.events, extra)
	require.NoError(p.t, os.WriteFile(p.Config, []byte(cfg), 0o600))
}

// Start runs serve and waits until it is ready (event source connected).
func (p *plane) Start(extra string) {
	p.t.Helper()
	p.writeConfig(extra)
	f, err := os.OpenFile(filepath.Join(p.stack.Root, "log", p.Log), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(p.t, err)
	p.logf = f
	p.cmd = exec.Command(bin("salt-volumes"), "serve", "--config", p.Config)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.Env = append(os.Environ(), p.Env...)
	require.NoError(p.t, p.cmd.Start())
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(p.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("control plane not ready after 60s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Kill stops serve with SIGKILL: no chance to save anything.
func (p *plane) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
	p.logf.Close()
}

// Stop stops serve with SIGTERM, as an operator would.
func (p *plane) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		p.t.Error("serve did not stop within 15s of SIGTERM")
		_ = p.cmd.Process.Kill()
		<-done
	}
	p.cmd = nil
	p.logf.Close()
}

func (p *plane) Client() *client.Client { return &client.Client{URL: p.URL, Token: p.Token} }

// CLI runs the salt-volumes client with the plane's URL and token in the
// environment, as a user would.
func (p *plane) CLI(args ...string) (string, string, int) {
	cmd := exec.Command(bin("salt-volumes"), args...)
	cmd.Env = append(os.Environ(), "SALT_VOLUMES_URL="+p.URL, "SALT_VOLUMES_TOKEN="+p.Token)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		p.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// Metrics returns one metric's value from /metrics.
func (p *plane) Metric(name string) float64 {
	req, _ := http.NewRequest(http.MethodGet, p.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+p.Token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(p.t, err)
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	for _, line := range strings.Split(buf.String(), "\n") {
		var v float64
		if strings.HasPrefix(line, name+" ") {
			_, err := fmt.Sscanf(strings.TrimPrefix(line, name+" "), "%g", &v)
			require.NoError(p.t, err)
			return v
		}
	}
	p.t.Fatalf("metric %s not exported", name)
	return 0
}

// watcher records the watch stream of one volume.
type watcher struct {
	ch     chan saltvolumes.Event
	cancel context.CancelFunc
}

func (p *plane) Watch(name string) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{ch: make(chan saltvolumes.Event, 1000), cancel: cancel}
	synced := make(chan struct{})
	go func() {
		_ = p.Client().Watch(ctx, "", name, func(ev saltvolumes.Event) bool {
			if ev.Type == client.Synced {
				close(synced)
				return true
			}
			w.ch <- ev
			return true
		})
		close(w.ch)
	}()
	select {
	case <-synced:
	case <-time.After(10 * time.Second):
		p.t.Fatal("watch stream did not sync")
	}
	p.t.Cleanup(cancel)
	return w
}

// Until returns the events up to the first one ok accepts.
func (w *watcher) Until(t *testing.T, limit time.Duration, ok func(saltvolumes.Event) bool) []saltvolumes.Event {
	t.Helper()
	var got []saltvolumes.Event
	deadline := time.After(limit)
	for {
		select {
		case ev, open := <-w.ch:
			if !open {
				t.Fatalf("watch stream ended; saw %s", summary(got))
			}
			got = append(got, ev)
			if ok(ev) {
				return got
			}
		case <-deadline:
			t.Fatalf("not reached within %s; saw %s", limit, summary(got))
		}
	}
}

func phaseIs(phase string) func(saltvolumes.Event) bool {
	return func(ev saltvolumes.Event) bool {
		return ev.Type != "DELETED" && ev.Volume.Status.Phase.String() == phase
	}
}

func isDeleted(ev saltvolumes.Event) bool { return ev.Type == "DELETED" }

func summary(evs []saltvolumes.Event) string {
	var parts []string
	for _, ev := range evs {
		s := ev.Type + ":" + ev.Volume.Status.Phase.String()
		if ev.Volume.Status.Step != "" {
			s += "/" + ev.Volume.Status.Step
		}
		if ev.Volume.Status.Message != "" {
			s += "(" + ev.Volume.Status.Message + ")"
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
