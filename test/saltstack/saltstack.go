// Package saltstack starts a real Salt (from the project's .venv, or the
// virtualenv SALT_VOLUMES_SALT_VENV names: the Salt matrix) for tests:
// masterless salt-call, or a salt-master, salt-minion and salt-api on
// loopback with non-default ports, under a short temp root. The daemons are
// started and stopped by pid; their logs are kept when a test fails.
package saltstack

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// T is what the stack needs from its caller: a *testing.T in tests, a
// small adapter in the demo.
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
	Failed() bool
}

// Stack is one Salt installation for one test.
type Stack struct {
	t                        T
	Repo                     string
	Venv                     string
	Root                     string // short: AF_UNIX paths must stay under 107 bytes
	Conf                     string // -c directory
	MinionID                 string
	StateDir                 string // salt-volume-exec state dir on the "node"
	ExecPath                 string
	APIPort                  int
	APIUser                  string
	APIPass                  string
	SockDir                  string
	pubPort                  int
	retPort                  int
	procs                    map[string]*exec.Cmd
	confs                    map[string]string // daemon name -> its -c directory
	minionExtra, saltVolumes string
	fileRootFirst            string
	extension                string
	people                   map[string]map[string]any
}

// RepoRoot finds the checkout (the directory holding go.mod).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Need skips a test when Salt or root is unavailable, saying how to fix it.
func Need(t T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: Salt runs the node binary, which attaches loop devices")
	}
	repo, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(VenvDir(repo), "bin", "salt-call")); err != nil {
		if os.Getenv(VenvEnv) != "" {
			t.Fatalf("%s=%s holds no Salt: run scripts/salt-venv.sh", VenvEnv, VenvDir(repo))
		}
		t.Skip("Salt is not installed in .venv: run make setup")
	}
	return repo
}

// VenvEnv names the virtualenv of the Salt under test when it is not the
// pinned one in .venv (make test-salt SALT=<line> sets it).
const VenvEnv = "SALT_VOLUMES_SALT_VENV"

// VenvDir is the virtualenv the tests run Salt from.
func VenvDir(repo string) string {
	if v := os.Getenv(VenvEnv); v != "" {
		return v
	}
	return filepath.Join(repo, ".venv")
}

// Version is the release of the Salt under test ("3006.29").
func Version(t T) string {
	t.Helper()
	return releaseOf(t, VenvDir(Need(t)))
}

// releaseOf reads a virtualenv's Salt release from its package metadata
// (importing Salt takes seconds).
func releaseOf(t T, venv string) string {
	out, err := exec.Command(filepath.Join(venv, "bin", "python"), "-c",
		"import importlib.metadata as m; print(m.version('salt'))").Output()
	if err != nil {
		t.Fatalf("reading the Salt release of %s: %v", venv, err)
	}
	return strings.TrimSpace(string(out))
}

