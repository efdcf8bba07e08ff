// Package kubecluster runs a real Kubernetes control plane on loopback for
// the tests and the demo: etcd, kube-apiserver, kube-controller-manager (its
// PV controller binds claims) and kube-scheduler (it picks nodes for
// WaitForFirstConsumer claims), built from the Go module proxy by
// scripts/kube-tools.sh. Start runs no kubelet: Node objects are created and
// marked Ready by the harness, and pods are scheduled but never run;
// StartWithKubelet adds a real kubelet on containerd, and pods run.
package kubecluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/salt-volumes/salt-volumes/test/testcerts"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// ControlUser is the identity salt-volumes serve uses: it has only what
// deploy/kubernetes/rbac.yaml grants.
const ControlUser = "salt-volumes"

// Cluster is one running control plane.
type Cluster struct {
	Dir    string // certificates, kubeconfigs, data and logs
	BinDir string // where etcd, kube-* and kubectl are
	URL    string
	// AdminKubeconfig is cluster-admin (system:masters); ControlKubeconfig
	// is the control plane's identity.
	AdminKubeconfig   string
	ControlKubeconfig string
	Admin             *kubernetes.Clientset

	procs []*exec.Cmd
	// controllers are started besides the PV ones (StartWithKubelet: the
	// node lifecycle controller, which lifts a new node's not-ready taint).
	controllers string
	// nodeDir and ctrSock: the kubelet's and containerd's, when started.
	nodeDir, ctrSock string
	// serviceAccounts: pods get their service account's token and the
	// cluster's CA mounted (admission, token and CA publishing), as
	// in-cluster clients expect (StartWithKubelet).
	serviceAccounts bool
	// APIPort is the API server's port on 127.0.0.1.
	APIPort int
}

// Tools builds (first time only) and returns the directory holding the
// binaries: scripts/kube-tools.sh, which setup also runs.
func Tools(repo string) (string, error) { return testenv.CachedBuild(repo, "kube-tools.sh") }

