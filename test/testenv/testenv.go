// Package testenv holds what the integration test packages share: building
// the node binary once, and cleaning up the loop devices and /dev/disk links
// a test's node state left behind.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/loopdev"
)

// Build builds the named commands (cmd/<name>) into dir.
func Build(dir string, names ...string) error {
	for _, n := range names {
		if err := BuildAs(dir, n, "cmd/"+n); err != nil {
			return err
		}
	}
	return nil
}

// BuildAs builds the module's package pkg (e.g. "test/e2e") into dir/name.
func BuildAs(dir, name, pkg string) error {
	out, err := goBuild(filepath.Join(dir, name), "github.com/salt-volumes/salt-volumes/"+pkg).CombinedOutput()
	if err != nil {
		return fmt.Errorf("building %s: %v\n%s", name, err, out)
	}
	return nil
}

// goBuild builds as the Makefile does for what we ship: static, without
// cgo (a cgo build is dynamically linked and starts about 1 ms slower, which
// the prepare benchmarks would count against us), but with the failpoints
// the crash tests drive. ReleaseBuild leaves them out.
func goBuild(out, pkg string) *exec.Cmd {
	return goBuildTags(out, pkg, "-tags", "failpoints")
}

// ReleaseBuild builds the module's package pkg into dir/name exactly as
// `make build` does: no failpoints, no symbol table (which also starts
// about 0.8 ms sooner: what a benchmark of a whole run should count).
func ReleaseBuild(dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	out, err := goBuildTags(bin, "github.com/salt-volumes/salt-volumes/"+pkg, "-ldflags", "-s -w").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", name, err, out)
	}
	return bin, nil
}

