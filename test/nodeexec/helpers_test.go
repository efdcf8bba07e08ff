// Package nodeexec tests salt-volume-exec as a user runs it: the real
// binary, real loop devices, real mkfs, checked with util-linux and gdisk.
package nodeexec

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var binary string

func TestMain(m *testing.M) { testenv.MainWithExec(m, &binary) }

// needLoop skips tests that need root and loop devices, saying why.
func needLoop(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop devices, mkfs and /dev/disk links (run make test as root)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs /dev/loop-control (loop module not loaded?)")
	}
	for _, tool := range []string{"mkfs.ext4", "mkfs.xfs", "blkid", "sgdisk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: run make setup", tool)
		}
	}
}

// needTools skips a test that needs tools not installed here, saying
// which and what package provides them.
func needTools(t *testing.T, pkg string, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (%s)", tool, pkg)
		}
	}
}

func needDebugfs(t *testing.T) {
	t.Helper()
	needTools(t, "e2fsprogs", "debugfs")
}

// debugfsCat reads a file out of an ext4 image without mounting it.
func debugfsCat(t *testing.T, img, path string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat "+path, img).Output()
	require.NoError(t, err)
	return string(out)
}

// node is one test's node: its own state dir, and cleanup of everything the
// test attached or linked, even when it fails.
type node struct {
	t     *testing.T
	dir   string
	uuids []string
	bin   string // another build of salt-volume-exec than the package's
}

func newNode(t *testing.T) *node {
	t.Helper()
	needLoop(t)
	n := &node{t: t, dir: filepath.Join(t.TempDir(), "state")}
	t.Cleanup(n.cleanup)
	return n
}

// nodeOnOwnFS is a node whose state dir is on a 320 MiB filesystem of
// its own, made by the command mkfs (given the image) and mounted as
// fstype at the directory it returns.
func nodeOnOwnFS(t *testing.T, fstype string, mkfs ...string) (*node, string) {
	t.Helper()
	needLoop(t)
	d := testenv.FakeDiskWith(t, 320<<20, func(img string) error {
		return exec.Command(mkfs[0], append(mkfs[1:], img)...).Run()
	})
	mnt := t.TempDir()
	require.NoError(t, unix.Mount(d.Path, mnt, fstype, 0, ""))
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	n := &node{t: t, dir: filepath.Join(mnt, "state")}
	t.Cleanup(n.cleanup)
	return n, mnt
}

// reflinkNode is a node whose state dir is on xfs with reflink.
func reflinkNode(t *testing.T) *node {
	t.Helper()
	n, _ := nodeOnOwnFS(t, "xfs", "mkfs.xfs", "-q", "-m", "reflink=1")
	return n
}

func (n *node) cleanup() { testenv.Cleanup(n.dir, n.uuids, n.t.Logf) }

func (n *node) newUUID() string {
	u := uuid.NewString()
	n.uuids = append(n.uuids, u)
	return u
}

// prepareSparse prepares a new sparse volume of size (extra: more of its
// spec) and returns its UUID, its spec and what prepare answered.
func (n *node) prepareSparse(name, size string, extra map[string]any) (string, map[string]any, run) {
	n.t.Helper()
	u := n.newUUID()
	spec := sparseSpec(name, u, size, extra)
	return u, spec, n.ok("prepare", spec)
}

// run is one invocation of the binary.
type run struct {
	Code   int
	Out    map[string]any
	Stdout string
	Stderr string
}

func (r run) str(k string) string {
	v, _ := r.Out[k].(string)
	return v
}

