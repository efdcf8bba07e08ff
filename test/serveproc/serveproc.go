// Package serveproc runs the real salt-volumes serve for tests and
// programs: its configuration written for a test Salt stack, the process
// started and waited for, its API, CLI and metrics at hand.
package serveproc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
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

// Plane is one salt-volumes serve process.
type Plane struct {
	t     *testing.T
	stack *saltstack.Stack
	bin   string
	// Cmd is the running serve (nil once stopped); tests signal it.
	Cmd    *exec.Cmd
	URL    string
	Token  string
	Config string
	Store  string
	// LogFile is serve's open log while it runs.
	LogFile *os.File
	// Events is serve's events: section (the master's bus by default).
	Events string
	// Jobs is added to the salt: section: the master's job cache, read
	// from disk (serve's recommended setting on the master).
	Jobs string
	// Env is added to serve's environment at the next Start.
	Env []string
	// StoreConfig replaces the "store: <file>" line (an etcd: section);
	// Log names the log file under the stack's log directory.
	StoreConfig string
	Log         string
	// Credential runs serve as another user; its config and store are
	// handed to that user.
	Credential *syscall.Credential
	// APIURL replaces the stack's salt-api URL in the config.
	APIURL string
	// CAFile, with an https URL, is the CA the test's clients and the CLI
	// trust (serve's tls: section comes with Start's extra); CertFile and
	// KeyFile the client certificate they present.
	CAFile, CertFile, KeyFile string
}

// HTTP is the client that reaches this serve (trusting CAFile).
func (p *Plane) HTTP() *http.Client {
	if p.CAFile == "" {
		return http.DefaultClient
	}
	hc, err := client.HTTPS(p.CAFile, p.CertFile, p.KeyFile)
	require.NoError(p.t, err)
	return hc
}

// New is a serve (binary bin) for stack s with a fresh API token, a bbolt
// store under the stack's root and a free loopback port; started by Start,
// stopped when the test ends (its log's tail shown if the test failed).
func New(t *testing.T, s *saltstack.Stack, bin string) *Plane {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	p := &Plane{t: t, stack: s, bin: bin, Token: hex.EncodeToString(b), Store: filepath.Join(s.Root, "control", "volumes.db"), Log: "control-plane"}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", saltstack.FreePort(t))
	p.Config = filepath.Join(s.Root, "control.yaml")
	p.Events = fmt.Sprintf("events:\n  source: bus\n  socket: %s\n", s.EventSocket())
	p.Jobs = fmt.Sprintf("  jobCache: %s\n", filepath.Join(s.Root, "var", "cache", "salt", "master", "jobs"))
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(s.Root, "log", p.Log))
			t.Logf("--- %s log (tail)\n%s", p.Log, Tail(string(b), 6000))
		}
	})
	return p
}

// At is a serve started elsewhere (in a pod), reached at url with token:
// its API, metrics and the CLI (binary bin), nothing to start or stop; log
// names it.
func At(t *testing.T, bin, url, token, log string) *Plane {
	return &Plane{t: t, bin: bin, URL: url, Token: token, Log: log}
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// LogText is what serve has logged so far.
func (p *Plane) LogText() string {
	b, err := os.ReadFile(filepath.Join(p.stack.Root, "log", p.Log))
	require.NoError(p.t, err)
	return string(b)
}

// OneLogFormat checks that every line serve wrote is one of its own JSON
// log lines (slog's time, level and msg), including what the libraries
// it links log (client-go's klog, the etcd client's zap logger), and
// returns the components that logged.
func (p *Plane) OneLogFormat(t *testing.T) map[string]int {
	t.Helper()
	components := map[string]int{}
	for i, line := range strings.Split(strings.TrimSpace(p.LogText()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("line %d of serve's log is not a JSON log line: %s", i+1, line)
			continue
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %d of serve's log has no %q: another logger's format: %s", i+1, k, line)
			}
		}
		if c, ok := m["component"].(string); ok {
			components[c]++
		}
	}
	return components
}

// WriteConfig writes serve's configuration file, extra appended.
func (p *Plane) WriteConfig(extra string) {
	storeCfg := "store: " + p.Store + "\n"
	if p.StoreConfig != "" {
		storeCfg = p.StoreConfig
	}
	_, ret := p.stack.Ports()
	api := p.stack.APIURL()
	if p.APIURL != "" {
		api = p.APIURL
	}
	cfg := fmt.Sprintf(`listen: %s
token: %s
%ssalt:
  url: %s
  username: %s
  password: %s
  eauth: file
  master: tcp://127.0.0.1:%d
%s%s%s`, strings.TrimPrefix(strings.TrimPrefix(p.URL, "http://"), "https://"), p.Token, storeCfg, api, p.stack.APIUser, p.stack.APIPass, ret, p.Jobs, p.Events, extra)
	require.NoError(p.t, os.WriteFile(p.Config, []byte(cfg), 0o600))
	if c := p.Credential; c != nil {
		require.NoError(p.t, os.Chown(p.Config, int(c.Uid), int(c.Gid)))
		require.NoError(p.t, os.MkdirAll(filepath.Dir(p.Store), 0o700))
		require.NoError(p.t, os.Chown(filepath.Dir(p.Store), int(c.Uid), int(c.Gid)))
	}
}

