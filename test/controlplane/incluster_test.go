package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/salt-volumes/salt-volumes/internal/helmchart"
	"github.com/salt-volumes/salt-volumes/internal/image"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestInCluster: serve as its Helm chart installs it (deploy/helm/
// salt-volumes, whose default rendering is deploy/kubernetes' manifests),
// from the image make image writes, on a real kubelet, with
// the service account's token and RBAC, salt-api's event stream instead of
// the master's bus: two replicas elect a leader, kubectl apply prepares a
// volume, kill -9 of the leader's process hands the lead to the other.
func TestInCluster(t *testing.T) {
	s, k, must, uuids := withKubelet(t, "volumes,pods,deploy,leases,events")
	ctx := context.Background()

	// make image's image, imported as an operator without a registry would.
	archive := filepath.Join(t.TempDir(), "image.tar")
	_, err := image.Write(archive, image.Serve(bin("salt-volumes"), "in-cluster-test"))
	require.NoError(t, err)
	require.NoError(t, k.ImportImage(archive))
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	_, err = k.Admin.CoreV1().Secrets("salt-volumes").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "salt-volumes", Namespace: "salt-volumes"},
		StringData: map[string]string{"token": token, "salt-password": s.APIPass}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// One node and no pod network here: each replica runs on the host's
	// network with a port of its own on 127.0.0.1 (the kubelet refuses a
	// loopback node IP, so these pods have no pod IP to expand), and
	// reaches the API server on 127.0.0.1 (no kube-proxy behind the
	// kubernetes Service). The first is the chart, installed by helm with
	// those values (and this test's salt-api, a short Lease, one replica);
	// the second is a copy of the Deployment helm made, with its own port.
	// The RBAC objects the cluster was started with are the chart's: helm
	// takes them over.
	started := time.Now()
	ports := []int{saltstack.FreePort(t), saltstack.FreePort(t)}
	env, err := json.Marshal([]corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"}, {Name: "KUBERNETES_SERVICE_PORT", Value: fmt.Sprint(k.APIPort)}})
	require.NoError(t, err)
	helm, err := testenv.Helm()
	require.NoError(t, err)
	// The chart as make dist packages it.
	chart, err := helmchart.Pack(filepath.Join(s.Repo, "deploy", "helm", "salt-volumes"), "0.4.0-test.1", t.TempDir(), time.Unix(0, 0))
	require.NoError(t, err)
	out, err := exec.Command(helm, "install", "salt-volumes", chart,
		"--kubeconfig", k.AdminKubeconfig, "--namespace", "salt-volumes", "--take-ownership",
		"--set", "image.tag=in-cluster-test", "--set", "replicaCount=1", "--set", "hostNetwork=true",
		"--set", fmt.Sprintf("containerPort=%d", ports[0]), "--set", fmt.Sprintf("listen=127.0.0.1:%d", ports[0]),
		"--set-json", "extraEnv="+string(env), "--set", "salt.url="+s.APIURL(), "--set", "salt.username="+s.APIUser,
		"--set", "salt.eauth=file", "--set", "config.kubernetes.leaseDuration=3s").CombinedOutput()
	require.NoError(t, err, "helm install: %s", out)
	t.Logf("helm install of the packaged chart: %s", time.Since(started).Round(100*time.Millisecond))
	must("", "wait", "--for", "condition=Established", "--timeout", "60s", "crd/volumes.salt-volumes.io")
	assert.Equal(t, "Helm", must("", "-n", "salt-volumes", "get", "deploy", "salt-volumes", "-o", `jsonpath={.metadata.labels.app\.kubernetes\.io/managed-by}`), "the Deployment is helm's")
	dep, err := k.Admin.AppsV1().Deployments("salt-volumes").Get(ctx, "salt-volumes", metav1.GetOptions{})
	require.NoError(t, err)
	second := dep.DeepCopy()
	second.ObjectMeta = metav1.ObjectMeta{Name: "salt-volumes-b", Namespace: "salt-volumes", Labels: map[string]string{"replica": "b"}}
	second.Spec.Selector.MatchLabels["replica"] = "b"
	second.Spec.Template.Labels["replica"] = "b"
	c := &second.Spec.Template.Spec.Containers[0]
	require.Equal(t, fmt.Sprintf("127.0.0.1:%d", ports[0]), c.Args[len(c.Args)-1], "the chart's --listen")
	c.Args[len(c.Args)-1] = fmt.Sprintf("127.0.0.1:%d", ports[1])
	c.Ports[0].ContainerPort = int32(ports[1])
	_, err = k.Admin.AppsV1().Deployments("salt-volumes").Create(ctx, second, metav1.CreateOptions{})
	require.NoError(t, err)
	replicas := []*plane{
		serveproc.At(t, bin("salt-volumes"), fmt.Sprintf("http://127.0.0.1:%d", ports[0]), token, "salt-volumes"),
		serveproc.At(t, bin("salt-volumes"), fmt.Sprintf("http://127.0.0.1:%d", ports[1]), token, "salt-volumes-b"),
	}
	// The pods of each, for the kubelet's restart count.
	podsOf := map[string]string{"salt-volumes": "app.kubernetes.io/name=salt-volumes,!replica", "salt-volumes-b": "replica=b"}
	must("", "-n", "salt-volumes", "wait", "--for", "condition=Available", "--timeout", "3m", "deploy/salt-volumes", "deploy/salt-volumes-b")
	t.Logf("both replicas Ready (readiness probe on /readyz) %s after their Deployments were created", time.Since(started).Round(100*time.Millisecond))
	lead, _ := leaderOf(t, 60*time.Second, replicas...)
	other := replicas[0]
	if other == lead {
		other = replicas[1]
	}
	holder := must("", "-n", "salt-volumes", "get", "lease", "salt-volumes", "-o", "jsonpath={.spec.holderIdentity}")
	assert.Contains(t, holder, strings.TrimPrefix(lead.URL, "http://127.0.0.1"), "the Lease names the leading replica (by its port)")

	manifest := func(name string) string {
		return "apiVersion: salt-volumes.io/v1alpha1\nkind: Volume\nmetadata:\n  name: " + name + "\nspec:\n  node: " + s.MinionID + "\n  sparseLoopDevice: {size: 16Mi}\n"
	}
	available := func(name string) string {
		t.Helper()
		must(manifest(name), "apply")
		u := must("", "get", "volume", name, "-o", "jsonpath={.metadata.uid}")
		*uuids = append(*uuids, u)
		must("", "wait", "--for", "jsonpath={.status.phase}=Available", "--timeout", "2m", "volume/"+name)
		fi, err := os.Stat(filepath.Join(s.StateDir, "sparse", u))
		require.NoError(t, err, "the sparse file on the node, named by the uuid")
		assert.Equal(t, int64(16<<20), fi.Size())
		return u
	}

	t.Run("kubectl apply: the replica leading in the cluster prepares the volume, both serve it", func(t *testing.T) {
		u := available("in-fs")
		for _, p := range replicas {
			// Each replica reads the objects through its own watch: the
			// one that did not write the status sees it a moment later
			// (seen under make test's load: Pending 2 s after).
			eventually(t, 30*time.Second, p.Log+" serves the volume Available", func() (bool, string) {
				v := getJSON(t, p, "in-fs")
				return v.Status.Phase == "Available" && v.Spec.UUID == u, fmt.Sprintf("%s %s", v.Status.Phase, v.Spec.UUID)
			})
		}
		pv, err := k.Admin.CoreV1().PersistentVolumes().Get(ctx, "in-fs", metav1.GetOptions{})
		require.NoError(t, err, "its PersistentVolume, written with the service account's rights")
		assert.Equal(t, "/dev/disk/by-uuid/"+u, pv.Spec.Local.Path)
	})

	t.Run("kill -9 of the leader's process: a new leader after the Lease, the kubelet restarts the killed one", func(t *testing.T) {
		lease := func() string {
			return must("", "-n", "salt-volumes", "get", "lease", "salt-volumes", "-o", "jsonpath={.spec.holderIdentity}")
		}
		before := lease()
		pid := serveProcess(t, strings.TrimPrefix(lead.URL, "http://"))
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		killed := time.Now()
		// Applied while nobody leads: the next leader prepares it.
		must(manifest("in-failover"), "apply")
		// Either replica may win: the other one, or the killed one's
		// restarted process, which is a new incarnation and waits for
		// the Lease like the other (it must not take the dead process's
		// Lease as its own).
		got, _ := leaderOf(t, 60*time.Second, replicas...)
		took := time.Since(killed)
		after := lease()
		assert.NotEqual(t, before, after, "a new holder of the Lease")
		// Renewed at most 0.6s before the kill, the Lease ran out 2.4s
		// after it at the earliest.
		assert.GreaterOrEqual(t, took, 2*time.Second, "nobody led before the killed leader's Lease (3s) ran out")
		t.Logf("%s led %s after kill -9 (leaseDuration 3s; the killed one: %s)", got.Log, took.Round(100*time.Millisecond), lead.Log)
		*uuids = append(*uuids, must("", "get", "volume", "in-failover", "-o", "jsonpath={.metadata.uid}"))
		must("", "wait", "--for", "jsonpath={.status.phase}=Available", "--timeout", "2m", "volume/in-failover")
		t.Logf("the volume applied at the kill Available %s after it", time.Since(killed).Round(100*time.Millisecond))
		eventually(t, 2*time.Minute, "the killed replica restarted by the kubelet and serving", func() (bool, string) {
			restarts := must("", "-n", "salt-volumes", "get", "pods", "-l", podsOf[lead.Log],
				"-o", "jsonpath={.items[0].status.containerStatuses[0].restartCount}")
			r := role(lead)
			return restarts == "1" && strings.HasPrefix(r, "ok: "), restarts + " " + r
		})
		for _, p := range replicas {
			assert.Equal(t, "Available", string(getJSON(t, p, "in-failover").Status.Phase), p.Log)
		}
		leaderOf(t, 10*time.Second, replicas...) // still exactly one
	})

	t.Run("kubectl delete: the new leader removes the volumes from the node", func(t *testing.T) {
		must("", "delete", "volume", "in-fs", "in-failover", "--timeout", "2m")
		for _, u := range *uuids {
			_, err := os.Stat(filepath.Join(s.StateDir, "sparse", u))
			assert.True(t, os.IsNotExist(err), "sparse file %s removed: %v", u, err)
		}
		_, err := k.Admin.CoreV1().PersistentVolumes().Get(ctx, "in-fs", metav1.GetOptions{})
		assert.Error(t, err, "its PV deleted with it")
	})

	t.Run("helm upgrade to a new image and a changed config rolls the chart's pod onto both", func(t *testing.T) {
		// The copy of the Deployment is this test's, not the chart's.
		// The cluster here runs no garbage collector: its ReplicaSet and
		// pod go by name.
		must("", "-n", "salt-volumes", "delete", "deploy", "salt-volumes-b", "--wait", "--timeout", "2m")
		must("", "-n", "salt-volumes", "delete", "rs,pod", "-l", "replica=b", "--wait", "--timeout", "2m")
		archive := filepath.Join(t.TempDir(), "image.tar")
		_, err := image.Write(archive, image.Serve(bin("salt-volumes"), "in-cluster-test-2"))
		require.NoError(t, err)
		require.NoError(t, k.ImportImage(archive))
		selector := "app.kubernetes.io/name=salt-volumes,!replica"
		oldPod := must("", "-n", "salt-volumes", "get", "pods", "-l", selector, "-o", "jsonpath={.items[0].metadata.uid}")
		at := time.Now()
		out, err := exec.Command(helm, "upgrade", "salt-volumes", chart, "--kubeconfig", k.AdminKubeconfig, "--namespace", "salt-volumes",
			"--reuse-values", "--set", "image.tag=in-cluster-test-2", "--set", "config.kubernetes.leaseDuration=4s").CombinedOutput()
		require.NoError(t, err, "helm upgrade: %s", out)
		must("", "-n", "salt-volumes", "rollout", "status", "deploy/salt-volumes", "--timeout", "3m")
		t.Logf("helm upgrade rolled out in %s", time.Since(at).Round(100*time.Millisecond))
		eventually(t, 2*time.Minute, "one pod of the chart's, a new one, on the new image", func() (bool, string) {
			pods := must("", "-n", "salt-volumes", "get", "pods", "-l", selector, "-o", `jsonpath={range .items[*]}{.metadata.uid} {.spec.containers[0].image} {.status.phase}{"\n"}{end}`)
			lines := strings.Split(strings.TrimSpace(pods), "\n")
			return len(lines) == 1 && !strings.HasPrefix(lines[0], oldPod) &&
				strings.HasSuffix(lines[0], " "+image.ServeRepository+":in-cluster-test-2 Running"), pods
		})
		// serve read the changed config: it holds the Lease for 4s now.
		eventually(t, 2*time.Minute, "the new pod leads with the new config's lease duration", func() (bool, string) {
			d := must("", "-n", "salt-volumes", "get", "lease", "salt-volumes", "-o", "jsonpath={.spec.leaseDurationSeconds}")
			r := role(replicas[0])
			return d == "4" && r == "ok: leader", "leaseDurationSeconds " + d + ", serve: " + r
		})
	})
}

// serveProcess finds the pid of the serve process listening on addr (its
// --listen argument, expanded by the kubelet).
func serveProcess(t *testing.T, addr string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var seen []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if strings.Contains(string(b), "serve") {
			seen = append(seen, strings.Join(args, " "))
		}
		if len(args) > 2 && strings.HasSuffix(args[0], "/salt-volumes") && args[1] == "serve" && args[len(args)-1] == addr {
			var pid int
			_, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid)
			require.NoError(t, err)
			return pid
		}
	}
	t.Fatalf("no serve process with --listen %s among %q", addr, seen)
	return 0
}
