package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/salt-volumes/salt-volumes/test/testenv"
)

const chart = "../../deploy/helm/salt-volumes"

// helm is the helm binary (testenv.Helm).
func helm(t *testing.T) string {
	t.Helper()
	p, err := testenv.Helm()
	require.NoError(t, err)
	return p
}

// objects reads YAML documents into objects keyed by kind/namespace/name;
// a ConfigMap's config.yaml is read as YAML too (its comments aside).
func objects(t *testing.T, data []byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if o == nil {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		if d, ok := o["data"].(map[string]any); ok && o["kind"] == "ConfigMap" {
			if text, ok := d["config.yaml"].(string); ok {
				var c any
				require.NoError(t, yaml.Unmarshal([]byte(text), &c))
				d["config.yaml"] = c
			}
		}
		key := o["kind"].(string) + "/" + str(md["namespace"]) + "/" + str(md["name"])
		out[key] = o
	}
	return out
}

func str(v any) string { s, _ := v.(string); return s }

// exampleSaltURL is the salt-api of deploy/kubernetes' config; the chart
// asks for one (salt.url is required).
const exampleSaltURL = "https://salt-master.example.com:8000"

func render(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helm(t), append([]string{"template", "salt-volumes", chart, "--namespace", "salt-volumes", "--set", "salt.url=" + exampleSaltURL}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s", stderr.String())
	return out
}

// The chart is clean for helm lint, and with its default values it renders
// exactly the raw manifests of deploy/kubernetes (which the in-cluster
// test applies): the two cannot drift apart.
func TestHelmChart(t *testing.T) {
	out, err := exec.Command(helm(t), "lint", "--strict", chart).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "0 chart(s) failed")

	var raw []byte
	for _, f := range []string{"rbac.yaml", "volume-crd.yaml", "volumesnapshot-crd.yaml", "serve.yaml", "claims-policy.yaml", "volume-admin-policy.yaml", "volumesnapshot-policy.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../deploy/kubernetes", f))
		require.NoError(t, err)
		raw = append(raw, []byte("\n---\n")...)
		raw = append(raw, b...)
	}
	want := objects(t, raw)
	// The release's namespace is helm's to create (--create-namespace).
	delete(want, "Namespace//salt-volumes")
	// deploy/kubernetes binds the ClusterRole to the user salt-volumes too
	// (for a serve outside the cluster); the chart only when asked.
	got := objects(t, render(t, "--include-crds", "--set", "outsideUser=salt-volumes"))
	// The config's checksum on the pods is the chart's alone (helm
	// upgrade rolls them when it changes; kubectl apply has no such need).
	tmpl := got["Deployment/salt-volumes/salt-volumes"]["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)
	sum, _ := tmpl["annotations"].(map[string]any)["checksum/config"].(string)
	assert.Regexp(t, `^[0-9a-f]{64}$`, sum, "the pods carry the config's checksum")
	delete(tmpl, "annotations")
	for k := range want {
		assert.Contains(t, got, k, "the chart does not render %s", k)
	}
	for k, o := range got {
		if assert.Contains(t, want, k, "the chart renders %s, which deploy/kubernetes lacks", k) {
			assert.Equal(t, want[k], o, "%s differs between the chart and deploy/kubernetes", k)
		}
	}
	crd, err := os.ReadFile(filepath.Join(chart, "crds", "volume-crd.yaml"))
	require.NoError(t, err)
	rawCRD, err := os.ReadFile("../../deploy/kubernetes/volume-crd.yaml")
	require.NoError(t, err)
	assert.Equal(t, string(rawCRD), string(crd), "the chart's CRD is a copy of deploy/kubernetes/volume-crd.yaml")
	crd, err = os.ReadFile(filepath.Join(chart, "crds", "volumesnapshot-crd.yaml"))
	require.NoError(t, err)
	rawCRD, err = os.ReadFile("../../deploy/kubernetes/volumesnapshot-crd.yaml")
	require.NoError(t, err)
	assert.Equal(t, string(rawCRD), string(crd), "the chart's CRD is a copy of deploy/kubernetes/volumesnapshot-crd.yaml")

	t.Run("upgrades roll the pods, which carry what the restricted Pod Security level asks; bad values are refused (#52 item 5)", func(t *testing.T) {
		chartYAML, err := os.ReadFile(filepath.Join(chart, "Chart.yaml"))
		require.NoError(t, err)
		var meta struct {
			Version    string `yaml:"version"`
			AppVersion string `yaml:"appVersion"`
		}
		require.NoError(t, yaml.Unmarshal(chartYAML, &meta))
		version, err := os.ReadFile("../../VERSION")
		require.NoError(t, err)
		assert.Equal(t, strings.TrimSpace(string(version)), meta.AppVersion, "the chart's appVersion is VERSION (make release sets both)")
		assert.Equal(t, meta.AppVersion, meta.Version)
		pod := func(o map[string]map[string]any) map[string]any {
			return o["Deployment/salt-volumes/salt-volumes"]["spec"].(map[string]any)["template"].(map[string]any)
		}
		def := objects(t, render(t))
		c := pod(def)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		assert.Equal(t, "salt-volumes.io/salt-volumes:"+meta.AppVersion, c["image"], "the image is the release's, not latest")
		assert.Contains(t, mustYAML(t, want["Deployment/salt-volumes/salt-volumes"]), "image: salt-volumes.io/salt-volumes:"+meta.AppVersion, "deploy/kubernetes names the same release")
		assert.Equal(t, map[string]any{"type": "RuntimeDefault"}, pod(def)["spec"].(map[string]any)["securityContext"].(map[string]any)["seccompProfile"])
		checksum := func(o map[string]map[string]any) string {
			return pod(o)["metadata"].(map[string]any)["annotations"].(map[string]any)["checksum/config"].(string)
		}
		assert.Equal(t, checksum(def), checksum(objects(t, render(t, "--set", "replicaCount=3"))), "a change elsewhere rolls nothing")
		assert.NotEqual(t, checksum(def), checksum(objects(t, render(t, "--set", "config.limits.volumes=5000"))), "a config change rolls the pods")
		pdb := def["PodDisruptionBudget/salt-volumes/salt-volumes"]
		require.NotNil(t, pdb, "two replicas: a budget keeps one through drains")
		assert.EqualValues(t, 1, pdb["spec"].(map[string]any)["minAvailable"])
		assert.NotContains(t, objects(t, render(t, "--set", "replicaCount=1")), "PodDisruptionBudget/salt-volumes/salt-volumes", "one replica: no budget that blocks every drain")
		crb := mustYAML(t, def["ClusterRoleBinding//salt-volumes"])
		assert.NotContains(t, crb, "kind: User", "by default the ClusterRole goes to the service account alone")

		refused := func(want string, args ...string) {
			t.Helper()
			out, err := exec.Command(helm(t), append([]string{"template", "salt-volumes", chart, "--namespace", "salt-volumes"}, args...)...).CombinedOutput()
			require.Error(t, err, "%s", out)
			assert.Contains(t, string(out), want)
		}
		refused("salt.url is required")
		refused("replicaCount", "--set", "salt.url="+exampleSaltURL, "--set", "replicaCount=-1")
		assert.NotContains(t, objects(t, render(t, "--set", "replicaCount=0", "--set", "image.tag=20261206", "--set", "global.x=1")), "PodDisruptionBudget/salt-volumes/salt-volumes", "scaled down, a numeric tag and a parent chart's globals are taken")
		refused("replicas", "--set", "salt.url="+exampleSaltURL, "--set", "replicas=2")
		refused("pullPolicy", "--set", "salt.url="+exampleSaltURL, "--set", "image.pullPolicy=Sometimes")
	})

	t.Run("the optional objects and the values people change", func(t *testing.T) {
		got := objects(t, render(t, "--set", "serviceMonitor.enabled=true", "--set", "storageClass.create=true",
			"--set", "storageClass.fsType=xfs", "--set", "replicaCount=3", "--set", "existingSecret=mine",
			"--set", "salt.url=https://salt.internal:8000", "--set", "outsideUser=", "--set", "config.limits.volumes=5000",
			"--set", "config.kubernetes.leaseDuration=30s", "--set", "hostNetwork=true", "--set", "containerPort=9443",
			"--set", "listen=127.0.0.1:9443", "--set-json", `extraEnv=[{"name":"GOMEMLIMIT","value":"400MiB"}]`))
		sc := got["StorageClass//salt-volumes"]
		require.NotNil(t, sc)
		assert.Equal(t, "salt-volumes.io/sparse", sc["provisioner"])
		assert.Equal(t, "WaitForFirstConsumer", sc["volumeBindingMode"])
		assert.Equal(t, map[string]any{"fsType": "xfs"}, sc["parameters"])
		sm := got["ServiceMonitor/salt-volumes/salt-volumes"]
		require.NotNil(t, sm)
		assert.Contains(t, strings.Join(strings.Fields(str(mustYAML(t, sm))), " "), "name: mine")
		dep := got["Deployment/salt-volumes/salt-volumes"]
		assert.EqualValues(t, 3, dep["spec"].(map[string]any)["replicas"])
		assert.Contains(t, mustYAML(t, dep), "secretName: mine")
		cfg := got["ConfigMap/salt-volumes/salt-volumes"]["data"].(map[string]any)["config.yaml"].(map[string]any)
		assert.Equal(t, "https://salt.internal:8000", cfg["salt"].(map[string]any)["url"])
		assert.Equal(t, map[string]any{"volumes": 5000}, cfg["limits"])
		assert.Equal(t, map[string]any{"volumeObjects": true, "leaseDuration": "30s"}, cfg["kubernetes"], "config merges over the chart's keys")
		pod := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		assert.Equal(t, true, pod["hostNetwork"])
		c := pod["containers"].([]any)[0].(map[string]any)
		assert.Equal(t, []any{"serve", "--config", "/etc/salt-volumes/config.yaml", "--listen", "127.0.0.1:9443"}, c["args"])
		assert.Equal(t, 9443, c["ports"].([]any)[0].(map[string]any)["containerPort"])
		assert.Contains(t, c["env"], map[string]any{"name": "GOMEMLIMIT", "value": "400MiB"})
		assert.Equal(t, true, cfg["insecure"], "plain HTTP inside the cluster says so")

		// serve's class for operators' volumes set in config: the
		// policy keeping tenants' claims off them names that class.
		pol := objects(t, render(t, "--set", "config.kubernetes.storageClass=ops-static"))["ValidatingAdmissionPolicy//salt-volumes-static-class"]
		require.NotNil(t, pol)
		expr := str(pol["spec"].(map[string]any)["validations"].([]any)[0].(map[string]any)["expression"])
		assert.Contains(t, expr, "object.spec.storageClassName != 'ops-static'")
		assert.NotContains(t, expr, "salt-volumes-static")

		tls := objects(t, render(t, "--set", "tls.secretName=serve-tls"))
		cfg = tls["ConfigMap/salt-volumes/salt-volumes"]["data"].(map[string]any)["config.yaml"].(map[string]any)
		assert.Equal(t, map[string]any{"certFile": "/etc/salt-volumes/tls/tls.crt", "keyFile": "/etc/salt-volumes/tls/tls.key"}, cfg["tls"])
		assert.NotContains(t, cfg, "insecure")
		d := mustYAML(t, tls["Deployment/salt-volumes/salt-volumes"])
		assert.Contains(t, d, "secretName: serve-tls")
		assert.Contains(t, d, "scheme: HTTPS", "the probes speak HTTPS")

		crb := mustYAML(t, got["ClusterRoleBinding//salt-volumes"])
		assert.NotContains(t, crb, "kind: User", "outsideUser \"\" binds the service account only")

		// Clusters before 1.30 have no ValidatingAdmissionPolicy.
		none := objects(t, render(t, "--set", "admissionPolicies=false"))
		for k := range none {
			assert.NotContains(t, k, "ValidatingAdmissionPolicy", "admissionPolicies=false renders %s", k)
		}
	})
}

func mustYAML(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