func goBuildTags(out, pkg string, flags ...string) *exec.Cmd {
	args := append([]string{"build", "-trimpath"}, flags...)
	cmd := exec.Command("go", append(args, "-o", out, pkg)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}

// BuildExec builds cmd/salt-volume-exec into a temp dir and returns its path
// and a function that removes it. Call it from TestMain.
func BuildExec() (string, func(), error) {
	dir, err := os.MkdirTemp("", "sve-bin")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "salt-volume-exec")
	out, err := goBuild(bin, "github.com/salt-volumes/salt-volumes/cmd/salt-volume-exec").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("building salt-volume-exec: %v\n%s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// MainWithExec is a TestMain body: it builds the binary into *bin, runs the
// tests and exits.
func MainWithExec(m interface{ Run() int }, bin *string) {
	path, cleanup, err := BuildExec()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = path
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// TempDirs makes n temporary directories and, before they are removed,
// detaches every loop device still backed by a file in them (its partition
// first), so a benchmark or test that stops half way through a step (a
// floor command failing after losetup) leaves no device bound.
func TempDirs(t testing.TB, n int) []string {
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	t.Cleanup(func() {
		devs, _ := loopdev.Bound()
		for _, d := range devs {
			back, err := loopdev.BackingFile(d.Name)
			if err != nil {
				continue
			}
			back = strings.TrimSuffix(back, " (deleted)")
			for _, dir := range dirs {
				if strings.HasPrefix(back, dir+"/") {
					_ = loopdev.RemovePartition(d.Name, 1)
					if err := loopdev.Detach(context.Background(), d, 5*time.Second); err != nil {
						t.Logf("cleanup: %v", err)
					}
				}
			}
		}
	})
	return dirs
}

// RemoveLinks removes the /dev/disk/by-uuid and by-partuuid links named
// by these volume UUIDs (never a path: a name with a slash or dot is
// skipped).
func RemoveLinks(uuids ...string) {
	for _, u := range uuids {
		if u == "" || strings.ContainsAny(u, "/.") {
			continue
		}
		os.Remove("/dev/disk/by-uuid/" + u)
		os.Remove("/dev/disk/by-partuuid/" + u)
	}
}

// Cleanup detaches every loop device backed by a sparse file of stateDir and
// removes the /dev/disk links of the given volume UUIDs and of every volume
// stateDir has a record or sparse file of. It only touches what the test
// named or its own state dir names.
func Cleanup(stateDir string, uuids []string, logf func(string, ...any)) {
	ents, _ := os.ReadDir(filepath.Join(stateDir, "sparse"))
	for _, e := range ents {
		devs, _ := loopdev.Find(filepath.Join(stateDir, "sparse", e.Name()))
		for _, d := range devs {
			_ = loopdev.RemovePartition(d.Name, 1)
			if err := loopdev.Detach(context.Background(), d, 5*time.Second); err != nil && logf != nil {
				logf("cleanup: %v", err)
			}
		}
	}
	// The links of every volume the state dir knows of, besides those the
	// test named: a volume a test created without noting its uuid left its
	// link behind, naming a loop device the next test may get.
	all := append([]string(nil), uuids...)
	for _, e := range ents {
		all = append(all, e.Name())
	}
	recs, _ := os.ReadDir(filepath.Join(stateDir, "volumes"))
	for _, e := range recs {
		if u, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			all = append(all, u)
		}
	}
	RemoveLinks(all...)
}

// FakeDisk attaches a sparse image of size bytes as a stand-in for a raw
// disk, optionally partitioned first by sgdisk (an independent tool). The
// loop device and any partitions the test added are removed at cleanup.
func FakeDisk(t testing.TB, size int64, sgdiskArgs ...string) loopdev.Device {
	t.Helper()
	if len(sgdiskArgs) == 0 {
		return FakeDiskWith(t, size, nil)
	}
	return FakeDiskWith(t, size, func(img string) error {
		if out, err := exec.Command("sgdisk", append(sgdiskArgs, img)...).CombinedOutput(); err != nil {
			return fmt.Errorf("sgdisk: %v: %s", err, out)
		}
		return nil
	})
}

// FakeDiskWith is FakeDisk with write putting whatever it likes on the image
// first (a filesystem, a signature); the image keeps its size.
func FakeDiskWith(t testing.TB, size int64, write func(img string) error) loopdev.Device {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if write != nil {
		if err := write(img); err != nil {
			t.Fatal(err)
		}
		// Some tools (xorriso, mksquashfs) cut the image to their own size.
		if err := os.Truncate(img, size); err != nil {
			t.Fatal(err)
		}
	}
	d, err := loopdev.Attach(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 1; i <= 4; i++ {
			_ = loopdev.RemovePartition(d.Name, i)
		}
		if err := loopdev.Detach(context.Background(), d, 5*time.Second); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return d
}

// FreePort returns a loopback TCP port nobody listens on (at the moment of
// asking), below the kernel's ephemeral range: a port the kernel picked
// (":0") is free only until some other program binds ":0" and is handed the
// same one, and Salt's master binds its internal worker queue that way (it
// once took the port a test had chosen for salt-api, which then could
// never start).
func FreePort() (int, error) {
	for range 200 {
		port := freePortLow + rand.IntN(freePortHigh-freePortLow)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken: another test's, or a server's
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free loopback port between 20000 and 32767")
}

// Below Linux's default ephemeral range (32768-60999).
const freePortLow, freePortHigh = 20000, 32768

// CachedBuild runs one of the repository's scripts that build something
// into the cache outside the repository once (scripts/kube-tools.sh,
// scripts/guest-image.sh) and returns the directory it prints. The
// script's progress goes to stderr.
func CachedBuild(repo, script string) (string, error) {
	cmd := exec.Command(filepath.Join(repo, "scripts", script))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/%s: %w", script, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Eventually polls ok until it says done, and fails the test naming what
// did not happen within limit and ok's last word.
func Eventually(t testing.TB, limit time.Duration, what string, ok func() (bool, string)) {
	t.Helper()
	EventuallyEvery(t, limit, 100*time.Millisecond, what, ok)
}

// EventuallyEvery is Eventually with a pause of every between tries: for
// a check that itself costs what the awaited work needs (a command in an
// emulated guest takes the guest's one CPU from the service it waits for).
func EventuallyEvery(t testing.TB, limit, every time.Duration, what string, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	last := ""
	for time.Now().Before(deadline) {
		var done bool
		if done, last = ok(); done {
			return
		}
		time.Sleep(every)
	}
	t.Fatalf("%s: not within %s (last: %s)", what, limit, last)
}

// Fataler is what Run needs of a test: the harnesses that are also driven
// outside go test (the demo) pass their own.
type Fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Run runs cmd to its end and returns its stdout, stderr and exit code; a
// program that could not run at all fails the test.
func Run(t Fataler, cmd *exec.Cmd) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s: %v", cmd.Path, err)
	}
	return out.String(), errb.String(), code
}

// Helm is the helm binary make setup builds from the module proxy
// (scripts/setup.sh), or one on PATH.
func Helm() (string, error) {
	cache := os.Getenv("SALT_VOLUMES_CACHE")
	if cache == "" {
		cache = "/var/cache/salt-volumes"
	}
	if p := filepath.Join(cache, "helm-v3.22.0", "helm"); fileExists(p) {
		return p, nil
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("helm is needed: make setup builds it into %s/helm-v3.22.0", cache)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
