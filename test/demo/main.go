// Command demo is `make demo`: a salt-master, salt-minion and salt-api on
// loopback (from .venv), `salt-volumes serve` on top, two real volumes
// created through the CLI; it keeps running until Ctrl-C or SIGTERM, then
// deletes what it created and stops what it started.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// runner adapts the test harness to a program: a fatal error tears down
// what was started, in reverse order, and exits.
type runner struct{ cleanups []func() }

func (r *runner) Helper()                        {}
func (r *runner) Logf(format string, a ...any)   { fmt.Printf("  "+format+"\n", a...) }
func (r *runner) Fatal(a ...any)                 { r.die(fmt.Sprint(a...)) }
func (r *runner) Fatalf(format string, a ...any) { r.die(fmt.Sprintf(format, a...)) }
func (r *runner) Skip(a ...any)                  { r.die(fmt.Sprint(a...)) }
func (r *runner) Cleanup(f func())               { r.cleanups = append(r.cleanups, f) }
func (r *runner) Failed() bool                   { return false }
func (r *runner) die(msg string)                 { fmt.Fprintln(os.Stderr, "demo:", msg); r.teardown(); os.Exit(1) }
func (r *runner) teardown() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

func step(format string, a ...any) { fmt.Printf("\n==> "+format+"\n", a...) }

func main() {
	once := flag.Bool("once", false, "tear down right after showing the volumes (smoke test)")
	listen := flag.String("listen", "127.0.0.1:8080", "control plane address (a free port is used if taken)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (loop devices); run it as root or with sudo")
		os.Exit(1)
	}
	repo, err := saltstack.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	bin := func(n string) string { return filepath.Join(repo, "bin", n) }
	r := &runner{}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)

	step("starting salt-master, salt-minion and salt-api on loopback")
	s := saltstack.Start(r, bin("salt-volume-exec"), true)
	fmt.Printf("  salt root %s, salt-api %s, minion %s\n", s.Root, s.APIURL(), s.MinionID)
	if out, code := s.Salt(s.MinionID, "saltutil.sync_all", "--out=json"); code != 0 {
		r.Fatalf("saltutil.sync_all failed: %s", out)
	}
	r.Cleanup(func() { testenv.Cleanup(s.StateDir, nil, r.Logf) })

	step("starting salt-volumes serve")
	if l, err := net.Listen("tcp", *listen); err == nil {
		l.Close()
	} else {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			r.Fatal(err)
		}
		*listen = l.Addr().String()
		l.Close()
	}
	tok := make([]byte, 24)
	_, _ = rand.Read(tok)
	token := hex.EncodeToString(tok)
	cfg := filepath.Join(s.Root, "control.yaml")
	err = os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: %s
token: %s
store: %s/control/volumes.db
salt:
  url: %s
  username: %s
  password: %s
  eauth: file
events:
  source: bus
  socket: %s
`, *listen, token, s.Root, s.APIURL(), s.APIUser, s.APIPass, s.EventSocket())), 0o600)
	if err != nil {
		r.Fatal(err)
	}
	logPath := filepath.Join(s.Root, "log", "control-plane")
	logf, err := os.Create(logPath)
	if err != nil {
		r.Fatal(err)
	}
	serve := exec.Command(bin("salt-volumes"), "serve", "--config", cfg)
	serve.Stdout, serve.Stderr = logf, logf
	if err := serve.Start(); err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		_ = serve.Wait()
	})
	url := "http://" + *listen
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			r.Fatalf("salt-volumes serve not ready; see %s", logPath)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("  listening on %s (log %s)\n", url, logPath)

	cli := func(args ...string) error {
		fmt.Printf("  $ salt-volumes %s\n", join(args))
		cmd := exec.Command(bin("salt-volumes"), args...)
		cmd.Env = append(os.Environ(), "SALT_VOLUMES_URL="+url, "SALT_VOLUMES_TOKEN="+token)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		return cmd.Run()
	}
	created := []string{}
	r.Cleanup(func() {
		step("deleting the demo volumes (loop devices detached, sparse files removed)")
		for _, n := range created {
			_ = cli("rm", n, "--wait", "--timeout", "2m")
		}
	})
	step("creating a sparse ext4 filesystem volume and a sparse block volume")
	for _, args := range [][]string{
		{"create", "demo-fs", "--node", s.MinionID, "--size", "1Gi", "--fs", "ext4"},
		{"create", "demo-block", "--node", s.MinionID, "--size", "512Mi", "--mode", "Block"},
	} {
		if err := cli(args...); err != nil {
			r.Fatalf("create failed: %v", err)
		}
		created = append(created, args[1])
	}
	for _, n := range created {
		if err := cli("wait", n, "--for", "Available", "--timeout", "2m"); err != nil {
			r.Fatalf("%s did not become Available: %v", n, err)
		}
	}
	step("volumes")
	_ = cli("ls")
	step("the same volume as a Kubernetes local PersistentVolume (docs/kubernetes.md)")
	_ = cli("pv", "demo-fs")

	step("the stack is running; in another shell:")
	fmt.Printf("export SALT_VOLUMES_URL=%s\n", url)
	fmt.Printf("export SALT_VOLUMES_TOKEN=%s\n", token)
	fmt.Printf("  %s/bin/salt-volumes ls\n", repo)
	fmt.Printf("  web UI: %s/ (paste the token when asked)\n", url)
	if !*once {
		fmt.Println("\nCtrl-C (or SIGTERM) stops everything and detaches what the demo attached.")
		<-sigs
	}
	r.teardown()
	step("stopped")
}

func join(a []string) string { return strings.Join(a, " ") }