func (r run) errCode() string {
	e, _ := r.Out["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func (r run) errMsg() string {
	e, _ := r.Out["error"].(map[string]any)
	c, _ := e["message"].(string)
	return c
}

func (n *node) exec(env []string, stdin string, args ...string) run {
	n.t.Helper()
	return n.execFiles(env, stdin, nil, args...)
}

// execFiles runs the binary with files as its descriptors 3, 4, ...
func (n *node) execFiles(env []string, stdin string, files []*os.File, args ...string) run {
	n.t.Helper()
	bin := binary
	if n.bin != "" {
		bin = n.bin
	}
	cmd := exec.Command(bin, append([]string{"--state-dir", n.dir}, args...)...)
	cmd.ExtraFiles = files
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := run{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode() // -1 when killed by a signal
	case err != nil:
		n.t.Fatalf("running salt-volume-exec: %v", err)
	}
	if r.Code >= 0 && strings.TrimSpace(r.Stdout) != "" {
		require.NoError(n.t, json.Unmarshal(out.Bytes(), &r.Out), "stdout must be one JSON document: %q", r.Stdout)
	}
	return r
}

func (n *node) do(cmd string, spec map[string]any, extra ...string) run {
	n.t.Helper()
	b, err := json.Marshal(spec)
	require.NoError(n.t, err)
	return n.exec(nil, string(b), append([]string{cmd, "--spec", "-"}, extra...)...)
}

// ok runs a command that must succeed.
func (n *node) ok(cmd string, spec map[string]any, extra ...string) run {
	n.t.Helper()
	r := n.do(cmd, spec, extra...)
	require.Equal(n.t, 0, r.Code, "%s failed: %s\nstderr: %s", cmd, r.Stdout, r.Stderr)
	return r
}

func sparseSpec(name, u, size string, extra map[string]any) map[string]any {
	s := map[string]any{"name": name, "uuid": u, "node": "test", "sparseLoopDevice": map[string]any{"size": size}}
	for k, v := range extra {
		s[k] = v
	}
	return s
}

func rawSpec(name, u, dev string, extra map[string]any) map[string]any {
	s := map[string]any{"name": name, "uuid": u, "rawBlockDevice": map[string]any{"devicePath": dev}}
	for k, v := range extra {
		s[k] = v
	}
	return s
}

// blkid returns blkid's low-level probe of a device as a map.
func blkid(t *testing.T, dev string) map[string]string {
	t.Helper()
	out, _ := exec.Command("blkid", "-p", "-o", "export", dev).Output()
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

// resolves checks that a persistent path leads to the device.
func resolves(t *testing.T, link, devicePath string) {
	t.Helper()
	got, err := filepath.EvalSymlinks(link)
	require.NoError(t, err, "%s must resolve", link)
	require.Equal(t, devicePath, got)
}

// fakeDisk is a stand-in raw disk, optionally partitioned by sgdisk.
func fakeDisk(t *testing.T, size int64, sgdiskArgs ...string) loopdev.Device {
	t.Helper()
	return testenv.FakeDisk(t, size, sgdiskArgs...)
}

// addPartitions tells the kernel about the image's partitions, as a kernel
// with a GPT parser would have.
func addPartitions(t *testing.T, d loopdev.Device, parts ...[2]int64) []string {
	t.Helper()
	var names []string
	for i, p := range parts {
		name, err := loopdev.EnsurePartition(d.Name, i+1, p[0], p[1])
		require.NoError(t, err)
		// The node, not just the name: a node someone made by hand for
		// an earlier partition of that name may still carry its numbers.
		path, err := blockdev.EnsureNode(name)
		require.NoError(t, err)
		names = append(names, path)
	}
	return names
}

// sum hashes a whole device (or a file), to prove a refusal wrote nothing.
func sum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

func mount(t *testing.T, dev string) string {
	t.Helper()
	mp := t.TempDir()
	out, err := exec.Command("mount", dev, mp).CombinedOutput()
	require.NoError(t, err, "mount: %s", out)
	t.Cleanup(func() { _ = exec.Command("umount", mp).Run() })
	return mp
}

// umount unmounts mp and waits (up to 10 s) until nothing holds its device
// any more: make test runs the pod tests beside these, and a container's
// mount namespace created at that moment starts with a copy of this mount,
// which keeps the device busy until the runtime drops its old root.
func umount(t *testing.T, mp string) {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(mp, &st))
	out, err := exec.Command("umount", mp).CombinedOutput()
	require.NoError(t, err, "umount: %s", out)
	name, err := blockdev.Name(blockdev.Dev{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev)})
	if err != nil {
		return
	}
	dev := "/dev/" + name
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			return
		}
		if !errors.Is(err, unix.EBUSY) {
			return
		}
	}
	t.Logf("%s still busy 10 s after unmounting %s", dev, mp)
}

func steps(stderr string) []string {
	var out []string
	for _, line := range strings.Split(stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "step" {
			out = append(out, m["step"].(string))
		}
	}
	return out
}

// stepRecords are the step lines of stderr named step, as decoded JSON.
func stepRecords(stderr, step string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "step" && m["step"] == step {
			out = append(out, m)
		}
	}
	return out
}

// progressOf is the bytes (done, total) each step line named step
// reported, in order.
func progressOf(t *testing.T, stderr, step string) [][2]int64 {
	t.Helper()
	var out [][2]int64
	for _, m := range stepRecords(stderr, step) {
		done, ok1 := m["done"].(float64)
		total, ok2 := m["total"].(float64)
		require.True(t, ok1 && ok2, "step %s without its bytes: %v", step, m)
		out = append(out, [2]int64{int64(done), int64(total)})
	}
	return out
}

// copiedAll asserts a copy told its bytes, as a user's progress bar
// reads them: from none to its whole total, never backwards.
func copiedAll(t *testing.T, stderr, step string) {
	t.Helper()
	p := progressOf(t, stderr, step)
	require.GreaterOrEqual(t, len(p), 2, "%s: a copy's start and end: %v", step, p)
	total := p[0][1]
	assert.Positive(t, total)
	assert.Equal(t, [2]int64{0, total}, p[0])
	assert.Equal(t, [2]int64{total, total}, p[len(p)-1])
	for i := 1; i < len(p); i++ {
		assert.GreaterOrEqual(t, p[i][0], p[i-1][0], "%s went backwards: %v", step, p)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
