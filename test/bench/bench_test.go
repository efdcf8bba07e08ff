// Package bench measures salt-volume-exec against the shell floor a person
// would type by hand, in the same run, and prints the ratio.
package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

var binary string

func TestMain(m *testing.M) { testenv.MainWithExec(m, &binary) }

func needRoot(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root and loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		b.Skip("needs /dev/loop-control")
	}
}

func ours(b *testing.B, stateDir, size string) (time.Duration, func()) {
	u := uuid.NewString()
	spec := fmt.Sprintf(`{"name":"bench-%s","uuid":"%s","sparseLoopDevice":{"size":"%s"}}`, u[:8], u, size)
	start := time.Now()
	cmd := exec.Command(binary, "--state-dir", stateDir, "--log-level", "error", "prepare", "--spec", "-")
	cmd.Stdin = strings.NewReader(spec)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("prepare: %v: %s", err, out)
	}
	d := time.Since(start)
	return d, func() {
		cmd := exec.Command(binary, "--state-dir", stateDir, "--log-level", "error", "unprepare", "--spec", "-")
		cmd.Stdin = strings.NewReader(spec)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Errorf("unprepare: %v: %s", err, out)
		}
	}
}

// floor is what an operator types: truncate, losetup, mkfs.ext4 -U, with the
// same mkfs options salt-volume-exec uses.
func floor(b *testing.B, dir, size string) (time.Duration, func()) {
	u := uuid.NewString()
	file := filepath.Join(dir, u)
	start := time.Now()
	if out, err := exec.Command("truncate", "-s", strings.TrimSuffix(size, "i"), file).CombinedOutput(); err != nil {
		b.Fatalf("truncate: %v: %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--partscan", file).Output()
	if err != nil {
		b.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-U", u, "-E", "nodiscard", dev).CombinedOutput(); err != nil {
		b.Fatalf("mkfs: %v: %s", err, out)
	}
	d := time.Since(start)
	return d, func() {
		detachFile(file)
		os.Remove(file)
	}
}

// detachFile detaches the loop devices bound to file, known by it: by
// the time a cleanup runs, the number losetup printed may be another
// program's.
func detachFile(file string) {
	devs, _ := loopdev.Find(file)
	for _, d := range devs {
		_ = loopdev.RemovePartition(d.Name, 1) // added by hand (addpart)
		_ = loopdev.Detach(context.Background(), d, 10*time.Second)
	}
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkPrepare10GiB: one 10 GiB sparse ext4 volume, ours vs the floor,
// alternating so both see the same machine state.
func BenchmarkPrepare10GiB(b *testing.B) {
	needRoot(b)
	dirs := testenv.TempDirs(b, 2)
	state, floorDir := dirs[0], dirs[1]
	var o, f []time.Duration
	for range max(b.N, sized(20, 2)) {
		d, undo := ours(b, state, "10Gi")
		o = append(o, d)
		undo()
		d, undo = floor(b, floorDir, "10Gi")
		f = append(f, d)
		undo()
	}
	ratio := float64(median(o)) / float64(median(f))
	b.ReportMetric(float64(median(o).Microseconds())/1000, "ms/prepare")
	b.ReportMetric(float64(median(f).Microseconds())/1000, "ms/floor")
	b.ReportMetric(ratio, "x-floor")
	fmt.Printf("prepare 10Gi sparse ext4: salt-volume-exec %v, shell floor %v, ratio %.2fx (median of %d)\n",
		median(o).Round(time.Microsecond), median(f).Round(time.Microsecond), ratio, len(o))
	metric(b, "prepare_ratio_ext4", ratio, "x")
}

// BenchmarkPrepare50Concurrent: 50 volumes prepared at once on one node, ours
// vs 50 shell floors at once.
func BenchmarkPrepare50Concurrent(b *testing.B) {
	needRoot(b)
	n := sized(50, 4)
	dirs := testenv.TempDirs(b, 2)
	state, floorDir := dirs[0], dirs[1]
	wave := func(fn func(*testing.B, string, string) (time.Duration, func()), dir string) time.Duration {
		var wg sync.WaitGroup
		undos := make([]func(), n)
		start := time.Now()
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				_, undos[i] = fn(b, dir, "1Gi")
			}(i)
		}
		wg.Wait()
		d := time.Since(start)
		for _, u := range undos {
			if u != nil {
				u()
			}
		}
		return d
	}
	var o, f []time.Duration
	for i := 0; i < b.N; i++ {
		o = append(o, wave(ours, state))
		f = append(f, wave(floor, floorDir))
	}
	ratio := float64(median(o)) / float64(median(f))
	b.ReportMetric(float64(median(o).Milliseconds()), "ms/50-volumes")
	b.ReportMetric(float64(median(f).Milliseconds()), "ms/50-floors")
	b.ReportMetric(ratio, "x-floor")
	fmt.Printf("prepare 50 x 1Gi concurrently: salt-volume-exec %v, shell floor %v, ratio %.2fx (median of %d)\n",
		median(o).Round(time.Millisecond), median(f).Round(time.Millisecond), ratio, b.N)
}

