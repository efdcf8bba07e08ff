package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/kube"
	"github.com/salt-volumes/salt-volumes/test/kubecluster"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestVolumeObjects: volumes kept as Volume objects in a real API server,
// prepared by real Salt, with two serve replicas electing a leader with a
// Lease. kubectl is the client here; the REST API, CLI and web UI read and
// write the same objects.
func TestVolumeObjects(t *testing.T) {
	s, k := saltAndKube(t)
	ctx := context.Background()
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	kubectl := func(stdin string, args ...string) (string, error) {
		if stdin != "" {
			f := filepath.Join(t.TempDir(), "in.yaml")
			require.NoError(t, os.WriteFile(f, []byte(stdin), 0o600))
			args = append(args, "-f", f)
		}
		return k.Kubectl(args...)
	}
	must := func(stdin string, args ...string) string {
		t.Helper()
		out, err := kubectl(stdin, args...)
		require.NoError(t, err, out)
		return strings.TrimSpace(out)
	}
	must("", "apply", "-f", filepath.Join(s.Repo, "deploy", "kubernetes", "volume-crd.yaml"))
	must("", "wait", "--for", "condition=Established", "--timeout", "60s", "crd/volumes.salt-volumes.io")
	// The admission policies, as the guide installs them with rbac.yaml.
	must("", "apply", "-f", filepath.Join(s.Repo, "deploy", "kubernetes", "claims-policy.yaml"),
		"-f", filepath.Join(s.Repo, "deploy", "kubernetes", "volume-admin-policy.yaml"))
	// as is kubectl with a service account's own token (created, with its
	// namespace, if need be), as a workload or a CI job holds one.
	as := func(ns, sa string) func(stdin string, args ...string) (string, error) {
		t.Helper()
		_, _ = kubectl("", "create", "namespace", ns)
		_, _ = kubectl("", "create", "serviceaccount", sa, "-n", ns)
		token := must("", "create", "token", sa, "-n", ns, "--duration", "1h")
		kc := filepath.Join(t.TempDir(), sa+".kubeconfig")
		require.NoError(t, os.WriteFile(kc, []byte(fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: %q, certificate-authority: %q}\n"+
			"users:\n- name: u\n  user: {token: %q}\ncontexts:\n- name: c\n  context: {cluster: c, user: u, namespace: %s}\ncurrent-context: c\n",
			k.URL, filepath.Join(k.Dir, "ca.crt"), token, ns)), 0o600))
		return func(stdin string, args ...string) (string, error) {
			if stdin != "" {
				f := filepath.Join(t.TempDir(), "in.yaml")
				require.NoError(t, os.WriteFile(f, []byte(stdin), 0o600))
				args = append(args, "-f", f)
			}
			out, err := exec.Command(filepath.Join(k.BinDir, "kubectl"), append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
			return string(out), err
		}
	}

	replicas := make([]*plane, 2)
	for i := range replicas {
		p := newPlane(t, s)
		p.Config = filepath.Join(s.Root, fmt.Sprintf("objects-%d.yaml", i))
		p.Log = fmt.Sprintf("objects-%d", i)
		p.StoreConfig = "# no store file: the volumes are Volume objects\n"
		if i > 0 {
			p.Token = replicas[0].Token // every replica takes the same API token
		}
		p.Start(fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n  volumeObjects: true\n  leaseDuration: 3s\n  replicaID: objects-%d\n", k.ControlKubeconfig, i))
		replicas[i] = p
	}
	lead, _ := leaderOf(t, 30*time.Second, replicas...)
	follower := replicas[0]
	if follower == lead {
		follower = replicas[1]
	}
	manifest := func(name, spec string) string {
		return "apiVersion: salt-volumes.io/v1alpha1\nkind: Volume\nmetadata:\n  name: " + name + "\nspec:\n  node: " + s.MinionID + "\n  " + spec + "\n"
	}
	phase := func(name string) string {
		out, _ := kubectl("", "get", "volume", name, "-o", "jsonpath={.status.phase}")
		return strings.TrimSpace(out)
	}
	waitPhase := func(name, want string) {
		t.Helper()
		eventually(t, 2*time.Minute, "volume "+name+" "+want, func() (bool, string) {
			out, _ := kubectl("", "get", "volume", name, "-o", "jsonpath={.status.phase} {.status.message}")
			return strings.HasPrefix(out, want+" "), out
		})
	}
	gone := func(name string) {
		t.Helper()
		eventually(t, 2*time.Minute, "volume "+name+" gone", func() (bool, string) {
			out, _ := kubectl("", "get", "volume", name, "--ignore-not-found", "-o", "jsonpath={.status.phase} {.status.step}")
			return strings.TrimSpace(out) == "", out
		})
	}
	uuidOf := func(name string) string {
		u := must("", "get", "volume", name, "-o", "jsonpath={.metadata.uid}")
		uuids = append(uuids, u)
		return u
	}

	t.Run("kubectl apply prepares the volume, with its PV, and every replica's API shows it", func(t *testing.T) {
		must(manifest("obj-fs", "sparseLoopDevice: {size: 16Mi}"), "apply")
		u := uuidOf("obj-fs")
		waitPhase("obj-fs", "Available")
		assert.Equal(t, u, must("", "get", "volume", "obj-fs", "-o", "jsonpath={.status.uuid}"), "the uuid is the object's uid")
		fi, err := os.Stat(filepath.Join(s.StateDir, "sparse", u))
		require.NoError(t, err, "the sparse file is named by the uuid")
		assert.Equal(t, int64(16<<20), fi.Size())
		assert.Regexp(t, `(?m)^obj-fs\s+`+s.MinionID+`\s+sparse\s+16Mi\s+Filesystem\s+Available\s+`, must("", "get", "volumes"))
		assert.Equal(t, "True", must("", "get", "volume", "obj-fs", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`))
		assert.Equal(t, `["salt-volumes.io/volume"]`, must("", "get", "volume", "obj-fs", "-o", "jsonpath={.metadata.finalizers}"))
		pv, err := k.Admin.CoreV1().PersistentVolumes().Get(ctx, "obj-fs", metav1.GetOptions{})
		require.NoError(t, err, "its PersistentVolume")
		assert.Equal(t, "/dev/disk/by-uuid/"+u, pv.Spec.Local.Path)
		eventually(t, 30*time.Second, "Events on the Volume: its Salt job and its transitions", func() (bool, string) {
			out, _ := kubectl("", "get", "events", "-n", "default", "--field-selector", "involvedObject.kind=Volume,involvedObject.name=obj-fs",
				"-o", `jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}`)
			return strings.Contains(out, "SaltCall: salt_volumes.prepared started on "+s.MinionID+": job ") &&
				strings.Contains(out, "StateTransition: Accepted -> Pending") && strings.Contains(out, "StateTransition: Pending -> Available"), out
		})
		for _, p := range replicas {
			v := getJSON(t, p, "obj-fs")
			assert.Equal(t, "Available", string(v.Status.Phase), p.Log)
			assert.Equal(t, u, v.Spec.UUID, p.Log)
		}
	})

	// #48 item 7, on serve's default configuration: the PV of a volume an
	// operator made is in a class of its own, which a claim of the
	// provisioning class never binds, even naming it, and which
	// claims-policy.yaml keeps tenants out of.
	t.Run("a tenant's claim naming an operator's PV stays Pending, and the operators' class is refused to it", func(t *testing.T) {
		pv, err := k.Admin.CoreV1().PersistentVolumes().Get(ctx, "obj-fs", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, kube.DefaultStaticClass, pv.Spec.StorageClassName)
		// The provisioning class, as the guide makes it.
		sc, errs, code := lead.CLI("storageclass")
		require.Equal(t, 0, code, errs)
		must(sc, "apply")
		tenant := as("tenant", "app")
		must(`apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: claims, namespace: tenant}
rules:
  - apiGroups: [""]
    resources: [persistentvolumeclaims]
    verbs: [create, get, list, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: claims, namespace: tenant}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: claims}
subjects: [{kind: ServiceAccount, name: app, namespace: tenant}]
`, "apply")
		claim := func(name, class string) string {
			return "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: " + name + "}\nspec:\n  storageClassName: " + class +
				"\n  volumeName: obj-fs\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 16Mi}}\n"
		}
		out, err := tenant(claim("steal", kube.DefaultStorageClass), "create")
		require.NoError(t, err, "a tenant may create claims of the provisioning class: %s", out)
		eventually(t, time.Minute, "the PV controller refuses to bind it", func() (bool, string) {
			out, _ := kubectl("", "get", "events", "-n", "tenant", "--field-selector", "involvedObject.name=steal",
				"-o", `jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}`)
			phase, _ := kubectl("", "get", "pvc", "steal", "-n", "tenant", "-o", "jsonpath={.status.phase}")
			return strings.Contains(out, "VolumeMismatch"), "claim " + phase + "; events: " + out
		})
		assert.Equal(t, "Pending", must("", "get", "pvc", "steal", "-n", "tenant", "-o", "jsonpath={.status.phase}"))
		assert.Equal(t, "Available/", must("", "get", "pv", "obj-fs", "-o", "jsonpath={.status.phase}/{.spec.claimRef.name}"), "the operator's PV is not the tenant's")
		out, err = tenant(claim("steal-static", kube.DefaultStaticClass), "create")
		require.Error(t, err, "a tenant claimed the operators' class: %s", out)
		assert.Contains(t, out, "spec.storageClassName: salt-volumes-static")
		assert.Contains(t, out, "only the salt-volumes:operators group may claim them")
		must("", "delete", "pvc", "steal", "-n", "tenant")
	})

	// #48 item 5: kubectl asks for the verb admin where the REST API does
	// (volume-admin-policy.yaml): a raw device, a wipe, a forget.
	t.Run("a raw device, a wipe and a forget need the verb admin with kubectl as with the REST API", func(t *testing.T) {
		must(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: volume-writer}
rules:
  - apiGroups: [salt-volumes.io]
    resources: [volumes, volumes/status]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: volume-admin}
rules:
  - apiGroups: [salt-volumes.io]
    resources: [volumes]
    verbs: [get, list, watch, create, update, patch, delete, admin]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: volume-writer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: volume-writer}
subjects: [{kind: ServiceAccount, name: volume-writer, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: volume-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: volume-admin}
subjects: [{kind: ServiceAccount, name: volume-admin, namespace: default}]
`, "apply")
		writer, admin := as("default", "volume-writer"), as("default", "volume-admin")
		// (kubectl warns first that admin is not one of Kubernetes' verbs.)
		assert.True(t, strings.HasSuffix(must("", "auth", "can-i", "admin", "volumes.salt-volumes.io", "--as", kubecluster.ControlUser), "\nyes"),
			"serve's own identity (rbac.yaml) has the verb: it creates raw volumes for the REST API and removes its finalizer")
		disk := testenv.FakeDisk(t, 32<<20)
		raw := manifest("obj-raw", "rawBlockDevice: {devicePath: "+disk.Path+"}")
		refused := func(out string, err error, why string) {
			t.Helper()
			require.Error(t, err, "allowed: %s", out)
			assert.Contains(t, out, "system:serviceaccount:default:volume-writer may not admin volumes.salt-volumes.io ")
			assert.Contains(t, out, why)
		}

		out, err := writer(raw, "apply")
		refused(out, err, "a Volume on a raw device (spec.rawBlockDevice) needs the verb admin")
		t.Logf("kubectl apply of a raw Volume without admin: %s", out)
		assert.Contains(t, out, "obj-raw")
		// The REST API, asked the same with the same account's token (made
		// for serve's audience, and the API server's).
		tok := must("", "create", "token", "volume-writer", "-n", "default", "--duration", "1h",
			"--audience", "salt-volumes", "--audience", "https://kubernetes.default.svc")
		_, err = (&client.Client{URL: lead.URL, Token: tok}).Create(ctx, map[string]any{"name": "obj-raw", "node": s.MinionID, "rawBlockDevice": map[string]any{"devicePath": disk.Path}})
		var ce *client.Error
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, 403, ce.Status)
		assert.Contains(t, ce.Error(), "may not admin volumes.salt-volumes.io")

		wiped := strings.Replace(manifest("obj-w", "sparseLoopDevice: {size: 16Mi}"), "metadata:\n", "metadata:\n  annotations: {salt-volumes.io/wipe: \"true\"}\n", 1)
		out, err = writer(wiped, "apply")
		refused(out, err, "a wipe (annotation salt-volumes.io/wipe")
		out, err = writer(manifest("obj-w", "sparseLoopDevice: {size: 16Mi}"), "apply")
		require.NoError(t, err, out)
		uuidOf("obj-w")
		waitPhase("obj-w", "Available")
		out, err = writer("", "annotate", "volume", "obj-w", "salt-volumes.io/wipe=true")
		refused(out, err, "a wipe (annotation salt-volumes.io/wipe")
		out, err = writer("", "patch", "volume", "obj-w", "--type", "json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`)
		refused(out, err, "removing the finalizer salt-volumes.io/volume forgets the volume")
		// The status is serve's record, whose wipe and forget flags it
		// carries out: even a role granted volumes/status needs admin.
		out, err = writer("", "patch", "volume", "obj-w", "--subresource=status", "--type", "merge", "-p", `{"status":{"record":{"volume":{"forgetRequested":true}}}}`)
		refused(out, err, "the status of a Volume is the record of the control plane")
		out, err = writer("", "delete", "volume", "obj-w", "--wait=false")
		require.NoError(t, err, "a deletion without a wipe needs only delete: %s", out)
		gone("obj-w")

		out, err = admin(raw, "apply")
		require.NoError(t, err, "the verb admin allows a raw device: %s", out)
		u := uuidOf("obj-raw")
		waitPhase("obj-raw", "Available")
		blkid := func() string {
			out, _ := exec.Command("blkid", "-p", "-o", "value", "-s", "UUID", disk.Path).Output()
			return strings.TrimSpace(string(out))
		}
		require.Equal(t, u, blkid(), "its filesystem is on the disk")
		out, err = admin("", "annotate", "volume", "obj-raw", "salt-volumes.io/wipe=true")
		require.NoError(t, err, "the verb admin allows a wipe: %s", out)
		out, err = writer("", "delete", "volume", "obj-raw", "--wait=false")
		refused(out, err, "a wipe (annotation salt-volumes.io/wipe")
		out, err = admin("", "delete", "volume", "obj-raw", "--wait=false")
		require.NoError(t, err, out)
		gone("obj-raw")
		assert.Empty(t, blkid(), "the deletion wiped what the volume wrote")
	})

	t.Run("a volume made through a follower's REST API is an object kubectl sees", func(t *testing.T) {
		out, errs, code := follower.CLI("create", "obj-rest", "--node", s.MinionID, "--size", "16Mi", "--wait", "--timeout", "2m")
		require.Equal(t, 0, code, "stdout %s stderr %s", out, errs)
		v := getJSON(t, follower, "obj-rest")
		uuids = append(uuids, v.Spec.UUID)
		assert.Equal(t, "Available", phase("obj-rest"))
		assert.Equal(t, v.Spec.UUID, must("", "get", "volume", "obj-rest", "-o", "jsonpath={.spec.uuid}"))
		// Available comes with its PV created; Kubernetes' PV controller
		// moves the PV from Pending to Available a moment later, and a
		// deletion is refused until then (seed 000's criteria), saying so.
		eventually(t, 30*time.Second, "the deletion is accepted once Kubernetes made the PV Available", func() (bool, string) {
			out, errs, code = follower.CLI("rm", "obj-rest")
			if code != 0 {
				require.Contains(t, errs, "its PersistentVolume obj-rest is Pending", "the only refusal expected here")
			}
			return code == 0, out + errs
		})
		gone("obj-rest")
		_, err := os.Stat(filepath.Join(s.StateDir, "sparse", v.Spec.UUID))
		assert.True(t, os.IsNotExist(err), "its storage reclaimed")
	})

	t.Run("the web UI shows the objects kubectl made, and what it makes and deletes kubectl sees", func(t *testing.T) {
		b := newBrowser(t, follower)
		row := func(name, phase string) string {
			return `#volumes tbody tr[data-volume="` + name + `"][data-phase="` + phase + `"]`
		}
		b.login()
		b.do(chromedp.Click(`#nodes tr[data-node="`+s.MinionID+`"] a`),
			chromedp.WaitVisible(row("obj-fs", "Available")))
		b.do(chromedp.Click("#show-create"),
			chromedp.SendKeys("#f-name", "obj-ui"),
			chromedp.SendKeys("#f-size", "16Mi"),
			chromedp.Click(`#create-form button[type="submit"]`),
			chromedp.WaitVisible(row("obj-ui", "Available")))
		uuidOf("obj-ui")
		assert.Equal(t, "Available", phase("obj-ui"), "kubectl sees the volume the UI made")
		b.shot("objects-ui")
		// Delete is enabled once Kubernetes made the new PV Available
		// (until then the row says why it is not).
		b.do(chromedp.WaitEnabled(`#volumes tr[data-volume="obj-ui"] button.delete`),
			chromedp.Click(`#volumes tr[data-volume="obj-ui"] button.delete`),
			chromedp.WaitVisible("#confirm"),
			chromedp.Click("#confirm-ok"),
			chromedp.WaitNotPresent(`#volumes tr[data-volume="obj-ui"]`))
		gone("obj-ui")
		b.noConsoleErrors()
	})

	t.Run("a spec the contract refuses goes Failed naming the field, and deletes cleanly", func(t *testing.T) {
		// The schema lets any label through; the contract keeps our own.
		must(manifest("obj-bad", "sparseLoopDevice: {size: 16Mi}\n  template: {metadata: {labels: {salt-volumes.io/uuid: x}}}"), "apply")
		uuidOf("obj-bad")
		waitPhase("obj-bad", "Failed")
		assert.Equal(t, "InvalidSpec", must("", "get", "volume", "obj-bad", "-o", "jsonpath={.status.reason}"))
		assert.Contains(t, must("", "get", "volume", "obj-bad", "-o", "jsonpath={.status.message}"), "spec.template.metadata.labels")
		must("", "delete", "volume", "obj-bad", "--wait=false")
		gone("obj-bad")
	})

	t.Run("kubectl delete while the PV is Bound waits, saying why, and ends once the claim goes", func(t *testing.T) {
		class := kube.DefaultStaticClass // an operator's claim (the cluster admin here)
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "default"},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeName: "obj-fs",
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}}}}
		_, err := k.Admin.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{})
		require.NoError(t, err)
		eventually(t, time.Minute, "claim bound", func() (bool, string) {
			out, _ := kubectl("", "get", "volume", "obj-fs", "-o", "jsonpath={.status.persistentVolume.phase} {.status.persistentVolume.claim}")
			return out == "Bound default/data", out
		})
		must("", "delete", "volume", "obj-fs", "--wait=false")
		eventually(t, 30*time.Second, "the deletion says why it waits", func() (bool, string) {
			out, _ := kubectl("", "get", "volume", "obj-fs", "-o", `jsonpath={.status.step}|{.status.conditions[?(@.type=="Ready")].message}`)
			return strings.Contains(out, "deletion waits: its PersistentVolume obj-fs is Bound to default/data") && strings.Contains(out, "|deletion waits"), out
		})
		time.Sleep(2 * time.Second)
		assert.NotEmpty(t, must("", "get", "volume", "obj-fs", "-o", "jsonpath={.metadata.deletionTimestamp}"), "kept, marked for deletion")
		u := must("", "get", "volume", "obj-fs", "-o", "jsonpath={.metadata.uid}")
		_, err = os.Stat(filepath.Join(s.StateDir, "sparse", u))
		require.NoError(t, err, "the storage is still there")
		require.NoError(t, k.Admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "data", metav1.DeleteOptions{}))
		gone("obj-fs")
		_, err = os.Stat(filepath.Join(s.StateDir, "sparse", u))
		assert.True(t, os.IsNotExist(err), "its storage reclaimed")
		_, err = k.Admin.CoreV1().PersistentVolumes().Get(ctx, "obj-fs", metav1.GetOptions{})
		assert.Error(t, err, "its PV gone")
	})

	t.Run("kubectl delete while Pending completes after the creation", func(t *testing.T) {
		must(manifest("obj-hasty", "sparseLoopDevice: {size: 16Mi}"), "apply")
		u := uuidOf("obj-hasty")
		eventually(t, time.Minute, "its creation started", func() (bool, string) {
			out, _ := kubectl("", "get", "volume", "obj-hasty", "-o", "jsonpath={.status.job}")
			return out != "", out
		})
		must("", "delete", "volume", "obj-hasty", "--wait=false")
		gone("obj-hasty")
		_, err := os.Stat(filepath.Join(s.StateDir, "sparse", u))
		assert.True(t, os.IsNotExist(err), "its storage reclaimed")
		_, err = os.Stat(filepath.Join(s.StateDir, "volumes", u+".json"))
		assert.True(t, os.IsNotExist(err), "node record removed")
	})

	t.Run("kill -9 of the leader mid-job: the other replica leads and completes it", func(t *testing.T) {
		lead, _ := leaderOf(t, 30*time.Second, replicas...)
		other := replicas[0]
		if other == lead {
			other = replicas[1]
		}
		must(manifest("obj-failover", "sparseLoopDevice: {size: 16Mi}"), "apply")
		uuidOf("obj-failover")
		eventually(t, time.Minute, "its creation started", func() (bool, string) {
			out, _ := kubectl("", "get", "volume", "obj-failover", "-o", "jsonpath={.status.job}")
			return out != "", out
		})
		require.NoError(t, lead.Cmd.Process.Signal(syscall.SIGKILL))
		_, _ = lead.Cmd.Process.Wait()
		lead.Cmd = nil
		got, took := leaderOf(t, 30*time.Second, other)
		assert.Equal(t, other, got)
		t.Logf("the other replica led %s after the kill", took)
		waitPhase("obj-failover", "Available")
		assert.Equal(t, "Available", string(getJSON(t, other, "obj-failover").Status.Phase))
	})

	t.Run("store migrate into Volume objects is refused while a replica leads, and into a cluster holding volumes", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "volumes.db")
		migrate := func() (string, int) {
			_, errs, code := replicas[0].CLI("store", "migrate", "--from", "bbolt:"+src, "--to", "kubernetes:"+k.ControlKubeconfig)
			return errs, code
		}
		errs, code := migrate()
		assert.Equal(t, 3, code, errs)
		assert.Contains(t, errs, "a serve replica holds the Lease salt-volumes/salt-volumes: stop every replica first")
		for _, p := range replicas {
			p.Stop() // a stopped leader gives its Lease up
		}
		errs, code = migrate()
		assert.Equal(t, 1, code, errs)
		assert.Contains(t, errs, "the target already holds 1 volumes")
	})
}