// Start brings the control plane up under dir and applies the RBAC
// manifest at rbac (deploy/kubernetes/rbac.yaml) with kubectl. Stop it with
// Stop, also on error paths.
func Start(ctx context.Context, dir, binDir, rbac string) (*Cluster, error) {
	c := &Cluster{Dir: dir, BinDir: binDir}
	if err := os.MkdirAll(filepath.Join(dir, "log"), 0o700); err != nil {
		return nil, err
	}
	if err := c.start(ctx, rbac); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, rbac string) error {
	p := func(name string) string { return filepath.Join(c.Dir, name) }
	if err := writeCerts(c.Dir); err != nil {
		return err
	}
	tokens := map[string]string{}
	var lines []string
	for i, u := range []struct{ user, groups string }{
		{"admin", "system:masters"}, {"system:kube-controller-manager", "system:masters"},
		{"system:kube-scheduler", "system:masters"}, {ControlUser, ""},
	} {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		tokens[u.user] = hex.EncodeToString(b)
		lines = append(lines, fmt.Sprintf("%s,%s,%d,%q", tokens[u.user], u.user, i+1, u.groups))
	}
	if err := os.WriteFile(p("tokens.csv"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	ports := make([]int, 3)
	for i := range ports {
		var err error
		if ports[i], err = testenv.FreePort(); err != nil {
			return err
		}
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if err := c.spawn("etcd", "--data-dir", p("etcd"), "--name", "default",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn",
		"--quota-backend-bytes", "1073741824"); err != nil {
		return err
	}
	c.URL = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	c.APIPort = ports[2]
	admission := []string{"--disable-admission-plugins", "ServiceAccount"}
	if c.serviceAccounts {
		admission = nil
	}
	if err := c.spawn("kube-apiserver", append([]string{"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(ports[2]),
		// One address, no kubernetes Service endpoints to keep.
		"--endpoint-reconciler-type", "none",
		"--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"),
		"--token-auth-file", p("tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", p("sa.key"), "--service-account-signing-key-file", p("sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--cert-dir", p("certs")},
		// Unless serviceAccounts, no service account exists to mount:
		// pods get none.
		admission...)...); err != nil {
		return err
	}
	kc := func(name, user string) (string, error) {
		path := p(name + ".kubeconfig")
		return path, writeKubeconfig(path, c.URL, p("ca.crt"), tokens[user])
	}
	var err error
	if c.AdminKubeconfig, err = kc("admin", "admin"); err != nil {
		return err
	}
	if c.ControlKubeconfig, err = kc("salt-volumes", ControlUser); err != nil {
		return err
	}
	kcm, err := kc("controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	sched, err := kc("scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx, tokens["admin"]); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.AdminKubeconfig)
	if err != nil {
		return err
	}
	if c.Admin, err = kubernetes.NewForConfig(rc); err != nil {
		return err
	}
	// Only the controllers a local volume's life involves: binding, the
	// PV and PVC protection finalizers. Without the node lifecycle
	// controller, Nodes the harness marked Ready stay Ready.
	controllers := "persistentvolume-binder-controller,persistentvolume-protection-controller,persistentvolumeclaim-protection-controller"
	if c.controllers != "" {
		controllers += "," + c.controllers
	}
	kcmArgs := []string{"--kubeconfig", kcm, "--leader-elect=false", "--controllers", controllers, "--secure-port", "0", "--v", "1"}
	if c.serviceAccounts {
		kcmArgs = append(kcmArgs, "--root-ca-file", p("ca.crt"))
	}
	if err := c.spawn("kube-controller-manager", kcmArgs...); err != nil {
		return err
	}
	if err := c.spawn("kube-scheduler", "--kubeconfig", sched, "--leader-elect=false", "--secure-port", "0", "--v", "1"); err != nil {
		return err
	}
	if rbac != "" {
		if out, err := c.Kubectl("apply", "-f", rbac); err != nil {
			return fmt.Errorf("kubectl apply -f %s: %v\n%s", rbac, err, out)
		}
	}
	return nil
}

func (c *Cluster) spawn(name string, args ...string) error {
	logf, err := os.Create(filepath.Join(c.Dir, "log", name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(c.BinDir, name), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c.procs = append(c.procs, cmd)
	return nil
}

func (c *Cluster) waitReady(ctx context.Context, token string) error {
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(c.Dir, "ca.crt"))
	if err != nil {
		return err
	}
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after 90s (%s); see %s", last, filepath.Join(c.Dir, "log"))
}

// Kubectl runs the kubectl it built as cluster-admin.
func (c *Cluster) Kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", c.AdminKubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// AddNode creates a Ready, schedulable Node, as a kubelet registering
// would; its kubernetes.io/hostname label is its name.
func (c *Cluster) AddNode(ctx context.Context, name string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64",
	}}}
	created, err := c.Admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods: resource.MustParse("110"),
	}
	now := metav1.Now()
	created.Status = corev1.NodeStatus{Capacity: res, Allocatable: res, Conditions: []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "marked Ready by the test harness (there is no kubelet)", LastHeartbeatTime: now, LastTransitionTime: now,
	}}}
	updated, err := c.Admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	// The API server taints new nodes not-ready; the node lifecycle
	// controller (not run here) lifts it once the kubelet reports Ready.
	updated.Spec.Taints = nil
	_, err = c.Admin.CoreV1().Nodes().Update(ctx, updated, metav1.UpdateOptions{})
	return err
}

// Stop kills every process, the last started first.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		cmd := c.procs[i]
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	c.procs = nil
	c.cleanNode()
}

// Logs returns the tail of each component's log (for failed tests).
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "containerd", "kubelet"} {
		if _, err := os.Stat(filepath.Join(c.Dir, "log", name+".log")); err != nil {
			continue
		}
		data, _ := os.ReadFile(filepath.Join(c.Dir, "log", name+".log"))
		s := string(data)
		if len(s) > n {
			s = s[len(s)-n:]
		}
		fmt.Fprintf(&b, "--- %s (tail)\n%s\n", name, s)
	}
	return b.String()
}

func writeKubeconfig(path, server, ca, token string) error {
	doc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: user
  user:
    token: %s
contexts:
- name: local
  context:
    cluster: local
    user: user
current-context: local
`, server, ca, token)
	return os.WriteFile(path, []byte(doc), 0o600)
}

// writeCerts makes a CA, the API server's serving certificate for
// 127.0.0.1 and localhost, and the service-account signing key.
func writeCerts(dir string) error {
	ca, err := testcerts.NewCA("salt-volumes test CA")
	if err != nil {
		return err
	}
	if err := ca.WriteCA(filepath.Join(dir, "ca.crt")); err != nil {
		return err
	}
	if err := ca.Issue(dir, "apiserver", "kube-apiserver", true, "kubernetes", "kubernetes.default.svc"); err != nil {
		return err
	}
	// The service-account signing key.
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(sa)}), 0o600)
}