// metric records one summary line, "metric <name> <value> <unit>", in
// test-results/bench-metrics.txt; make bench prints them at the end so that
// runs can be compared.
func metric(b *testing.B, name string, value float64, unit string) {
	b.Helper()
	fmt.Printf("metric %s %s %s\n", name, strconv.FormatFloat(value, 'f', -1, 64), unit)
	repo, err := saltstack.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(repo, "test-results")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	// The framework may call a benchmark more than once: the last
	// measurement of a metric replaces the earlier ones.
	path := filepath.Join(dir, "bench-metrics.txt")
	if smoke {
		path = filepath.Join(dir, "bench-metrics-smoke.txt")
	}
	old, _ := os.ReadFile(path)
	var keep []string
	for _, line := range strings.Split(strings.TrimSpace(string(old)), "\n") {
		if line != "" && !strings.HasPrefix(line, "metric "+name+" ") {
			keep = append(keep, line)
		}
	}
	keep = append(keep, fmt.Sprintf("metric %s %s %s", name, strconv.FormatFloat(value, 'f', 3, 64), unit))
	if err := os.WriteFile(path, []byte(strings.Join(keep, "\n")+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
}

// floorBlock is the shell floor of a sparse Block volume: the file, a GPT
// with one partition whose unique GUID is the volume's, the loop device,
// and the partition node added (addpart, BLKPG: the kernel here has no
// partition parser, and partx cannot read the table of a loop device).
func floorBlock(b *testing.B, dir, size string) (time.Duration, func()) {
	u := uuid.NewString()
	file := filepath.Join(dir, u)
	start := time.Now()
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			b.Fatalf("%s: %v: %s", name, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("truncate", "-s", strings.TrimSuffix(size, "i"), file)
	run("sgdisk", "-q", "-n", "1:2048:0", "-u", "1:"+u, file)
	dev := run("losetup", "--find", "--show", file)
	// The partition sgdisk made: 2048 to the last usable sector.
	run("addpart", dev, "1", "2048", strconv.FormatInt(sizeBytes(size)/512-2048-33, 10))
	d := time.Since(start)
	return d, func() {
		detachFile(file)
		os.Remove(file)
	}
}

// BenchmarkPrepareBlock: one 10 GiB sparse Block volume, ours vs the floor.
func BenchmarkPrepareBlock(b *testing.B) {
	needRoot(b)
	dirs := testenv.TempDirs(b, 2)
	state, floorDir := dirs[0], dirs[1]
	var o, f []time.Duration
	for range max(b.N, sized(20, 2)) {
		u := uuid.NewString()
		spec := fmt.Sprintf(`{"name":"blk-%s","uuid":"%s","mode":"Block","sparseLoopDevice":{"size":"10Gi"}}`, u[:8], u)
		o = append(o, runPrepare(b, state, spec))
		d, undo := floorBlock(b, floorDir, "10Gi")
		f = append(f, d)
		undo()
	}
	ratio := float64(median(o)) / float64(median(f))
	fmt.Printf("prepare 10Gi sparse Block: salt-volume-exec %v, shell floor (truncate, sgdisk, losetup, addpart) %v, ratio %.2fx (median of %d)\n",
		median(o).Round(time.Microsecond), median(f).Round(time.Microsecond), ratio, len(o))
	metric(b, "prepare_ratio_block", ratio, "x")
}

// runPrepare times one prepare of spec and undoes it.
func runPrepare(b *testing.B, state, spec string) time.Duration {
	start := time.Now()
	cmd := exec.Command(binary, "--state-dir", state, "--log-level", "error", "prepare", "--spec", "-")
	cmd.Stdin = strings.NewReader(spec)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("prepare: %v: %s", err, out)
	}
	d := time.Since(start)
	cmd = exec.Command(binary, "--state-dir", state, "--log-level", "error", "unprepare", "--wipe", "--spec", "-")
	cmd.Stdin = strings.NewReader(spec)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("unprepare: %v: %s", err, out)
	}
	return d
}

// BenchmarkPrepareRaw: a raw device (a loop device on a sparse file, made
// outside the timing) formatted as a volume. The floor is the same job done
// safely by hand: `wipefs --no-act` (libblkid's full probe, which ours runs
// too before its first write) then `mkfs.ext4 -U`. Bare mkfs.ext4 is no
// floor for that job: run from a script (stdin not a terminal) it checks
// nothing and formats over an existing filesystem; its ratio is printed too.
func BenchmarkPrepareRaw(b *testing.B) {
	needRoot(b)
	dirs := testenv.TempDirs(b, 2)
	state, dir := dirs[0], dirs[1]
	disk := func() (loopdev.Device, func()) {
		file := filepath.Join(dir, uuid.NewString())
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Truncate(file, 10<<30); err != nil {
			b.Fatal(err)
		}
		dev, err := loopdev.Attach(context.Background(), file)
		if err != nil {
			b.Fatal(err)
		}
		return dev, func() {
			_ = loopdev.Detach(context.Background(), dev, 10*time.Second)
			os.Remove(file)
		}
	}
	var o, f, g []time.Duration
	for range max(b.N, sized(20, 2)) {
		dev, undo := disk()
		u := uuid.NewString()
		spec := fmt.Sprintf(`{"name":"raw-%s","uuid":"%s","rawBlockDevice":{"devicePath":"%s"}}`, u[:8], u, dev.Path)
		o = append(o, runPrepare(b, state, spec))
		undo()
		dev, undo = disk()
		start := time.Now()
		if out, err := exec.Command("mkfs.ext4", "-q", "-U", uuid.NewString(), "-E", "nodiscard", dev.Path).CombinedOutput(); err != nil {
			b.Fatalf("mkfs: %v: %s", err, out)
		}
		f = append(f, time.Since(start))
		undo()
		// The floor of a careful operator: libblkid's full probe first, as
		// ours does before any first write.
		dev, undo = disk()
		start = time.Now()
		if out, err := exec.Command("wipefs", "--no-act", dev.Path).CombinedOutput(); err != nil {
			b.Fatalf("wipefs: %v: %s", err, out)
		}
		if out, err := exec.Command("mkfs.ext4", "-q", "-U", uuid.NewString(), "-E", "nodiscard", dev.Path).CombinedOutput(); err != nil {
			b.Fatalf("mkfs: %v: %s", err, out)
		}
		g = append(g, time.Since(start))
		undo()
	}
	ratio := float64(median(o)) / float64(median(g))
	bare := float64(median(o)) / float64(median(f))
	fmt.Printf("prepare a raw device as ext4: salt-volume-exec %v, shell floor (wipefs --no-act, mkfs.ext4 -U) %v, ratio %.2fx; bare mkfs.ext4 -U %v, ratio %.2fx (median of %d)\n",
		median(o).Round(time.Microsecond), median(g).Round(time.Microsecond), ratio,
		median(f).Round(time.Microsecond), bare, len(o))
	metric(b, "prepare_ratio_raw", ratio, "x")
	metric(b, "prepare_ratio_raw_bare_mkfs", bare, "x")
}

func sizeBytes(size string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSuffix(size, "Gi"), 10, 64)
	return n << 30
}
