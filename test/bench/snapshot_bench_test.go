package bench

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// BenchmarkSnapshotSparse: a snapshot of a sparse volume (10 GiB, 1 GiB
// written) against cp of its backing file in the same run, alternating:
// on an xfs state dir with reflink (`cp --reflink=always`), and on the
// host's ext4 (`cp --sparse=always`). Ours includes the binary's start,
// its lock, its records and the loop device's flush: the binary as
// released (make build), not the test build with failpoints.
func BenchmarkSnapshotSparse(b *testing.B) {
	needRoot(b)
	release, err := testenv.ReleaseBuild(b.TempDir(), "salt-volume-exec", "cmd/salt-volume-exec")
	if err != nil {
		b.Fatal(err)
	}
	size, written := "10Gi", int64(1<<30)
	if smoke {
		size, written = "512Mi", 32<<20
	}
	runs := sized(5, 1)

	// The reflink side: an xfs of its own on a loop device.
	img := filepath.Join(b.TempDir(), "xfs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(img, 16<<30); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		b.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	xfsDir := b.TempDir()
	loop, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		b.Fatal(err)
	}
	dev := strings.TrimSpace(string(loop))
	b.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	if err := unix.Mount(dev, xfsDir, "xfs", 0, ""); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unix.Unmount(xfsDir, unix.MNT_DETACH) })

	for _, side := range []struct {
		name, stateDir, cpFlag, metric string
	}{
		{"reflink", filepath.Join(xfsDir, "state"), "--reflink=always", "snapshot_sparse_reflink"},
		{"sparse", filepath.Join(b.TempDir(), "state"), "--sparse=always", "snapshot_sparse_copy"},
	} {
		u := uuid.NewString()
		spec := fmt.Sprintf(`{"name":"bench-snap","uuid":"%s","sparseLoopDevice":{"size":"%s"}}`, u, size)
		exe := func(args ...string) []byte {
			cmd := exec.Command(release, append([]string{"--state-dir", side.stateDir, "--log-level", "error"}, args...)...)
			cmd.Stdin = strings.NewReader(spec)
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("%v: %v: %s", args, err, out)
			}
			return out
		}
		exe("prepare", "--spec", "-")
		b.Cleanup(func() { testenv.Cleanup(side.stateDir, []string{u}, b.Logf) })
		backing := filepath.Join(side.stateDir, "sparse", u)
		// Data written through the volume's filesystem, as a user would.
		var res struct{ PersistentPath string }
		_ = json.Unmarshal(exe("info", "--spec", "-"), &res)
		// Mounted in a namespace of its own: a concurrent test's
		// namespace would keep a host mount's device open.
		err := testenv.WithPrivateMount(res.PersistentPath, func(mp string) error {
			f, err := os.Create(filepath.Join(mp, "data"))
			if err != nil {
				return err
			}
			_, err = io.CopyN(f, rand.Reader, written)
			return errors.Join(err, f.Close())
		})
		if err != nil {
			b.Fatal(err)
		}
		var ours, cps []time.Duration
		for i := range runs {
			start := time.Now()
			exe("snapshot", "--spec", "-", "--name", fmt.Sprintf("s%d", i))
			ours = append(ours, time.Since(start))
			dst := filepath.Join(side.stateDir, fmt.Sprintf("cp-%d", i))
			start = time.Now()
			if out, err := exec.Command("cp", side.cpFlag, backing, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp: %v: %s", err, out)
			}
			// cp does not sync; ours syncs the copy: the floor pays it too.
			if out, err := exec.Command("sync", dst).CombinedOutput(); err != nil {
				b.Fatalf("sync: %v: %s", err, out)
			}
			cps = append(cps, time.Since(start))
			os.Remove(dst)
			exe("snapshot-delete", "--spec", "-", "--name", fmt.Sprintf("s%d", i))
		}
		o, c := median(ours), median(cps)
		metric(b, side.metric+"_ms", float64(o.Microseconds())/1000, "ms")
		metric(b, side.metric+"_cp_ms", float64(c.Microseconds())/1000, "ms")
		metric(b, side.metric+"_ratio", float64(o)/float64(c), "x")
		exe("unprepare", "--spec", "-")
	}
}
