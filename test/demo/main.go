// Command demo is `make demo`: a salt-master, salt-minion and salt-api on
// loopback (from .venv), `salt-volumes serve` on top, two real volumes
// created through the CLI; it keeps running until Ctrl-C or SIGTERM, then
// deletes what it created and stops what it started.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/test/etcdcluster"
	"github.com/salt-volumes/salt-volumes/test/kubecluster"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testcerts"
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
	withKube := flag.Bool("kubernetes", false, "also run etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a kubelet on containerd; volumes are Volume objects")
	ha := flag.Bool("ha", false, "three etcd members and two serve replicas sharing the volumes (one leads)")
	withTLS := flag.Bool("tls", false, "serve HTTPS with a CA made for the demo (the CLI trusts it through SALT_VOLUMES_CA)")
	binDir := flag.String("bin", "", "directory of salt-volume-exec and salt-volumes (default: the repository's bin/, where make build puts them)")
	flag.Parse()
	if *ha && *withKube {
		fmt.Fprintln(os.Stderr, "demo: --ha and --kubernetes do not go together yet")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (loop devices); run it as root or with sudo")
		os.Exit(1)
	}
	repo, err := saltstack.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if *binDir == "" {
		*binDir = filepath.Join(repo, "bin")
	}
	bin := func(n string) string { return filepath.Join(*binDir, n) }
	r := &runner{}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)

	step("starting salt-master, salt-minion and salt-api on loopback")
	// A 2 s beacon (default 10 s) so that the node's first report shows
	// without waiting.
	// Two people with Salt identities of their own (file eauth): alice
	// may change volumes on node-1 only (her Salt ACL), carol reads.
	alicePw, carolPw := randomHex(12), randomHex(12)
	s := saltstack.StartOpts(r, bin("salt-volume-exec"), saltstack.Options{API: true, SaltVolumes: "beacon_interval: 2\nbeacon_heartbeat: 60",
		FileUsers: map[string]string{"alice": alicePw, "carol": carolPw},
		People: map[string]map[string]any{"file": {
			"alice": []any{map[string]any{"node-1": []any{`^salt_volumes\.apply_volume$`, `^test\.ping$`}}},
			"carol": []any{`^test\.ping$`},
		}}})
	fmt.Printf("  salt root %s, salt-api %s, minion %s\n", s.Root, s.APIURL(), s.MinionID)
	step("a second minion, node-2")
	s.AddMinion("node-2")
	if out, code := s.SyncAll("*"); code != 0 {
		r.Fatalf("saltutil.sync_all failed: %s", out)
	}
	if out, code := s.SaltRun("saltutil.sync_runners"); code != 0 {
		r.Fatalf("saltutil.sync_runners failed: %s", out)
	}
	step("turning on the salt_volumes beacon (state salt_volumes.beacon): the nodes push health, usage and capacity")
	if out, code := s.Salt("*", "state.apply", "salt_volumes.beacon", "--out=json"); code != 0 {
		r.Fatalf("state.apply salt_volumes.beacon failed: %s", out)
	}
	r.Cleanup(func() { testenv.Cleanup(s.StateDir, nil, r.Logf) })

	var kc *kubecluster.Cluster
	kubeSection := ""
	if *withKube {
		step("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd and a kubelet on loopback")
		tools, err := kubecluster.Tools(repo)
		if err != nil {
			r.Fatal(err)
		}
		// The kubelet registers the minion as the node, so the demo's pod
		// really runs and mounts its volume.
		kc, err = kubecluster.StartWithKubelet(context.Background(), filepath.Join(s.Root, "kube"), tools, filepath.Join(repo, "deploy", "kubernetes", "rbac.yaml"), s.MinionID)
		if err != nil {
			r.Fatal(err)
		}
		r.Cleanup(kc.Stop)
		fmt.Printf("  API server %s, binaries %s, logs %s\n", kc.URL, tools, filepath.Join(kc.Dir, "log"))
		step("the Volume custom resource: volumes are Kubernetes objects")
		crd := filepath.Join(repo, "deploy", "kubernetes", "volume-crd.yaml")
		fmt.Printf("  $ kubectl apply -f deploy/kubernetes/volume-crd.yaml\n")
		if out, err := kc.Kubectl("apply", "-f", crd); err != nil {
			r.Fatalf("%v: %s", err, out)
		}
		if out, err := kc.Kubectl("wait", "--for", "condition=Established", "--timeout", "60s", "crd/volumes.salt-volumes.io"); err != nil {
			r.Fatalf("%v: %s", err, out)
		}
		step("the admission policies: tenants' claims off operators' PVs, and the verb admin for raw devices, wipes and forgets")
		fmt.Printf("  $ kubectl apply -f deploy/kubernetes/claims-policy.yaml -f deploy/kubernetes/volume-admin-policy.yaml\n")
		if out, err := kc.Kubectl("apply", "-f", filepath.Join(repo, "deploy", "kubernetes", "claims-policy.yaml"),
			"-f", filepath.Join(repo, "deploy", "kubernetes", "volume-admin-policy.yaml")); err != nil {
			r.Fatalf("%v: %s", err, out)
		}
		kubeSection = "kubernetes:\n  kubeconfig: " + kc.ControlKubeconfig + "\n  volumeObjects: true\n"
	}

	token := randomHex(24)
	accessSection := "access:\n  users: {alice: operator, carol: viewer}\n  eauth: [file]\n"
	tlsSection, caFile, scheme := "", "", "http"
	if *withTLS {
		step("a CA for the demo, and serve's certificate from it (HTTPS)")
		ca, err := testcerts.NewCA("salt-volumes demo CA")
		if err != nil {
			r.Fatal(err)
		}
		dir := filepath.Join(s.Root, "tls")
		caFile = filepath.Join(dir, "ca.crt")
		if err = os.MkdirAll(dir, 0o700); err == nil {
			if err = ca.WriteCA(caFile); err == nil {
				err = ca.Issue(dir, "serve", "salt-volumes", true)
			}
		}
		if err != nil {
			r.Fatal(err)
		}
		tlsSection = fmt.Sprintf("tls:\n  certFile: %[1]s/serve.crt\n  keyFile: %[1]s/serve.key\n  caFile: %[1]s/ca.crt\n", dir)
		scheme = "https"
		fmt.Printf("  CA %s, certificate %s/serve.crt (localhost, 127.0.0.1)\n", caFile, dir)
	}
	storeSection := fmt.Sprintf("store: %s/control/volumes.db\n", s.Root)
	if *withKube {
		storeSection = "" // the Volume objects are the store
	}
	if *ha {
		step("starting three etcd members on loopback")
		ebin, err := etcdcluster.Binary(repo)
		if err != nil {
			r.Fatal(err)
		}
		ec, err := etcdcluster.Start(context.Background(), filepath.Join(s.Root, "etcd"), ebin, 3)
		if err != nil {
			r.Fatal(err)
		}
		r.Cleanup(ec.Stop)
		fmt.Printf("  etcd %s (data and logs in %s)\n", join(ec.Endpoints), ec.Dir)
		storeSection = "etcd:\n  endpoints: [" + strings.Join(ec.Endpoints, ", ") + "]\n"
	}
	replicas := 1
	if *ha {
		replicas = 2
	}
	var url string
	for n := 1; n <= replicas; n++ {
		addr := *listen
		if n > 1 {
			addr = "127.0.0.1:0"
		}
		u, pid := startServe(r, s, bin("salt-volumes"), n, freeAddr(r, addr), token, scheme, caFile, storeSection+kubeSection+accessSection+tlsSection)
		if n == 1 {
			url = u
		}
		if *ha {
			fmt.Printf("replica %d url %s pid %d\n", n, u, pid)
		}
	}

	cli := func(args ...string) error {
		fmt.Printf("  $ salt-volumes %s\n", join(args))
		cmd := exec.Command(bin("salt-volumes"), args...)
		cmd.Env = append(os.Environ(), "SALT_VOLUMES_URL="+url, "SALT_VOLUMES_TOKEN="+token, "SALT_VOLUMES_CA="+caFile)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		return cmd.Run()
	}
	kubectl := func(args ...string) (string, error) {
		fmt.Printf("  $ kubectl %s\n", join(args))
		out, err := kc.Kubectl(args...)
		fmt.Print(indent(out))
		return out, err
	}
	if kc != nil {
		step("a StorageClass of ours: WaitForFirstConsumer, provisioned by salt-volumes")
		sc := filepath.Join(s.Root, "storageclass.yaml")
		cmd := exec.Command(bin("salt-volumes"), "storageclass")
		out, err := cmd.Output()
		if err == nil {
			err = os.WriteFile(sc, out, 0o600)
		}
		if err != nil {
			r.Fatal(err)
		}
		fmt.Printf("  $ salt-volumes storageclass | kubectl apply -f -\n")
		if _, err := kubectl("apply", "-f", sc); err != nil {
			r.Fatal(err)
		}
	}
	created := []string{}
	r.Cleanup(func() {
		step("deleting the demo volumes (loop devices detached, sparse files removed)")
		for _, n := range created {
			_ = cli("rm", n, "--wait", "--timeout", "2m")
		}
	})
	creates := [][]string{
		{"create", "demo-fs", "--node", s.MinionID, "--size", "1Gi", "--fs", "ext4"},
		{"create", "demo-block", "--node", s.MinionID, "--size", "512Mi", "--mode", "Block"},
	}
	if kc != nil {
		step("a sparse ext4 Volume applied with kubectl")
		manifest := filepath.Join(s.Root, "demo-fs.yaml")
		if err := os.WriteFile(manifest, []byte(fmt.Sprintf(demoVolume, s.MinionID)), 0o600); err != nil {
			r.Fatal(err)
		}
		fmt.Print(indent(fmt.Sprintf(demoVolume, s.MinionID)))
		if _, err := kubectl("apply", "-f", manifest); err != nil {
			r.Fatal(err)
		}
		created = append(created, "demo-fs")
		creates = creates[1:]
		step("a sparse block volume made with the CLI: it writes a Volume object too")
	} else {
		step("creating a sparse ext4 filesystem volume and a sparse block volume")
	}
	for _, args := range creates {
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
	// Two beacon intervals: the node reports its new volumes.
	time.Sleep(4 * time.Second)
	step("nodes: capacity and health as the node's beacon reported them")
	_ = cli("nodes")
	if kc == nil {
		step("volumes")
		_ = cli("ls")
		step("the same volume as a Kubernetes local PersistentVolume (docs/kubernetes.md)")
		_ = cli("pv", "demo-fs")
	} else {
		step("the Volume objects, and the PersistentVolumes salt-volumes made before it called them Available")
		_, _ = kubectl("get", "volumes")
		_, _ = kubectl("get", "pv", "-L", "salt-volumes.io/node")
		tenantCannotClaim(r, kubectl, s.Root)
		step("a claim and a pod: the scheduler picks the node, salt-volumes provisions a volume there, the kubelet mounts it")
		claim := filepath.Join(s.Root, "demo-claim.yaml")
		if err := os.WriteFile(claim, []byte(fmt.Sprintf(demoClaim, kubecluster.BusyboxImage)), 0o600); err != nil {
			r.Fatal(err)
		}
		if _, err := kubectl("apply", "-f", claim); err != nil {
			r.Fatal(err)
		}
		r.Cleanup(func() {
			step("deleting the pod and the claim (reclaim policy Delete: the volume goes with it)")
			uid, _ := kc.Kubectl("get", "pvc", "demo-claim", "-o", "jsonpath={.metadata.uid}")
			_, _ = kubectl("delete", "pod", "demo-app", "--grace-period=0")
			_, _ = kubectl("delete", "pvc", "demo-claim")
			if uid != "" {
				_ = cli("wait", "pvc-"+uid, "--for", "Deleted", "--timeout", "2m")
			}
		})
		if _, err := kubectl("wait", "--for=jsonpath={.status.phase}=Bound", "pvc/demo-claim", "--timeout=180s"); err != nil {
			r.Fatalf("the claim was not bound: %v (kubectl describe pvc demo-claim)", err)
		}
		if _, err := kubectl("wait", "--for=condition=Ready", "pod/demo-app", "--timeout=180s"); err != nil {
			r.Fatalf("the pod did not start: %v (kubectl describe pod demo-app)", err)
		}
		_, _ = kubectl("get", "pvc,pv")
		_, _ = kubectl("get", "pod", "demo-app", "-o", "wide")
		_, _ = kubectl("get", "events", "--field-selector", "involvedObject.name=demo-claim")
		step("what the pod wrote on its volume (its log; kubectl logs cannot reach a node without an address)")
		fmt.Print(indent(kc.PodLogs("default", 2000)))
		step("the same Volume objects through the CLI (and the web UI)")
		_ = cli("ls")
	}

	step("the stack is running; in another shell:")
	fmt.Printf("export SALT_VOLUMES_URL=%s\n", url)
	fmt.Printf("export SALT_VOLUMES_TOKEN=%s\n", token)
	if caFile != "" {
		fmt.Printf("export SALT_VOLUMES_CA=%s\n", caFile)
	}
	fmt.Printf("  %s/bin/salt-volumes ls\n", repo)
	fmt.Println("  people, with their own Salt identities (salt-volumes login --user U --eauth file, or the web UI's form):")
	fmt.Printf("user alice password %s eauth file\n", alicePw)
	fmt.Println("  (operator: creates, grows and deletes volumes; her Salt ACL grants node-1 only)")
	fmt.Printf("user carol password %s eauth file\n", carolPw)
	fmt.Println("  (viewer: reads, watches, scrapes metrics; refused every change)")
	if kc != nil {
		fmt.Printf("export KUBECONFIG=%s\n", kc.AdminKubeconfig)
		fmt.Printf("export PATH=%s:$PATH\n", kc.BinDir)
		fmt.Printf("  kubectl get volumes,pv,pvc\n")
	}
	fmt.Printf("  web UI: %s/ (sign in as alice or carol, or paste the token)\n", url)
	if !*once {
		fmt.Println("\nCtrl-C (or SIGTERM) stops everything and detaches what the demo attached.")
		<-sigs
	}
	r.teardown()
	step("stopped")
}