// FreePort is a loopback TCP port nobody listens on right now
// (testenv.FreePort: never one the kernel may hand out on its own).
func FreePort(t T) int {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func newStack(t T, execPath string) *Stack {
	repo := Need(t)
	root, err := os.MkdirTemp("/tmp", "sv")
	if err != nil {
		t.Fatal(err)
	}
	s := &Stack{
		t: t, Repo: repo, Venv: VenvDir(repo), Root: root,
		Conf: filepath.Join(root, "etc"), MinionID: "node-1",
		StateDir: filepath.Join(root, "state"), ExecPath: execPath,
		SockDir: filepath.Join(root, "sock"),
		procs:   map[string]*exec.Cmd{}, confs: map[string]string{},
	}
	for _, d := range []string{s.Conf, filepath.Join(root, "pillar"), filepath.Join(root, "log"), s.SockDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(s.stop)
	return s
}

// common is the configuration master and minion share.
func (s *Stack) common() string { return s.commonFor(s.Root, s.StateDir) }

func (s *Stack) commonFor(root, stateDir string) string {
	roots := fmt.Sprintf("[%[1]s/salt/states, %[1]s/salt]", s.Repo)
	if s.extension != "" {
		roots = fmt.Sprintf("[%s/salt/states]", s.Repo)
	}
	if s.fileRootFirst != "" {
		roots = "[" + s.fileRootFirst + ", " + strings.TrimPrefix(roots, "[")
	}
	return fmt.Sprintf(`root_dir: %[1]s
user: root
file_roots:
  base: %[4]s
pillar_roots:
  base: [%[1]s/pillar]
salt_volumes:
  exec_path: %[2]s
  state_dir: %[3]s
log_level_logfile: info
`, root, s.ExecPath, stateDir, roots)
}

// Masterless writes a salt-call --local configuration; no daemons run.
func Masterless(t T, execPath string) *Stack { return MasterlessOpts(t, execPath, Options{}) }

// MasterlessOpts is Masterless with Options (MinionExtra and
// FileRootFirst; the others are for a master).
func MasterlessOpts(t T, execPath string, o Options) *Stack {
	s := newStack(t, execPath)
	s.fileRootFirst = o.FileRootFirst
	s.write("minion", s.common()+o.MinionExtra+fmt.Sprintf(`id: %s
file_client: local
log_file: %s/log/minion
`, s.MinionID, s.Root))
	return s
}

// Start runs salt-master and salt-minion (and salt-api when api is true) on
// loopback, and waits until the minion answers.
func Start(t T, execPath string, api bool) *Stack { return StartWith(t, execPath, api, "") }

// StartWith is Start with more master configuration (YAML appended).
func StartWith(t T, execPath string, api bool, masterExtra string) *Stack {
	return StartOpts(t, execPath, Options{API: api, MasterExtra: masterExtra})
}

// Options are what StartOpts adds to the stack's configuration.
type Options struct {
	API         bool
	MasterExtra string // YAML appended to the master config
	MinionExtra string // YAML appended to every minion config
	// SaltVolumes is YAML added under the minions' salt_volumes: key
	// (indented by two spaces), e.g. "overcommit_ratio: 0.5".
	SaltVolumes string
	// Venv runs another Salt than the one under test (a virtualenv).
	Venv string
	// Extension is a directory holding an installed Salt extension (pip
	// install --target): the daemons find it on their PYTHONPATH, and
	// file_roots hold only the formulas, no _modules to sync.
	Extension string
	// People are more eauth users beside the control plane's account:
	// backend ("file", "pam") -> user (or "group%") -> ACL.
	People map[string]map[string]any
	// FileUsers are more lines of the file eauth's password file.
	FileUsers map[string]string
	// FileRootFirst is a directory put before the repository's in
	// file_roots: its files win (e.g. salt_volumes/files/ of a test).
	FileRootFirst string
}

// StartOpts is Start with Options.
func StartOpts(t T, execPath string, o Options) *Stack {
	api, masterExtra := o.API, o.MasterExtra
	s := newStack(t, execPath)
	if o.Venv != "" {
		s.Venv = o.Venv
	}
	if o.People["pam"] != nil {
		// Salt's PAM eauth checks the password in a child Python, by
		// default /usr/bin/python3, which has no Salt when Salt comes from
		// pip. auth.pam.python names another, but Salt resolves symlinks,
		// and a virtualenv's python is a symlink to a Python without the
		// virtualenv: a two-line script that execs it by its own path.
		py := filepath.Join(s.Root, "python-for-pam")
		if err := os.WriteFile(py, []byte("#!/bin/sh\nexec "+s.bin("python3")+" \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		masterExtra += "auth.pam.python: " + py + "\n"
	}
	s.minionExtra, s.saltVolumes, s.extension, s.people = o.MinionExtra, o.SaltVolumes, o.Extension, o.People
	s.fileRootFirst = o.FileRootFirst
	s.pubPort, s.retPort = FreePort(t), FreePort(t)
	pub, ret := s.pubPort, s.retPort
	s.APIPort = FreePort(t)
	s.APIUser, s.APIPass = "salt-volumes", "test-password-"+filepath.Base(s.Root)
	users := s.APIUser + ":" + s.APIPass + "\n"
	for _, u := range slices.Sorted(maps.Keys(o.FileUsers)) {
		users += u + ":" + o.FileUsers[u] + "\n"
	}
	if err := os.WriteFile(filepath.Join(s.Conf, "api-users"), []byte(users), 0o600); err != nil {
		t.Fatal(err)
	}
	s.write("master", s.common()+fmt.Sprintf(`interface: 127.0.0.1
publish_port: %[2]d
ret_port: %[3]d
sock_dir: %[4]s
auto_accept: True
log_file: %[1]s/log/master
api_logfile: %[1]s/log/api
api_pidfile: %[1]s/api.pid
rest_cherrypy:
  host: 127.0.0.1
  port: %[5]d
  disable_ssl: True
`, s.Root, pub, ret, s.SockDir, s.APIPort)+s.shippedAuth()+masterExtra)
	s.write("minion", s.minionConfig(s.Root, s.StateDir, s.MinionID))

	s.spawn("master", "salt-master")
	s.waitFor("master event bus", 60*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(s.SockDir, "master_event_pub.ipc"))
		return err == nil
	})
	s.spawn("minion", "salt-minion")
	s.waitForMinion(s.MinionID)
	if api {
		s.startAPI()
	}
	return s
}

func (s *Stack) startAPI() {
	s.spawn("api", "salt-api")
	s.waitFor("salt-api", 60*time.Second, func() bool {
		resp, err := http.Get(s.APIURL())
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// UpgradeMaster does what a package upgrade does to the master host: the
// master and salt-api stop, and those of another Salt (the virtualenv
// venv) start on the same configuration, keys, job cache and sockets. The
// minions keep running their release, as they do until their own upgrade.
func (s *Stack) UpgradeMaster(venv string) {
	s.t.Helper()
	api := s.procs["api"] != nil
	s.kill("api")
	s.kill("master")
	s.Venv = venv
	s.spawn("master", "salt-master")
	s.waitForMinion(s.MinionID)
	if api {
		s.startAPI()
	}
}

// Version is the release of the Salt the stack's master runs now.
func (s *Stack) Version() string {
	s.t.Helper()
	return releaseOf(s.t, s.Venv)
}

// shippedAuth is the control plane's salt-api account exactly as
// deploy/master.d/salt-volumes.conf gives it to operators (clients and ACL),
// with the test's password file: the tests prove the shipped ACL is enough.
func (s *Stack) shippedAuth() string {
	b, err := os.ReadFile(filepath.Join(s.Repo, "deploy", "master.d", "salt-volumes.conf"))
	if err != nil {
		s.t.Fatal(err)
	}
	var conf struct {
		Clients      []string `yaml:"netapi_enable_clients"`
		ExternalAuth struct {
			File map[string]any `yaml:"file"`
		} `yaml:"external_auth"`
	}
	if err := yaml.Unmarshal(b, &conf); err != nil {
		s.t.Fatalf("deploy/master.d/salt-volumes.conf: %v", err)
	}
	acl, ok := conf.ExternalAuth.File[s.APIUser]
	if !ok || len(conf.Clients) == 0 {
		s.t.Fatalf("deploy/master.d/salt-volumes.conf: no external_auth:file:%s or netapi_enable_clients", s.APIUser)
	}
	eauth := map[string]any{"file": map[string]any{
		"^filename": filepath.Join(s.Conf, "api-users"),
		s.APIUser:   acl,
	}}
	for backend, users := range s.people {
		m, _ := eauth[backend].(map[string]any)
		if m == nil {
			m = map[string]any{}
			eauth[backend] = m
		}
		maps.Copy(m, users)
	}
	out, err := yaml.Marshal(map[string]any{
		"netapi_enable_clients": conf.Clients,
		"external_auth":         eauth,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return string(out)
}

func (s *Stack) minionConfig(root, stateDir, id string) string {
	common := s.commonFor(root, stateDir)
	if s.saltVolumes != "" {
		common = strings.Replace(common, "salt_volumes:\n", "salt_volumes:\n  "+strings.ReplaceAll(strings.TrimSpace(s.saltVolumes), "\n", "\n  ")+"\n", 1)
	}
	return common + s.minionExtra + fmt.Sprintf(`id: %[2]s
master: 127.0.0.1
master_port: %[3]d
publish_port: %[4]d
sock_dir: %[1]s/msock
log_file: %[5]s/log/minion-%[2]s
acceptance_wait_time: 1
`, root, id, s.retPort, s.pubPort, s.Root)
}

func (s *Stack) waitForMinion(id string) { s.WaitForMinion(id, 5*time.Second, 90*time.Second) }

// WaitForMinion waits up to limit until id answers test.ping, the first
// ping given up to ping (a minion in an emulated guest answers in
// seconds). A ping the minion misses is still a job it runs once it
// catches up, and so is the find_job the CLI sends after it: pinged at a
// steady pace, a guest starved of CPU fell further behind with each (on
// 2026-12-07 it answered pings 13 minutes late and never caught up). So
// the wait grows by half after each miss, to a minute (or ping, if
// longer) at most; a wait can so overrun limit by about a minute.
func (s *Stack) WaitForMinion(id string, ping, limit time.Duration) {
	wait := ping
	s.waitFor(id+" to answer", limit, func() bool {
		out, code := s.Salt(fmt.Sprintf("--timeout=%d", max(1, int(math.Ceil(wait.Seconds())))), id, "test.ping", "--out=json")
		if code == 0 && strings.Contains(out, "true") {
			return true
		}
		wait = min(wait*3/2, max(ping, time.Minute))
		return false
	})
}

// AddMinion starts one more salt-minion on this machine, standing in for
// another node: its own id, keys, cache and salt-volume-exec state dir (which
// it returns), the same master. Call after Start.
func (s *Stack) AddMinion(id string) string {
	root := filepath.Join(s.Root, id)
	conf, stateDir := filepath.Join(root, "etc"), filepath.Join(root, "state")
	if err := os.MkdirAll(conf, 0o700); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "minion"), []byte(s.minionConfig(root, stateDir, id)), 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.confs["minion-"+id] = conf
	s.spawn("minion-"+id, "salt-minion")
	s.waitForMinion(id)
	return stateDir
}

// StopMinion stops a minion (the stack's own, or one started with
// AddMinion): jobs for it stay without a return.
func (s *Stack) StopMinion(id string) {
	if id == s.MinionID {
		// The stack's own minion runs under another name.
		s.kill("minion")
		return
	}
	s.kill("minion-" + id)
}

// ReinstallMinion stands for a node reinstalled with its disks (and its
// salt-volume-exec state dir) intact: the minion started with AddMinion
// stops, its key is deleted on the master and its own keys and cache are
// gone, and it starts again with a new key under the same id, which the
// master accepts. It returns the key's fingerprints before and after.
func (s *Stack) ReinstallMinion(id string) (before, after string) {
	root := filepath.Join(s.Root, id)
	finger := func() string {
		out, _ := s.run("salt-key", "--finger", id, "--out=json")
		return strings.TrimSpace(out)
	}
	before = finger()
	s.kill("minion-" + id)
	if out, code := s.run("salt-key", "-y", "-d", id); code != 0 {
		s.t.Fatalf("salt-key -d %s: %s", id, out)
	}
	for _, d := range []string{filepath.Join(root, "etc", "salt", "pki"), filepath.Join(root, "var", "cache", "salt", "minion")} {
		if err := os.RemoveAll(d); err != nil {
			s.t.Fatal(err)
		}
	}
	s.spawn("minion-"+id, "salt-minion")
	s.waitForMinion(id)
	return before, finger()
}

// StopMaster stops salt-master (SIGTERM to its process group, as a service
// manager would).
func (s *Stack) StopMaster() { s.kill("master") }

// Ports are the master's publish and request server ports (on 127.0.0.1),
// for minions that are not this machine's processes (booted guests).
func (s *Stack) Ports() (publish, ret int) { return s.pubPort, s.retPort }

// APIURL is the salt-api base URL.
func (s *Stack) APIURL() string { return fmt.Sprintf("http://127.0.0.1:%d", s.APIPort) }

// EventSocket is the master event bus's Unix socket.
func (s *Stack) EventSocket() string { return filepath.Join(s.SockDir, "master_event_pub.ipc") }

func (s *Stack) write(name, content string) {
	if err := os.WriteFile(filepath.Join(s.Conf, name), []byte(content), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Stack) bin(name string) string { return filepath.Join(s.Venv, "bin", name) }

func (s *Stack) spawn(name, prog string) {
	conf := s.Conf
	if c, ok := s.confs[name]; ok {
		conf = c
	}
	cmd := exec.Command(s.bin(prog), "-c", conf, "-l", "warning")
	logf, err := os.Create(filepath.Join(s.Root, "log", name+".out"))
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if s.extension != "" {
		cmd.Env = append(os.Environ(), "PYTHONPATH="+s.extension)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // we kill the whole group
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting %s: %v", prog, err)
	}
	s.procs[name] = cmd
}

// Restart stops a daemon by pid and starts it again. A restarted master is
// back when its minions answer again: a job published before they
// reconnect is lost, and a test would wait for it in vain.
func (s *Stack) Restart(name string) {
	prog := map[string]string{"master": "salt-master", "minion": "salt-minion", "api": "salt-api"}[name]
	s.kill(name)
	s.spawn(name, prog)
	if name == "master" {
		s.waitForMinion(s.MinionID)
		for n := range s.confs {
			s.waitForMinion(strings.TrimPrefix(n, "minion-"))
		}
	}
}

func (s *Stack) kill(name string) {
	cmd := s.procs[name]
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	// The daemon's own children (the minion's process manager, the
	// master's workers) can outlive it by seconds on a busy machine; a
	// daemon started again meanwhile under the same pidfile finds "an
	// instance already running" and exits.
	// Bounded: a zombie nobody reaps still answers signal 0.
	groupGone := func(limit time.Duration) bool {
		for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if syscall.Kill(-cmd.Process.Pid, 0) != nil {
				return true
			}
		}
		return false
	}
	if !groupGone(10 * time.Second) {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		groupGone(5 * time.Second)
	}
	delete(s.procs, name)
}

func (s *Stack) waitFor(what string, limit time.Duration, ok func() bool) {
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			s.dumpLogs()
			s.t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Stop stops every daemon and detaches what they left (it also runs when
// the test ends).
func (s *Stack) Stop() { s.stop() }

func (s *Stack) stop() {
	for name := range s.confs {
		s.kill(name)
	}
	for _, name := range []string{"api", "minion", "master"} {
		s.kill(name)
	}
	s.detachLoops()
	if s.t.Failed() {
		s.dumpLogs()
		s.t.Logf("salt root kept for inspection: %s", s.Root)
		return
	}
	os.RemoveAll(s.Root)
}

// detachLoops detaches the loop devices backed by files of this stack
// that are still attached once its minions are dead: a job a minion ran
// after the test's own cleanup (a slow run on a busy machine) would
// otherwise keep one of the machine's shared loop devices.
func (s *Stack) detachLoops() {
	devs, _ := loopdev.Bound()
	for _, d := range devs {
		if b, err := loopdev.BackingFile(d.Name); err == nil && strings.HasPrefix(b, s.Root+"/") {
			_ = loopdev.RemovePartition(d.Name, 1)
			if err := loopdev.Detach(context.Background(), d, 5*time.Second); err != nil {
				s.t.Logf("saltstack: %s (%s) left attached: %v", d.Path, b, err)
			} else {
				s.t.Logf("saltstack: detached %s (%s), attached after the test's cleanup", d.Path, b)
			}
			// Its links went up with it: a sparse file is named by its
			// volume's uuid.
			testenv.RemoveLinks(filepath.Base(b))
		}
	}
}

func (s *Stack) dumpLogs() {
	logs, _ := filepath.Glob(filepath.Join(s.Root, "log", "*"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		s.t.Logf("--- %s (tail)\n%s", l, b)
	}
}

// run runs a Salt CLI tool and returns stdout and the exit code.
func (s *Stack) run(prog string, args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), runLimit(args))
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin(prog), append([]string{"-c", s.Conf}, args...)...)
	out, errs, code := testenv.Run(s.t, cmd)
	if code != 0 && errs != "" {
		s.t.Logf("%s %s: exit %d: %s", prog, strings.Join(args, " "), code, tail(errs, 2000))
	}
	return out, code
}

// runLimit is how long a Salt command may run before it is killed: 5
// minutes, or the command's own --timeout plus 2 minutes when that is
// longer. A cap below the timeout the test asked Salt for turned a slow
// job into exit -1 (CI, 2026-12-07: state.apply --timeout=600 on two
// emulated guests killed at 5 min).
func runLimit(args []string) time.Duration {
	limit := 5 * time.Minute
	for _, a := range args {
		v, ok := strings.CutPrefix(a, "--timeout=")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(v); err == nil && time.Duration(n)*time.Second+2*time.Minute > limit {
			limit = time.Duration(n)*time.Second + 2*time.Minute
		}
	}
	return limit
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// SaltCall runs salt-call (with --local for a masterless stack).
func (s *Stack) SaltCall(args ...string) (string, int) {
	if _, ok := s.procs["master"]; !ok {
		args = append([]string{"--local"}, args...)
	}
	return s.run("salt-call", args...)
}

// Salt runs the salt CLI on the master.
func (s *Stack) Salt(args ...string) (string, int) { return s.run("salt", args...) }

// SyncAll pushes the salt_volumes modules to the minions tgt matches. The
// timeout is generous: syncing right after a minion starts, on a loaded
// two-core machine, can take longer than Salt's default 5 s.
func (s *Stack) SyncAll(tgt string) (string, int) {
	return s.run("salt", "--timeout=60", tgt, "saltutil.sync_all", "--out=json")
}

// SaltRun runs salt-run on the master.
func (s *Stack) SaltRun(args ...string) (string, int) { return s.run("salt-run", args...) }

// JSON decodes Salt's --out=json output.
func JSON(t T, out string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, tail(out, 3000))
	}
	return m
}

// Pillar renders a pillar= argument.
func Pillar(v any) string {
	b, _ := json.Marshal(v)
	return "pillar=" + string(b)
}

// Event is one event seen on the master bus.
type Event struct {
	Tag  string         `json:"tag"`
	Data map[string]any `json:"data"`
}

// Listener follows the master event bus through Salt's own Python client.
type Listener struct {
	cmd    *exec.Cmd
	events chan Event
}

// Listen subscribes to the master event bus; events arrive on Events().
func (s *Stack) Listen() *Listener {
	cmd := exec.Command(s.bin("python"), filepath.Join(s.Repo, "test", "saltstack", "events.py"), s.Conf)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	l := &Listener{cmd: cmd, events: make(chan Event, 10000)}
	ready := make(chan struct{})
	go func() {
		dec := json.NewDecoder(stdout)
		for {
			var ev Event
			if err := dec.Decode(&ev); err != nil {
				close(l.events)
				return
			}
			if ev.Tag == "__ready__" {
				close(ready)
				continue
			}
			l.events <- ev
		}
	}()
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		s.t.Fatal("event listener did not connect")
	}
	s.t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	return l
}

// Collect gathers events until match returns true or the time runs out.
func (l *Listener) Collect(limit time.Duration, match func(Event) bool) ([]Event, bool) {
	var got []Event
	deadline := time.After(limit)
	for {
		select {
		case ev, ok := <-l.events:
			if !ok {
				return got, false
			}
			got = append(got, ev)
			if match(ev) {
				return got, true
			}
		case <-deadline:
			return got, false
		}
	}
}

// Lines are the supported Salt lines, oldest first (make test-salt SALT=...).
var Lines = []string{"3006", "3007", "3008"}

// LineVenv is the virtualenv of a Salt line's tested release, created once
// in the cache by scripts/salt-venv.sh (the pinned line's is .venv).
func LineVenv(t T, line string) string {
	t.Helper()
	repo := Need(t)
	cmd := exec.Command(filepath.Join(repo, "scripts", "salt-venv.sh"), line)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/salt-venv.sh %s: %v", line, err)
	}
	return strings.TrimSpace(string(out))
}

// ReleaseOf is the Salt release installed in a virtualenv.
func ReleaseOf(t T, venv string) string { return releaseOf(t, venv) }

// BusFraming is what a Salt release puts on the master's event socket:
// 3006.26 added a 4-byte length before each frame of its ipc transport;
// 3007 and 3008 serve the socket with the tcp transport, without one.
func BusFraming(release string) (events.Framing, error) {
	var line, point int
	if _, err := fmt.Sscanf(release, "%d.%d", &line, &point); err != nil {
		return events.FramingUnknown, fmt.Errorf("salt release %q: %w", release, err)
	}
	if line == 3006 && point >= 26 {
		return events.FramingLengthPrefixed, nil
	}
	return events.FramingPlain, nil
}
