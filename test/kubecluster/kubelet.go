package kubecluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/salt-volumes/salt-volumes/internal/image"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// BusyboxImage is the image StartWithKubelet imports: Debian's static
// busybox with its applets; also the pods' sandbox (pause) image.
const BusyboxImage = "salt-volumes.io/test-busybox:1"

// StartWithKubelet is Start plus a real kubelet on containerd registering
// node, so that pods really run (host network, loopback only, images
// imported from files: imagePullPolicy Never). One per machine at a time:
// containerd's shims and the kubelet keep a few paths outside dir
// (/run/containerd, /var/lib/kubelet/device-plugins), cleaned up by Stop.
func StartWithKubelet(ctx context.Context, dir, binDir, rbac, node string) (*Cluster, error) {
	// Besides the node lifecycle controller (it lifts a new node's
	// not-ready taint): service accounts and their CA for in-cluster
	// clients, and Deployments for serve's own manifest.
	c := &Cluster{Dir: dir, BinDir: binDir, serviceAccounts: true,
		controllers: "node-lifecycle-controller,serviceaccount-controller,root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller"}
	if err := os.MkdirAll(filepath.Join(dir, "log"), 0o700); err != nil {
		return nil, err
	}
	if err := c.start(ctx, rbac); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.startKubelet(ctx, node); err != nil {
		c.Stop()
		return nil, err
	}
	// A pod is refused until its namespace's default service account
	// exists, and stays ContainerCreating until the CA's ConfigMap does.
	if err := c.waitFor(ctx, "default/default service account and kube-root-ca.crt", 60*time.Second, func() bool {
		_, err1 := c.Admin.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		_, err2 := c.Admin.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err1 == nil && err2 == nil
	}); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// PodLogs is the tail of every container log of the namespace's pods
// (kubectl logs cannot reach this node: it has no address, the kubelet
// refusing a loopback one).
func (c *Cluster) PodLogs(namespace string, n int) string {
	files, _ := filepath.Glob(filepath.Join(c.nodeDir, "pod-logs", namespace+"_*", "*", "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		s := string(data)
		if len(s) > n {
			s = s[len(s)-n:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", strings.TrimPrefix(f, c.nodeDir), s)
	}
	return b.String()
}

// ImportImage imports an OCI archive (image.Write) into the node's
// containerd, where pods with imagePullPolicy Never or IfNotPresent find it.
func (c *Cluster) ImportImage(archive string) error {
	if out, err := exec.Command("ctr", "--address", c.ctrSock, "-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images import %s: %v\n%s", archive, err, out)
	}
	return nil
}

func (c *Cluster) startKubelet(ctx context.Context, node string) error {
	for _, prog := range []string{"containerd", "ctr", "runc", "/usr/lib/cni/loopback", "/bin/busybox"} {
		if _, err := exec.LookPath(prog); err != nil {
			return fmt.Errorf("%s is missing: make setup installs containerd, runc, containernetworking-plugins and busybox-static", prog)
		}
	}
	d := func(parts ...string) string { return filepath.Join(append([]string{c.Dir, "node"}, parts...)...) }
	for _, sub := range []string{"containerd", "cni", "kubelet", "certs"} {
		if err := os.MkdirAll(d(sub), 0o700); err != nil {
			return err
		}
	}
	c.nodeDir = d()
	c.ctrSock = d("containerd", "containerd.sock")
	// No pod addresses: host-network pods only; containerd still wants a
	// network config before it calls the node's network ready.
	if err := os.WriteFile(d("cni", "10-lo.conflist"), []byte(`{"cniVersion":"1.0.0","name":"lo","plugins":[{"type":"loopback"}]}`), 0o600); err != nil {
		return err
	}
	// restrict_oom_score_adj: this machine gives no CAP_SYS_RESOURCE, and
	// runc fails every sandbox trying to lower its OOM score.
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, d("containerd", "root"), d("containerd", "state"), c.ctrSock, BusyboxImage, d("cni"))
	if err := os.WriteFile(d("containerd", "config.toml"), []byte(conf), 0o600); err != nil {
		return err
	}
	if err := c.spawnPath("containerd", "containerd", "--config", d("containerd", "config.toml")); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "containerd", 30*time.Second, func() bool {
		return exec.Command("ctr", "--address", c.ctrSock, "version").Run() == nil
	}); err != nil {
		return err
	}
	archive := d("busybox.tar")
	if err := writeBusybox(archive); err != nil {
		return err
	}
	if err := c.ImportImage(archive); err != nil {
		return err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return err
	}
	// failCgroupV1: this machine mounts cgroup v1. No QoS cgroups: nothing
	// of the kubelet's is left in the host's cgroup tree after it.
	kcfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzPort: 0
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://%s
evictionHard: {memory.available: 50Mi, nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: ""
registerNode: true
podLogsDir: %s
`, port, c.ctrSock, d("pod-logs"))
	if err := os.WriteFile(d("kubelet.yaml"), []byte(kcfg), 0o600); err != nil {
		return err
	}
	if err := c.spawn("kubelet", "--config", d("kubelet.yaml"), "--kubeconfig", c.AdminKubeconfig,
		"--root-dir", d("kubelet"), "--cert-dir", d("certs"), "--hostname-override", node, "--node-ip", "127.0.0.1", "--v", "1"); err != nil {
		return err
	}
	return c.waitFor(ctx, "node "+node+" Ready", 90*time.Second, func() bool {
		n, err := c.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return len(n.Spec.Taints) == 0
			}
		}
		return false
	})
}

// writeBusybox writes the test image: /bin/busybox and a link per applet.
func writeBusybox(out string) error {
	list, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	files := []image.File{{Path: "/bin/busybox", Source: "/bin/busybox", Mode: 0o755}}
	sc := bufio.NewScanner(strings.NewReader(string(list)))
	for sc.Scan() {
		if a := strings.TrimSpace(sc.Text()); a != "" && a != "busybox" {
			files = append(files, image.File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	_, err = image.Write(out, image.Spec{Ref: BusyboxImage, Files: files, Entrypoint: []string{"/bin/sleep", "2147483647"},
		Env: []string{"PATH=/bin"}})
	return err
}

func (c *Cluster) waitFor(ctx context.Context, what string, limit time.Duration, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if ok() {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s: not within %s; see %s", what, limit, filepath.Join(c.Dir, "log"))
}

// spawnPath is spawn for a program found on PATH (Debian's containerd).
func (c *Cluster) spawnPath(logName, prog string, args ...string) error {
	path, err := exec.LookPath(prog)
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(c.Dir, "log", logName+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", prog, err)
	}
	c.procs = append(c.procs, cmd)
	return nil
}

// cleanNode removes what containerd and the kubelet leave outside their
// directories or alive after them: container shims (they outlive
// containerd by design), mounts under the node's directory, containerd's
// runtime directory and the kubelet's fixed device-plugin directory.
func (c *Cluster) cleanNode() {
	if c.nodeDir == "" {
		return
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), c.ctrSock) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// Containers of those shims: processes whose root is under ours, or
	// (a container in its own mount namespace, whose root reads as "/")
	// that see bind mounts from our node's directory (/etc/hosts and the
	// volumes the kubelet mounted for the pod).
	self, _ := os.Readlink("/proc/self/ns/mnt")
	for _, p := range procs {
		pidDir := filepath.Dir(p)
		root, err := os.Readlink(filepath.Join(pidDir, "root"))
		ours := err == nil && strings.HasPrefix(root, c.nodeDir)
		if ns, err := os.Readlink(filepath.Join(pidDir, "ns", "mnt")); !ours && err == nil && ns != self {
			mi, _ := os.ReadFile(filepath.Join(pidDir, "mountinfo"))
			ours = strings.Contains(string(mi), c.nodeDir)
		}
		if ours {
			var pid int
			if _, err := fmt.Sscanf(filepath.Base(pidDir), "%d", &pid); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	var mounts []string
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && (strings.HasPrefix(f[4], c.nodeDir) || strings.HasPrefix(f[4], "/run/containerd/")) {
				mounts = append(mounts, f[4])
			}
		}
	}
	// Deepest first.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if err := syscall.Unmount(m, 0); err != nil {
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
	}
	os.RemoveAll("/run/containerd")
	os.RemoveAll("/var/lib/kubelet/device-plugins")
}
