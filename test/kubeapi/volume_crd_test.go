// Package kubeapi tests what salt-volumes ships for the Kubernetes API
// server itself, against a real kube-apiserver: the Volume resource's
// schema and rules, applied and refused through kubectl as a user would.
package kubeapi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/salt-volumes/salt-volumes/test/kubecluster"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

const uuidA = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"

func TestVolumeResource(t *testing.T) {
	repo, err := saltstack.RepoRoot()
	require.NoError(t, err)
	tools, err := kubecluster.Tools(repo)
	require.NoError(t, err, "make setup builds the Kubernetes binaries")
	dir, err := os.MkdirTemp("", "sv-kubeapi")
	require.NoError(t, err)
	k, err := kubecluster.Start(context.Background(), dir, tools, filepath.Join(repo, "deploy", "kubernetes", "rbac.yaml"))
	require.NoError(t, err)
	t.Cleanup(func() {
		k.Stop()
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	kubectl := func(stdin string, args ...string) (string, error) {
		if stdin == "" {
			return k.Kubectl(args...)
		}
		f := filepath.Join(t.TempDir(), "in.yaml")
		require.NoError(t, os.WriteFile(f, []byte(stdin), 0o600))
		return k.Kubectl(append(args, "-f", f)...)
	}
	out, err := kubectl("", "apply", "-f", filepath.Join(repo, "deploy", "kubernetes", "volume-crd.yaml"))
	require.NoError(t, err, out)
	out, err = kubectl("", "wait", "--for", "condition=Established", "--timeout", "60s", "crd/volumes.salt-volumes.io")
	require.NoError(t, err, out)

	t.Run("a valid volume is taken, with the defaults", func(t *testing.T) {
		out, err := kubectl(volume("good", "node: node-1\n  sparseLoopDevice: {size: 10Gi}"), "apply")
		require.NoError(t, err, out)
		out, err = kubectl("", "get", "volume", "good", "-o", "jsonpath={.spec.mode}")
		require.NoError(t, err, out)
		assert.Equal(t, "Filesystem", out, "mode defaults to Filesystem")
		out, err = kubectl(volume("raw-block", "node: node-1.example.com\n  mode: Block\n  uuid: "+uuidA+"\n  rawBlockDevice: {devicePath: /dev/disk/by-id/nvme-x}"), "apply")
		require.NoError(t, err, out)
		out, err = kubectl(volume("lvm", "node: node-1\n  mode: Block\n  lvmLogicalVolume: {vgName: vg_data-1, size: 20Gi, wipeSignatures: true}"), "apply")
		require.NoError(t, err, out)
		out, err = kubectl(volume("bytes", "node: node-1\n  fsType: xfs\n  mkfsOptions: [-m, reflink=0]\n  sparseLoopDevice: {size: 1073741824}"), "apply")
		require.NoError(t, err, out)
	})

	t.Run("invalid volumes are refused by the API server, naming the field", func(t *testing.T) {
		for _, tc := range []struct{ name, spec, want string }{
			{"both-kinds", "node: node-x\n  sparseLoopDevice: {size: 1Gi}\n  rawBlockDevice: {devicePath: /dev/sdb}", "give exactly one of sparseLoopDevice, rawBlockDevice and lvmLogicalVolume"},
			{"sparse-and-lvm", "node: node-x\n  sparseLoopDevice: {size: 1Gi}\n  lvmLogicalVolume: {vgName: vg0, size: 1Gi}", "give exactly one of sparseLoopDevice, rawBlockDevice and lvmLogicalVolume"},
			{"no-kind", "node: node-x", "give exactly one of sparseLoopDevice, rawBlockDevice and lvmLogicalVolume"},
			{"lvm-no-vg", "node: node-x\n  lvmLogicalVolume: {size: 1Gi}", "spec.lvmLogicalVolume.vgName: Required value"},
			{"lvm-bad-vg", "node: node-x\n  lvmLogicalVolume: {vgName: -vg, size: 1Gi}", "spec.lvmLogicalVolume.vgName: Invalid value"},
			{"lvm-bad-size", "node: node-x\n  lvmLogicalVolume: {vgName: vg0, size: 1GB}", "spec.lvmLogicalVolume.size"},
			{"no-node", "sparseLoopDevice: {size: 1Gi}", "spec.node: Required value"},
			{"bad-mode", "node: node-x\n  mode: Raw\n  sparseLoopDevice: {size: 1Gi}", "spec.mode: Unsupported value: \"Raw\""},
			{"bad-fs", "node: node-x\n  fsType: btrfs\n  sparseLoopDevice: {size: 1Gi}", "spec.fsType: Unsupported value: \"btrfs\""},
			{"block-with-fs", "node: node-x\n  mode: Block\n  fsType: ext4\n  sparseLoopDevice: {size: 1Gi}", "a Block volume has no filesystem"},
			{"bad-uuid", "node: node-x\n  uuid: 3F2504E0-4F89-41D3-9A0C-0305E82C3301\n  sparseLoopDevice: {size: 1Gi}", "spec.uuid: Invalid value"},
			{"bad-size", "node: node-x\n  sparseLoopDevice: {size: 10GB}", "spec.sparseLoopDevice.size"},
			{"bad-node", "node: 'node-*'\n  sparseLoopDevice: {size: 1Gi}", "spec.node: Invalid value"},
			{"bad-device", "node: node-x\n  rawBlockDevice: {devicePath: sdb}", "spec.rawBlockDevice.devicePath: Invalid value"},
			{"Upper.Case", "node: node-x\n  sparseLoopDevice: {size: 1Gi}", "metadata.name"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out, err := kubectl(volume(tc.name, tc.spec), "apply")
				require.Error(t, err, "accepted: %s", out)
				assert.Contains(t, out, tc.want)
				got, _ := kubectl("", "get", "volume", tc.name, "--ignore-not-found", "-o", "name")
				assert.Empty(t, strings.TrimSpace(got), "nothing was stored")
			})
		}
	})

	t.Run("the spec cannot change once set", func(t *testing.T) {
		for _, tc := range []struct{ name, spec, want string }{
			{"node", "node: node-2\n  sparseLoopDevice: {size: 10Gi}", "node cannot change"},
			{"size", "node: node-1\n  sparseLoopDevice: {size: 5Gi}", "size can only grow"},
			{"size in bytes", "node: node-1\n  sparseLoopDevice: {size: 10737418239}", "size can only grow"},
			{"kind", "node: node-1\n  rawBlockDevice: {devicePath: /dev/sdb}", "the kind of a volume cannot change"},
			{"lvm", "node: node-1\n  lvmLogicalVolume: {vgName: vg0, size: 10Gi}", "the kind of a volume cannot change"},
			{"fsType", "node: node-1\n  fsType: xfs\n  sparseLoopDevice: {size: 10Gi}", "the spec cannot change once set"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out, err := kubectl(volume("good", tc.spec), "apply")
				require.Error(t, err, "accepted: %s", out)
				assert.Contains(t, out, tc.want)
			})
		}
		// A sparse volume's size grows (the control plane carries it out),
		// written either way; it never shrinks back.
		for _, size := range []string{"10240Mi", "20Gi", "21474836481"} {
			out, err := kubectl(volume("good", "node: node-1\n  sparseLoopDevice: {size: "+size+"}"), "apply")
			require.NoError(t, err, "growing to %s: %s", size, out)
		}
		out, err := kubectl(volume("good", "node: node-1\n  sparseLoopDevice: {size: 20Gi}"), "apply")
		require.Error(t, err, out)
		assert.Contains(t, out, "size can only grow")
		// An LVM volume's size grows too; its VG and wipeSignatures stay.
		out, err = kubectl(volume("lvm", "node: node-1\n  mode: Block\n  lvmLogicalVolume: {vgName: vg_data-1, size: 30Gi, wipeSignatures: true}"), "apply")
		require.NoError(t, err, out)
		for _, tc := range []struct{ spec, want string }{
			{"lvmLogicalVolume: {vgName: vg_data-1, size: 25Gi, wipeSignatures: true}", "size can only grow"},
			{"lvmLogicalVolume: {vgName: vg1, size: 30Gi, wipeSignatures: true}", "cannot change but for a larger size"},
			{"lvmLogicalVolume: {vgName: vg_data-1, size: 30Gi}", "cannot change but for a larger size"},
		} {
			out, err = kubectl(volume("lvm", "node: node-1\n  mode: Block\n  "+tc.spec), "apply")
			require.Error(t, err, "accepted: %s", tc.spec)
			assert.Contains(t, out, tc.want, tc.spec)
		}
		// uuid: set once (the control plane defaults it to metadata.uid),
		// then fixed.
		out, err = kubectl("", "patch", "volume", "good", "--type", "merge", "-p", `{"spec":{"uuid":"`+uuidA+`"}}`)
		require.NoError(t, err, out)
		out, err = kubectl("", "patch", "volume", "good", "--type", "merge", "-p", `{"spec":{"uuid":"5d9e3f0a-8b7c-4e21-a3d4-6f1b2c3d4e5f"}}`)
		require.Error(t, err, out)
		assert.Contains(t, out, "uuid cannot change once set")
	})

	t.Run("status goes through its subresource, and kubectl get shows it", func(t *testing.T) {
		out, err := kubectl("", "patch", "volume", "good", "--subresource", "status", "--type", "merge", "-p",
			`{"status":{"phase":"Available","kind":"sparse","sizeQuantity":"10Gi","persistentVolume":{"name":"good","phase":"Bound","claim":"default/data"}}}`)
		require.NoError(t, err, out)
		out, err = kubectl("", "get", "volumes")
		require.NoError(t, err, out)
		assert.Regexp(t, `NAME\s+NODE\s+KIND\s+SIZE\s+MODE\s+PHASE\s+CLAIM\s+AGE`, out)
		assert.Regexp(t, `(?m)^good\s+node-1\s+sparse\s+10Gi\s+Filesystem\s+Available\s+default/data\s+`, out)
		out, err = kubectl("", "patch", "volume", "good", "--type", "merge", "-p", `{"status":{"phase":"Failed"}}`)
		require.NoError(t, err, out)
		out, _ = kubectl("", "get", "volume", "good", "-o", "jsonpath={.status.phase}")
		assert.Equal(t, "Available", out, "a write to the main resource does not change the status")
		out, err = kubectl("", "patch", "volume", "good", "--subresource", "status", "--type", "merge", "-p", `{"status":{"phase":"Sideways"}}`)
		require.Error(t, err)
		assert.Contains(t, out, "status.phase: Unsupported value")
	})

	// deploy/kubernetes/claims-policy.yaml on a real API server and PV
	// controller: a tenant cannot claim a static PV (the class is refused
	// at admission; another class never binds it); an operator can.
	t.Run("tenant claims", func(t *testing.T) {
		out, err := kubectl("", "apply", "-f", filepath.Join(repo, "deploy", "kubernetes", "claims-policy.yaml"))
		require.NoError(t, err, out)
		out, err = kubectl(`apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: claims, namespace: team-a}
rules:
  - apiGroups: [""]
    resources: [persistentvolumeclaims]
    verbs: [create, get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: claims, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: claims}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant}
  - {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "salt-volumes:operators"}
`, "apply")
		require.NoError(t, err, out)
		for _, pv := range []string{"kv-static", "kv-static-ops"} {
			out, err = kubectl(staticPV(pv), "apply")
			require.NoError(t, err, out)
		}
		tenant := []string{"--as", "tenant", "-n", "team-a"}
		operator := []string{"--as", "ops", "--as-group", "salt-volumes:operators", "-n", "team-a"}

		// The policy takes a moment to be enforced after it is created:
		// probe with a claim that names no PV (one let through before that
		// must not bind anything), then try the real one.
		require.Eventually(t, func() bool {
			out, err = kubectl(claim("probe", "salt-volumes-static", "no-such-pv"), append([]string{"create"}, tenant...)...)
			if err == nil {
				_, _ = kubectl("", "delete", "pvc", "probe", "-n", "team-a", "--wait=false")
			}
			return err != nil && strings.Contains(out, "only the salt-volumes:operators group may claim them")
		}, time.Minute, 500*time.Millisecond, "the tenant's claim of the static class was not refused: %s", out)
		out, err = kubectl(claim("steal", "salt-volumes-static", "kv-static"), append([]string{"create"}, tenant...)...)
		require.Error(t, err, "the tenant claimed the static PV: %s", out)
		assert.Contains(t, out, "spec.storageClassName: salt-volumes-static")

		out, err = kubectl(claim("by-name", "salt-volumes", "kv-static"), append([]string{"create"}, tenant...)...)
		require.NoError(t, err, "a tenant may create a claim of another class: %s", out)
		out, err = kubectl(claim("ops", "salt-volumes-static", "kv-static-ops"), append([]string{"create"}, operator...)...)
		require.NoError(t, err, "an operator may claim a static PV: %s", out)
		require.Eventually(t, func() bool {
			out, _ = kubectl("", "get", "pvc", "ops", "-n", "team-a", "-o", "jsonpath={.status.phase}")
			return out == "Bound"
		}, time.Minute, 200*time.Millisecond, "the operator's claim did not bind (is the PV controller running?): %s", out)
		// The PV controller has looked at the tenant's claim by now (it was
		// created first): it names the PV, and stays Pending.
		out, _ = kubectl("", "get", "pvc", "by-name", "-n", "team-a", "-o", "jsonpath={.status.phase}")
		assert.Equal(t, "Pending", out)
		out, _ = kubectl("", "get", "pv", "kv-static", "-o", "jsonpath={.status.phase}/{.spec.claimRef.name}")
		assert.Equal(t, "Available/", out, "the static PV was bound by a tenant's claim")
	})

	t.Run("the chart's pod is admitted where the restricted Pod Security level is enforced (#52 item 5)", func(t *testing.T) {
		out, err := kubectl("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: locked\n  labels:\n    pod-security.kubernetes.io/enforce: restricted\n", "apply")
		require.NoError(t, err, out)
		helm, err := testenv.Helm()
		require.NoError(t, err)
		// The Deployment's pod as the ReplicaSet controller would make it,
		// through the API server's own admission (a server-side dry run).
		pod := func(args ...string) string {
			t.Helper()
			cmd := exec.Command(helm, append([]string{"template", "salt-volumes", filepath.Join(repo, "deploy", "helm", "salt-volumes"),
				"--namespace", "locked", "--set", "salt.url=https://salt-master.example.com:8000", "--show-only", "templates/serve.yaml"}, args...)...)
			rendered, err := cmd.Output()
			require.NoError(t, err)
			for _, doc := range strings.Split(string(rendered), "\n---") {
				var o map[string]any
				require.NoError(t, yaml.Unmarshal([]byte(doc), &o))
				if o["kind"] != "Deployment" {
					continue
				}
				tmpl := o["spec"].(map[string]any)["template"].(map[string]any)
				b, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod",
					"metadata": map[string]any{"name": "chart-pod", "namespace": "locked", "labels": tmpl["metadata"].(map[string]any)["labels"]},
					"spec":     tmpl["spec"]})
				require.NoError(t, err)
				return string(b)
			}
			t.Fatal("the chart renders no Deployment")
			return ""
		}
		out, err = kubectl(pod(), "create", "--dry-run=server")
		require.NoError(t, err, "the restricted level refuses the chart's pod: %s", out)
		// The check bites: a host-network pod is outside even baseline.
		out, err = kubectl(pod("--set", "hostNetwork=true"), "create", "--dry-run=server")
		require.Error(t, err, out)
		assert.Contains(t, out, `violates PodSecurity "restricted`)
		assert.Contains(t, out, "hostNetwork")
	})
}

// staticPV is a PV as serve publishes a volume made with the CLI, in the
// class claims-policy.yaml keeps for operators.
func staticPV(name string) string {
	return `apiVersion: v1
kind: PersistentVolume
metadata: {name: ` + name + `}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: salt-volumes-static
  local: {path: /dev/disk/by-uuid/3f2504e0-4f89-41d3-9a0c-0305e82c3301}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node-1]}]
`
}

// claim is a claim of class for the PV named volume.
func claim(name, class, volume string) string {
	return `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ` + name + `}
spec:
  storageClassName: ` + class + `
  volumeName: ` + volume + `
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`
}

// volume is a Volume manifest.
func volume(name, spec string) string {
	return "apiVersion: salt-volumes.io/v1alpha1\nkind: Volume\nmetadata:\n  name: " + name + "\nspec:\n  " + spec + "\n"
}
