package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/salt-volumes/salt-volumes/internal/image"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
)

// TestInCluster: serve as its own manifest runs it (deploy/kubernetes/
// serve.yaml), from the image make image writes, on a real kubelet, with
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
	must("", "apply", "-f", filepath.Join(s.Repo, "deploy", "kubernetes", "volume-crd.yaml"))
	must("", "wait", "--for", "condition=Established", "--timeout", "60s", "crd/volumes.salt-volumes.io")

	b := make([]byte, 24)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	_, err = k.Admin.CoreV1().Secrets("salt-volumes").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "salt-volumes", Namespace: "salt-volumes"},
		StringData: map[string]string{"token": token, "salt-password": s.APIPass}}, metav1.CreateOptions{})
	require.NoError(t, err)

	cm, dep, svc := readServeManifest(t, filepath.Join(s.Repo, "deploy", "kubernetes", "serve.yaml"))
	// The shipped configuration with this test's salt-api and a short
	// Lease; the rest (token and password files, sse, volumeObjects) as
	// shipped.
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg))
	salt := cfg["salt"].(map[string]any)
	salt["url"], salt["username"], salt["eauth"] = s.APIURL(), s.APIUser, "file"
	cfg["kubernetes"].(map[string]any)["leaseDuration"] = "3s"
	text, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	cm.Data["config.yaml"] = string(text)
	_, err = k.Admin.CoreV1().ConfigMaps("salt-volumes").Create(ctx, cm, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = k.Admin.CoreV1().Services("salt-volumes").Create(ctx, svc, metav1.CreateOptions{})
	require.NoError(t, err)

	// One node and no pod network here: each replica is a one-replica
	// copy of the Deployment on the host's network with a port of its own
	// on 127.0.0.1 (the kubelet refuses a loopback node IP, so these pods
	// have no pod IP to expand), and reaches the API server on 127.0.0.1
	// (no kube-proxy behind the kubernetes Service). Everything else is
	// the shipped pod.
	started := time.Now()
	replicas := make([]*plane, 2)
	for i, name := range []string{"a", "b"} {
		port := saltstack.FreePort(t)
		d := dep.DeepCopy()
		d.Name = "salt-volumes-" + name
		one := int32(1)
		d.Spec.Replicas = &one
		d.Spec.Selector.MatchLabels["replica"] = name
		d.Spec.Template.Labels["replica"] = name
		ps := &d.Spec.Template.Spec
		ps.HostNetwork = true
		c := &ps.Containers[0]
		require.Equal(t, "$(POD_IP):8080", c.Args[len(c.Args)-1], "the shipped --listen")
		c.Args[len(c.Args)-1] = fmt.Sprintf("127.0.0.1:%d", port)
		c.Ports[0].ContainerPort = int32(port)
		c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"},
			corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: fmt.Sprint(k.APIPort)})
		_, err := k.Admin.AppsV1().Deployments("salt-volumes").Create(ctx, d, metav1.CreateOptions{})
		require.NoError(t, err)
		replicas[i] = serveproc.At(t, bin("salt-volumes"), fmt.Sprintf("http://127.0.0.1:%d", port), token, d.Name)
	}
	must("", "-n", "salt-volumes", "wait", "--for", "condition=Available", "--timeout", "3m", "deploy/salt-volumes-a", "deploy/salt-volumes-b")
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
			v := getJSON(t, p, "in-fs")
			assert.Equal(t, "Available", string(v.Status.Phase), p.Log)
			assert.Equal(t, u, v.Spec.UUID, p.Log)
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
			restarts := must("", "-n", "salt-volumes", "get", "pods", "-l", "replica="+strings.TrimPrefix(lead.Log, "salt-volumes-"),
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
}

// readServeManifest reads the shipped serve.yaml's ConfigMap, Deployment
// and Service.
func readServeManifest(t *testing.T, path string) (*corev1.ConfigMap, *appsv1.Deployment, *corev1.Service) {
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var cm *corev1.ConfigMap
	var dep *appsv1.Deployment
	var svc *corev1.Service
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		var meta metav1.TypeMeta
		require.NoError(t, json.Unmarshal(raw, &meta))
		var into any
		switch meta.Kind {
		case "ConfigMap":
			cm = &corev1.ConfigMap{}
			into = cm
		case "Deployment":
			dep = &appsv1.Deployment{}
			into = dep
		case "Service":
			svc = &corev1.Service{}
			into = svc
		default:
			t.Fatalf("%s: unexpected %s", path, meta.Kind)
		}
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		require.NoError(t, d.Decode(into), "%s: %s", path, meta.Kind)
	}
	require.NotNil(t, cm, "a ConfigMap")
	require.NotNil(t, dep, "a Deployment")
	require.NotNil(t, svc, "a Service")
	assert.EqualValues(t, 2, *dep.Spec.Replicas, "two replicas as shipped")
	return cm, dep, svc
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
