// Package etcdcluster runs a real etcd cluster of one to five members on
// loopback for the tests, the benchmarks and the HA demo: each member a
// process of its own with its own data directory, so that a test can kill,
// pause and restart members as an operator's machines fail.
package etcdcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/salt-volumes/salt-volumes/test/testcerts"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// Cluster is a running etcd cluster.
type Cluster struct {
	Dir       string
	Bin       string
	Endpoints []string // client URLs, one per member
	// With TLS: the CA of the members' certificates and a client
	// certificate they accept (client certificate authentication on).
	CAFile, CertFile, KeyFile string
	members                   []*member
}

type member struct {
	name, client, peer string
	args               []string
	cmd                *exec.Cmd
	log                *os.File
}

// Binary finds the etcd that scripts/kube-tools.sh built (repo: the
// repository's root) or one on PATH.
func Binary(repo string) (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	dir, err := testenv.CachedBuild(repo, "kube-tools.sh")
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "etcd"), nil
}

// Start starts n members under dir and waits until the cluster answers.
// Stop it with Stop, also on error paths.
func Start(ctx context.Context, dir, bin string, n int) (*Cluster, error) {
	return start(ctx, dir, bin, n, false)
}

// StartTLS is Start with clients served over TLS, client certificates
// required.
func StartTLS(ctx context.Context, dir, bin string, n int) (*Cluster, error) {
	return start(ctx, dir, bin, n, true)
}

func start(ctx context.Context, dir, bin string, n int, withTLS bool) (*Cluster, error) {
	c := &Cluster{Dir: dir, Bin: bin}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	scheme := "http"
	if withTLS {
		if err := c.writeCerts(); err != nil {
			return nil, err
		}
		scheme = "https"
	}
	var initial []string
	for i := range n {
		cp, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		pp, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		m := &member{name: fmt.Sprintf("m%d", i), client: fmt.Sprintf("%s://127.0.0.1:%d", scheme, cp), peer: fmt.Sprintf("http://127.0.0.1:%d", pp)}
		c.members = append(c.members, m)
		c.Endpoints = append(c.Endpoints, m.client)
		initial = append(initial, m.name+"="+m.peer)
	}
	for _, m := range c.members {
		m.args = []string{"--name", m.name, "--data-dir", filepath.Join(dir, m.name),
			"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
			"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", filepath.Base(dir), "--log-level", "warn",
			// Tests want failures noticed quickly, not a WAN's patience.
			"--heartbeat-interval", "50", "--election-timeout", "500"}
		if withTLS {
			m.args = append(m.args, "--cert-file", filepath.Join(dir, "server.crt"), "--key-file", filepath.Join(dir, "server.key"),
				"--client-cert-auth", "--trusted-ca-file", c.CAFile)
		}
	}
	for i := range c.members {
		if err := c.StartMember(i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx, 60*time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// StartMember starts (or restarts) member i with its data directory.
func (c *Cluster) StartMember(i int) error {
	m := c.members[i]
	if m.cmd != nil {
		return fmt.Errorf("etcd member %s is running", m.name)
	}
	logf, err := os.OpenFile(filepath.Join(c.Dir, m.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.Bin, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting etcd member %s: %w", m.name, err)
	}
	m.cmd, m.log = cmd, logf
	return nil
}

// KillMember kills member i (SIGKILL) and waits for it to exit.
func (c *Cluster) KillMember(i int) {
	m := c.members[i]
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
	m.log.Close()
	m.cmd = nil
}

// Stop kills every member.
func (c *Cluster) Stop() {
	for i := range c.members {
		c.KillMember(i)
	}
}

// WaitHealthy waits until a write through every running member's endpoint
// succeeds (quorum and a leader).
func (c *Cluster) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if last = c.probe(ctx); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("etcd cluster in %s not healthy after %s: %v", c.Dir, timeout, last)
}

func (c *Cluster) probe(ctx context.Context) error {
	for i, m := range c.members {
		if m.cmd == nil {
			continue
		}
		// Quiet: a member still starting is expected here.
		cli, err := c.client([]string{c.Endpoints[i]}, zap.NewNop())
		if err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = cli.Put(pctx, "/etcdcluster-probe", m.name)
		cancel()
		cli.Close()
		if err != nil {
			return fmt.Errorf("member %s: %w", m.name, err)
		}
	}
	return nil
}

// Client returns a client of every member.
func (c *Cluster) Client() (*clientv3.Client, error) { return c.client(c.Endpoints, nil) }

func (c *Cluster) client(endpoints []string, log *zap.Logger) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: log}
	if c.CAFile != "" {
		pool := x509.NewCertPool()
		ca, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, err
		}
		pool.AppendCertsFromPEM(ca)
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.TLS = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	return clientv3.New(cfg)
}

// writeCerts makes the CA, the members' server certificate and a client
// certificate.
func (c *Cluster) writeCerts() error {
	ca, err := testcerts.NewCA("salt-volumes test etcd CA")
	if err != nil {
		return err
	}
	c.CAFile = filepath.Join(c.Dir, "ca.crt")
	c.CertFile, c.KeyFile = filepath.Join(c.Dir, "client.crt"), filepath.Join(c.Dir, "client.key")
	if err := ca.WriteCA(c.CAFile); err != nil {
		return err
	}
	if err := ca.Issue(c.Dir, "server", "etcd", true); err != nil {
		return err
	}
	return ca.Issue(c.Dir, "client", "salt-volumes", false)
}