// Start runs serve and waits until it is ready (event source connected).
func (p *Plane) Start(extra string) {
	p.t.Helper()
	p.WriteConfig(extra)
	f, err := os.OpenFile(filepath.Join(p.stack.Root, "log", p.Log), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(p.t, err)
	p.LogFile = f
	p.Cmd = exec.Command(p.bin, "serve", "--config", p.Config)
	p.Cmd.Stdout, p.Cmd.Stderr = f, f
	p.Cmd.Env = append(os.Environ(), p.Env...)
	if p.Credential != nil {
		p.Cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.Credential}
	}
	require.NoError(p.t, p.Cmd.Start())
	deadline := time.Now().Add(60 * time.Second)
	hc := p.HTTP()
	for {
		resp, err := hc.Get(p.URL + "/readyz")
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
func (p *Plane) Kill() {
	if p.Cmd == nil {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	_ = p.Cmd.Wait()
	p.Cmd = nil
	p.LogFile.Close()
}

// Stop stops serve with SIGTERM, as an operator would.
func (p *Plane) Stop() {
	if p.Cmd == nil {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		p.t.Error("serve did not stop within 15s of SIGTERM")
		_ = p.Cmd.Process.Kill()
		<-done
	}
	p.Cmd = nil
	p.LogFile.Close()
}

func (p *Plane) Client() *client.Client {
	return &client.Client{URL: p.URL, Token: p.Token, HTTP: p.HTTP()}
}

// CLI runs the salt-volumes client with the plane's URL and token in the
// environment, as a user would.
func (p *Plane) CLI(args ...string) (string, string, int) {
	cmd := exec.Command(p.bin, args...)
	cmd.Env = append(os.Environ(), "SALT_VOLUMES_URL="+p.URL, "SALT_VOLUMES_TOKEN="+p.Token)
	if p.CAFile != "" {
		cmd.Env = append(cmd.Env, "SALT_VOLUMES_CA="+p.CAFile)
	}
	if p.CertFile != "" {
		cmd.Env = append(cmd.Env, "SALT_VOLUMES_CERT="+p.CertFile, "SALT_VOLUMES_KEY="+p.KeyFile)
	}
	return testenv.Run(p.t, cmd)
}

// CLIAs runs the CLI against this plane with another token.
func (p *Plane) CLIAs(token string, args ...string) (string, string, int) {
	cmd := exec.Command(p.bin, args...)
	cmd.Env = append(os.Environ(), "SALT_VOLUMES_URL="+p.URL, "SALT_VOLUMES_TOKEN="+token)
	if p.CAFile != "" {
		cmd.Env = append(cmd.Env, "SALT_VOLUMES_CA="+p.CAFile)
	}
	return testenv.Run(p.t, cmd)
}

// Metric returns one metric's value from /metrics.
func (p *Plane) Metric(name string) float64 {
	v, err := p.MetricValue(name)
	require.NoError(p.t, err)
	return v
}

// Fetch GETs path with the plane's token: the status and the body.
func (p *Plane) Fetch(path string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, p.URL+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+p.Token)
	resp, err := p.HTTP().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes(), err
}

// MetricValue is Metric without failing the test (for goroutines).
func (p *Plane) MetricValue(name string) (float64, error) {
	_, body, err := p.Fetch("/metrics")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		var v float64
		if strings.HasPrefix(line, name+" ") {
			_, err := fmt.Sscanf(strings.TrimPrefix(line, name+" "), "%g", &v)
			return v, err
		}
	}
	return 0, fmt.Errorf("metric %s not exported", name)
}

// Watcher records the watch stream of one volume.
type Watcher struct {
	ch     chan saltvolumes.Event
	cancel context.CancelFunc
}

// Watch follows one volume's watch stream from now on.
func (p *Plane) Watch(name string) *Watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{ch: make(chan saltvolumes.Event, 1000), cancel: cancel}
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

// Stop ends the watch stream.
func (w *Watcher) Stop() { w.cancel() }

// Until returns the events up to the first one ok accepts.
func (w *Watcher) Until(t *testing.T, limit time.Duration, ok func(saltvolumes.Event) bool) []saltvolumes.Event {
	t.Helper()
	var got []saltvolumes.Event
	deadline := time.After(limit)
	for {
		select {
		case ev, open := <-w.ch:
			if !open {
				t.Fatalf("watch stream ended; saw %s", Summary(got))
			}
			got = append(got, ev)
			if ok(ev) {
				return got
			}
		case <-deadline:
			t.Fatalf("not reached within %s; saw %s", limit, Summary(got))
		}
	}
}

// Summary is a watch stream's events in brief, for failure messages.
func Summary(evs []saltvolumes.Event) string {
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