func join(a []string) string { return strings.Join(a, " ") }

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

// demoVolume is the Volume object the demo applies (%s: the node).
const demoVolume = `apiVersion: salt-volumes.io/v1alpha1
kind: Volume
metadata:
  name: demo-fs
spec:
  node: %s
  fsType: ext4
  sparseLoopDevice:
    size: 1Gi
`

// demoClaim is a claim of our class and a pod using it; 2Gi, larger than
// the demo volumes, so that it is provisioned rather than bound to one.
// The pod (%s: the image the kubelet was given) writes on the volume and
// stays up.
const demoClaim = `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: demo-claim
spec:
  storageClassName: salt-volumes
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 2Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: demo-app
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  containers:
    - name: app
      image: %s
      imagePullPolicy: Never
      command: [/bin/sh, -c, 'echo "written by demo-app at $(date)" >> /data/log && cat /data/log && df -h /data && exec sleep 3600']
      volumeMounts:
        - name: data
          mountPath: /data
  volumes:
    - name: data
      persistentVolumeClaim:
        claimName: demo-claim
`

// tenantCannotClaim shows that a tenant (user tenant, claims in namespace
// tenant) cannot take the PV of the Block volume the operator made: its
// claim of the provisioning class naming it stays Pending (serve put the
// PV in salt-volumes-static, a class of its own), and a claim of that
// class is refused at admission (claims-policy.yaml). #48 saw the PV Bound.
func tenantCannotClaim(r *runner, kubectl func(...string) (string, error), root string) {
	step("a tenant's claim naming the operator's PV demo-block: it stays Pending; the operators' class is refused to the tenant")
	file := filepath.Join(root, "demo-tenant.yaml")
	if err := os.WriteFile(file, []byte(demoTenant), 0o600); err != nil {
		r.Fatal(err)
	}
	if _, err := kubectl("apply", "-f", file); err != nil {
		r.Fatal(err)
	}
	claim := func(class string) string {
		f := filepath.Join(root, "demo-steal-"+class+".yaml")
		doc := "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: steal, namespace: tenant}\nspec:\n  storageClassName: " + class +
			"\n  volumeName: demo-block\n  volumeMode: Block\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 256Mi}}\n"
		if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
			r.Fatal(err)
		}
		return f
	}
	if _, err := kubectl("--as", "tenant", "create", "-f", claim("salt-volumes")); err != nil {
		r.Fatal(err)
	}
	var events string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && !strings.Contains(events, "VolumeMismatch"); time.Sleep(time.Second) {
		events, _ = kubectl("get", "events", "-n", "tenant", "--field-selector", "involvedObject.name=steal")
	}
	out, _ := kubectl("get", "pvc", "-n", "tenant", "steal", "pv", "demo-block")
	phase, _ := kubectl("get", "pv", "demo-block", "-o", "jsonpath={.status.phase}")
	if !strings.Contains(events, "VolumeMismatch") || strings.TrimSpace(phase) != "Available" {
		r.Fatalf("the tenant's claim was not refused the operator's PV (PV %s):\n%s%s", phase, out, events)
	}
	if _, err := kubectl("--as", "tenant", "create", "-f", claim("salt-volumes-static")); err == nil {
		r.Fatalf("a tenant created a claim of salt-volumes-static: claims-policy.yaml is not enforced")
	}
	_, _ = kubectl("delete", "pvc", "-n", "tenant", "steal")
}

// demoTenant is a namespace whose user may create claims, nothing more.
const demoTenant = `apiVersion: v1
kind: Namespace
metadata: {name: tenant}
---
apiVersion: rbac.authorization.k8s.io/v1
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
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant}]
`

// freeAddr returns addr if it can be listened on, else a free loopback port.
func freeAddr(r *runner, addr string) string {
	if l, err := net.Listen("tcp", addr); err == nil {
		a := l.Addr().String()
		l.Close()
		return a
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServe runs replica n of salt-volumes serve and waits until it is
// ready; it returns its URL and pid.
func startServe(r *runner, s *saltstack.Stack, bin string, n int, listen, token, scheme, caFile, extra string) (string, int) {
	step("starting salt-volumes serve (replica %d)", n)
	cfg := filepath.Join(s.Root, fmt.Sprintf("control-%d.yaml", n))
	_, ret := s.Ports()
	err := os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: %s
token: %s
salt:
  url: %s
  username: %s
  password: %s
  eauth: file
  publish: master
  master: tcp://127.0.0.1:%d
events:
  source: bus
  socket: %s
%s`, listen, token, s.APIURL(), s.APIUser, s.APIPass, ret, s.EventSocket(), extra)), 0o600)
	if err != nil {
		r.Fatal(err)
	}
	logPath := filepath.Join(s.Root, "log", fmt.Sprintf("control-plane-%d", n))
	logf, err := os.Create(logPath)
	if err != nil {
		r.Fatal(err)
	}
	serve := exec.Command(bin, "serve", "--config", cfg)
	serve.Stdout, serve.Stderr = logf, logf
	// A group of its own: the terminal's Ctrl-C reaches the demo alone,
	// which deletes its volumes through serve before stopping it (serve
	// in the demo's group died with the Ctrl-C, and every deletion met
	// "connection refused").
	serve.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := serve.Start(); err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		_ = serve.Wait()
	})
	url := scheme + "://" + listen
	hc := http.DefaultClient
	if caFile != "" {
		var err error
		if hc, err = client.HTTPS(caFile, "", ""); err != nil {
			r.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get(url + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				fmt.Printf("  listening on %s (log %s): %s\n", url, logPath, strings.TrimSpace(string(body)))
				return url, serve.Process.Pid
			}
		}
		if time.Now().After(deadline) {
			r.Fatalf("salt-volumes serve not ready; see %s", logPath)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
