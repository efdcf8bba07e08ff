package nodeexec

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
)

// stallMargin: what a writer may wait past the freeze limit (the
// watchdog's own margin is 500 ms; the rest is a busy machine's slack).
const stallMargin = time.Second

// writer writes a block of a file in a mount every 20 ms and keeps how
// long its writes waited. A write into the page cache waits for a frozen
// filesystem (every write does: sb_start_write) and for nothing else here;
// an fsync after each would add the disk's latency, which on a machine
// busy with other suites (make test's guest lane) is seconds, and would
// measure the machine, not the freeze.
type writer struct {
	stop, done chan struct{}
	mu         sync.Mutex
	max        time.Duration // the longest a write waited
	since      time.Time     // when the write under way started
	last       time.Time     // when the last write returned
	err        error
}

func startWriter(t *testing.T, mp string) *writer {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(mp, "writer"), os.O_CREATE|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	w := &writer{stop: make(chan struct{}), done: make(chan struct{}), last: time.Now()}
	go w.loop(f)
	t.Cleanup(func() { w.finish() })
	return w
}

func (w *writer) loop(f *os.File) {
	defer close(w.done)
	defer f.Close()
	buf := make([]byte, 4096)
	for i := 0; ; i++ {
		select {
		case <-w.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		start := time.Now()
		w.mu.Lock()
		w.since = start
		w.mu.Unlock()
		buf[0] = byte(i)
		_, err := f.WriteAt(buf, int64(i%256)*4096)
		d := time.Since(start)
		w.mu.Lock()
		w.since, w.last = time.Time{}, time.Now()
		w.max = max(w.max, d)
		if err != nil && w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
	}
}

// stall is the longest a write has waited, counting one under way.
func (w *writer) stall() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.since.IsZero() {
		return max(w.max, time.Since(w.since))
	}
	return w.max
}

// wroteAfter waits up to d for a write that returns after t0, and says
// how long after t0 it returned.
func (w *writer) wroteAfter(t0 time.Time, d time.Duration) (time.Duration, bool) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		w.mu.Lock()
		last := w.last
		w.mu.Unlock()
		if last.After(t0) {
			return last.Sub(t0), true
		}
	}
	return 0, false
}

// finish stops the writer and returns its longest stall; a write still
// blocked 5 s on is a failure the caller sees in the stall.
func (w *writer) finish() time.Duration {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
	}
	return w.stall()
}

// thawOnCleanup thaws mp before it is unmounted (cleanups run last
// first), whatever a failing test left: an unmount of a frozen filesystem
// would wait forever.
func thawOnCleanup(t *testing.T, mp string) {
	t.Cleanup(func() { _ = exec.Command("fsfreeze", "-u", mp).Run() })
}

// fill writes n bytes of random data to a file in mp, synced.
func fill(t *testing.T, mp string, n int64) {
	t.Helper()
	f, err := os.Create(filepath.Join(mp, "data"))
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 4<<20)
	_, _ = rand.Read(buf)
	for off := int64(0); off < n; off += int64(len(buf)) {
		buf[0]++ // no two chunks alike
		_, err := f.Write(buf)
		require.NoError(t, err)
	}
	require.NoError(t, f.Sync())
}

// mountedFilled prepares a sparse volume on n, mounts it (thawed before
// it is unmounted, whatever a failing test left) and fills it with data
// bytes: its UUID, spec and mountpoint.
func mountedFilled(t *testing.T, n *node, name, size string, data int64) (string, map[string]any, string) {
	t.Helper()
	u, spec, r := n.prepareSparse(name, size, nil)
	mp := mount(t, r.str("persistentPath"))
	thawOnCleanup(t, mp)
	fill(t, mp, data)
	return u, spec, mp
}

// noTrace checks that a snapshot left nothing: no image, partial copy,
// record or freeze record.
func noTrace(t *testing.T, n *node, u, name string) {
	t.Helper()
	for _, suffix := range []string{".img", ".img.part", ".img.part.probe", ".json", ".freeze"} {
		_, err := os.Stat(filepath.Join(n.dir, "snapshots", u, name+suffix))
		assert.True(t, errors.Is(err, os.ErrNotExist), "%s%s is left: %v", name, suffix, err)
	}
}

// startSnapshot runs a snapshot in the background, in a process group of
// its own as Salt's cmd.run starts one, for a test to kill or stop it.
func (n *node) startSnapshot(env []string, spec map[string]any, args ...string) (*exec.Cmd, *bytes.Buffer) {
	n.t.Helper()
	var out bytes.Buffer
	cmd := n.start(env, spec, &out, &out, append([]string{"snapshot", "--spec", "-"}, args...)...)
	return cmd, &out
}

// start runs the binary with args in the background, spec on its stdin,
// in a process group of its own; the test's end kills the group (a run
// the test stopped and never continued included) and reaps it.
func (n *node) start(env []string, spec map[string]any, stdout, stderr io.Writer, args ...string) *exec.Cmd {
	n.t.Helper()
	cmd := exec.Command(binary, append([]string{"--state-dir", n.dir}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(mustJSON(n.t, spec))
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(n.t, cmd.Start())
	var once sync.Once
	n.t.Cleanup(func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		})
	})
	return cmd
}

// readFreezeRecord reads a freeze record as JSON.
func readFreezeRecord(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(b, &rec))
	return rec
}

// waitFor polls for path to exist.
func waitFor(t *testing.T, path string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	t.Fatalf("%s did not appear within %s", path, d)
}

// writeBlocks starts a write to mp and says whether it is still blocked
// after d; the write's result comes on the channel when it returns.
func writeBlocks(mp string, d time.Duration) (bool, <-chan error) {
	ch := make(chan error, 1)
	go func() { ch <- os.WriteFile(filepath.Join(mp, "probe-write"), []byte("x"), 0o600) }()
	select {
	case err := <-ch:
		ch <- err
		return false, ch
	case <-time.After(d):
		return true, ch
	}
}

// A mounted ext4 volume of ~1 GiB of data on an ext4 state dir (no
// reflink): the snapshot freezes it for at most --freeze-limit, or
// refuses before freezing; killed while frozen, the run's watchdog thaws
// at once, and the next run converges.
func TestSnapshotFreezeBounded(t *testing.T) {
	needTools(t, "util-linux", "fsfreeze")
	n := newNode(t)
	u, spec, mp := mountedFilled(t, n, "freeze-big", "1200Mi", 1<<30)
	const limit = 2 * time.Second

	t.Run("within the limit, or refused before freezing", func(t *testing.T) {
		w := startWriter(t, mp)
		start := time.Now()
		r := n.do("snapshot", spec, "--name", "s1", "--freeze-limit", limit.String())
		took := time.Since(start)
		stall := w.finish()
		fmt.Printf("metric snapshot_writer_stall_ms_max %d ms\n", stall.Milliseconds())
		t.Logf("snapshot: exit %d in %s, frozen for %s, writer's longest stall %s; steps %v", r.Code, took.Round(time.Millisecond), r.str("frozenFor"), stall.Round(time.Millisecond), steps(r.Stderr))
		require.NoError(t, w.err)
		if r.Code == 0 {
			assert.Equal(t, "taken", r.str("phase"))
			assert.Equal(t, "sparse-copy", r.str("method"))
			assert.Equal(t, true, r.Out["frozen"])
			frozen, err := time.ParseDuration(r.str("frozenFor"))
			require.NoError(t, err)
			assert.LessOrEqual(t, frozen, limit, "frozen within the limit")
			n.ok("snapshot-delete", spec, "--name", "s1")
		} else {
			assert.Equal(t, 3, r.Code, "refused: %s", r.Stdout)
			assert.Equal(t, "freeze_limit", r.errCode())
			assert.Contains(t, r.errMsg(), "Refused before anything was frozen")
			assert.NotContains(t, steps(r.Stderr), "frozen")
			noTrace(t, n, u, "s1")
		}
		assert.Less(t, stall, limit+stallMargin, "the writer's longest stall")
	})

	t.Run("refused in advance when even the fastest copy cannot fit", func(t *testing.T) {
		w := startWriter(t, mp)
		r := n.do("snapshot", spec, "--name", "s2", "--freeze-limit", "100ms")
		stall := w.finish()
		assert.Equal(t, 3, r.Code, r.Stdout)
		assert.Equal(t, "freeze_limit", r.errCode())
		for _, want := range []string{"--freeze-limit 100ms", "Refused before anything was frozen", "xfs with reflink, btrfs", "LVM volume"} {
			assert.Contains(t, r.errMsg(), want)
		}
		assert.Empty(t, steps(r.Stderr), "refused before copying anything")
		noTrace(t, n, u, "s2")
		assert.Less(t, stall, 500*time.Millisecond, "nothing frozen")
	})

	t.Run("an invalid limit is refused naming the flag", func(t *testing.T) {
		for _, v := range []string{"2", "-1s", "10ms", "1h", "soon"} {
			r := n.do("snapshot", spec, "--name", "s3", "--freeze-limit", v)
			assert.Equal(t, 2, r.Code, v)
			assert.Equal(t, "invalid_freeze_limit", r.errCode(), v)
			assert.Contains(t, r.errMsg(), "--freeze-limit", v)
		}
	})

	t.Run("killed while frozen: thawed at once, the next run converges", func(t *testing.T) {
		w := startWriter(t, mp)
		killed := n.exec([]string{failpoint.CrashEnv + "=frozen"}, mustJSON(t, spec), "snapshot", "--spec", "-", "--name", "s4", "--freeze-limit", limit.String())
		end := time.Now()
		if killed.Code == 3 {
			t.Skipf("refused before freezing on this machine: %s", killed.Stdout)
		}
		require.Equal(t, -1, killed.Code, "killed at the step frozen: %s", killed.Stderr)
		require.Contains(t, steps(killed.Stderr), "frozen")
		after, ok := w.wroteAfter(end, limit+stallMargin)
		assert.True(t, ok, "writes resume without any further run")
		stall := w.stall()
		t.Logf("killed while frozen: writes resumed %s after the run ended; writer's longest stall %s", after.Round(time.Millisecond), stall.Round(time.Millisecond))
		assert.Less(t, stall, limit+stallMargin, "the writer's longest stall")

		r := n.do("snapshot", spec, "--name", "s4", "--freeze-limit", limit.String())
		st := steps(r.Stderr)
		assert.Contains(t, st, "thawed-by-watchdog", "the next run reports the watchdog's thaw")
		if r.Code == 0 {
			assert.Equal(t, "taken", r.str("phase"))
			n.ok("snapshot-delete", spec, "--name", "s4")
		} else {
			assert.Equal(t, "freeze_limit", r.errCode(), r.Stdout)
			noTrace(t, n, u, "s4")
		}
		stall = w.finish()
		require.NoError(t, w.err)
		assert.Less(t, stall, limit+stallMargin, "never frozen past the limit")
	})
	umount(t, mp)
	n.ok("unprepare", spec)
}

// The freeze's other ends, on a small volume: somebody else's freeze is
// never thawed; a frozen step that overruns is thawed at the limit; the
// watchdog thaws by itself when its run cannot, and when the run's whole
// process group is killed; a freeze whose run and watchdog both died is
// reported and thawed by the next run.
func TestSnapshotFreezeEnds(t *testing.T) {
	needTools(t, "util-linux", "fsfreeze")
	n := newNode(t)
	u, spec, mp := mountedFilled(t, n, "freeze-small", "64Mi", 8<<20)
	freezeRecord := filepath.Join(n.dir, "snapshots", u, "s.freeze")
	stall := func(d time.Duration) string { return "SALT_VOLUMES_TEST_FREEZE_STALL=" + d.String() }

	t.Run("frozen by someone else: refused, nothing thawed", func(t *testing.T) {
		out, err := exec.Command("fsfreeze", "-f", mp).CombinedOutput()
		require.NoError(t, err, "fsfreeze -f: %s", out)
		for i := 0; i < 2; i++ { // a second run thaws nothing either
			r := n.do("snapshot", spec, "--name", "s")
			assert.Equal(t, 3, r.Code, r.Stdout)
			assert.Equal(t, "frozen_by_someone_else", r.errCode())
			assert.Contains(t, r.errMsg(), "is frozen by someone else (fsfreeze, a guest agent, a backup tool): snapshot refused, nothing thawed")
			noTrace(t, n, u, "s")
		}
		blocked, wrote := writeBlocks(mp, 300*time.Millisecond)
		assert.True(t, blocked, "our freeze still holds: a write waits")
		out, err = exec.Command("fsfreeze", "-u", mp).CombinedOutput()
		require.NoError(t, err, "fsfreeze -u: the freeze must still be there to thaw: %s", out)
		select {
		case err := <-wrote:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("the write did not go on after our thaw")
		}
	})

	t.Run("a frozen copy that overruns is thawed at the limit", func(t *testing.T) {
		w := startWriter(t, mp)
		start := time.Now()
		r := n.exec([]string{stall(20 * time.Second)}, mustJSON(t, spec), "snapshot", "--spec", "-", "--name", "s", "--freeze-limit", "1s")
		took := time.Since(start)
		st := w.finish()
		t.Logf("overrun: exit %d after %s, writer's longest stall %s", r.Code, took.Round(time.Millisecond), st.Round(time.Millisecond))
		assert.Equal(t, 1, r.Code, r.Stdout)
		assert.Equal(t, "freeze_limit_overrun", r.errCode())
		assert.Contains(t, r.errMsg(), "was thawed at the bound and the snapshot abandoned")
		assert.Less(t, st, time.Second+stallMargin)
		assert.Less(t, took, 10*time.Second, "abandoned, not waited for")
		noTrace(t, n, u, "s")
	})

	t.Run("a run that cannot thaw is thawed by its watchdog at the limit plus its margin", func(t *testing.T) {
		w := startWriter(t, mp)
		cmd, out := n.startSnapshot([]string{stall(20 * time.Second)}, spec, "--name", "s", "--freeze-limit", "1s")
		waitFor(t, freezeRecord, 10*time.Second)
		require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
		frozenAt := time.Now()
		after, ok := w.wroteAfter(frozenAt, 5*time.Second)
		require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
		err := cmd.Wait()
		st := w.finish()
		t.Logf("stopped run: writes resumed %s after it was stopped; writer's longest stall %s", after.Round(time.Millisecond), st.Round(time.Millisecond))
		assert.True(t, ok, "thawed while the run was stopped")
		assert.Less(t, st, time.Second+stallMargin)
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, out.String())
		assert.Equal(t, 1, ee.ExitCode(), out.String())
		assert.Contains(t, out.String(), "thawed")
		noTrace(t, n, u, "s")
	})

	t.Run("the run's process group killed while frozen: its watchdog thaws at once", func(t *testing.T) {
		w := startWriter(t, mp)
		cmd, _ := n.startSnapshot([]string{stall(20 * time.Second)}, spec, "--name", "s", "--freeze-limit", "10s")
		waitFor(t, freezeRecord, 10*time.Second)
		time.Sleep(100 * time.Millisecond) // a writer waits now
		require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL))
		killedAt := time.Now()
		_ = cmd.Wait()
		after, ok := w.wroteAfter(killedAt, 5*time.Second)
		st := w.finish()
		t.Logf("group killed: writes resumed %s after the kill; writer's longest stall %s", after.Round(time.Millisecond), st.Round(time.Millisecond))
		assert.True(t, ok)
		assert.Less(t, after, 500*time.Millisecond, "thawed as soon as the run died, not at the limit")
		r := n.ok("snapshot", spec, "--name", "s")
		assert.Contains(t, steps(r.Stderr), "thawed-by-watchdog")
		assert.Equal(t, "taken", r.str("phase"))
		n.ok("snapshot-delete", spec, "--name", "s")
	})

	t.Run("a watchdog killed while it holds the freeze: the run thaws it and abandons the copy", func(t *testing.T) {
		w := startWriter(t, mp)
		r := n.exec([]string{stall(2 * time.Second), failpoint.CrashEnv + "=freeze-watchdog-frozen"}, mustJSON(t, spec), "snapshot", "--spec", "-", "--name", "s", "--freeze-limit", "5s")
		st := w.finish()
		assert.Equal(t, 1, r.Code, r.Stdout)
		assert.Equal(t, "freeze", r.errCode())
		assert.Contains(t, r.errMsg(), "died while it held")
		assert.Less(t, st, time.Second, "thawed as soon as the watchdog died")
		blocked, wrote := writeBlocks(mp, time.Second)
		require.False(t, blocked)
		require.NoError(t, <-wrote)
		noTrace(t, n, u, "s")
	})

	t.Run("a stale freeze (run and watchdog killed) is reported and thawed by the next run", func(t *testing.T) {
		cmd, _ := n.startSnapshot([]string{stall(20 * time.Second), failpoint.CrashEnv + "=freeze-watchdog-parent-gone"}, spec, "--name", "s", "--freeze-limit", "10s")
		waitFor(t, freezeRecord, 10*time.Second)
		require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL))
		_ = cmd.Wait()
		blocked, wrote := writeBlocks(mp, time.Second)
		require.True(t, blocked, "frozen with nobody left to thaw it")

		list := n.ok("snapshots", spec).Out["snapshots"].([]any)
		require.Len(t, list, 1)
		assert.Equal(t, mp, list[0].(map[string]any)["staleFreeze"])
		assert.Contains(t, list[0].(map[string]any)["warning"], "stale freeze")
		lr := n.exec(nil, "", "list")
		require.Equal(t, 0, lr.Code, lr.Stdout)
		c := lr.Out["capacity"].(map[string]any)
		assert.Contains(t, fmt.Sprint(c["snapshotWarnings"]), "stale freeze", lr.Stdout)
		assert.Equal(t, float64(1), c["staleFreezes"], lr.Stdout)

		r := n.ok("snapshot", spec, "--name", "s")
		assert.Contains(t, steps(r.Stderr), "stale-freeze-thawed")
		assert.Equal(t, "taken", r.str("phase"))
		select {
		case err := <-wrote:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("still frozen after the next run")
		}
		n.ok("snapshot-delete", spec, "--name", "s")
	})

	t.Run("a stale freeze of another snapshot name is settled by any run of the volume", func(t *testing.T) {
		other := filepath.Join(n.dir, "snapshots", u, "a.freeze")
		cmd, _ := n.startSnapshot([]string{stall(20 * time.Second), failpoint.CrashEnv + "=freeze-watchdog-parent-gone"}, spec, "--name", "a", "--freeze-limit", "10s")
		waitFor(t, other, 10*time.Second)
		require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL))
		_ = cmd.Wait()
		blocked, wrote := writeBlocks(mp, 300*time.Millisecond)
		require.True(t, blocked, "frozen with nobody left to thaw it")
		r := n.ok("snapshot", spec, "--name", "b")
		assert.Contains(t, steps(r.Stderr), "stale-freeze-thawed")
		assert.Equal(t, "taken", r.str("phase"))
		select {
		case err := <-wrote:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("still frozen after a run of another name")
		}
		// The take of a, abandoned, is gone with its freeze record.
		noTrace(t, n, u, "a")
		list := n.ok("snapshots", spec).Out["snapshots"].([]any)
		require.Len(t, list, 1)
		assert.Equal(t, "b", list[0].(map[string]any)["name"])
		n.ok("snapshot-delete", spec, "--name", "b")
	})

	t.Run("the watchdog holds no descriptor its run inherited", func(t *testing.T) {
		pr, pw, err := os.Pipe()
		require.NoError(t, err)
		defer pr.Close()
		var ino uint64
		var st syscall.Stat_t
		require.NoError(t, syscall.Fstat(int(pw.Fd()), &st))
		ino = st.Ino
		cmd := exec.Command(binary, "--state-dir", n.dir, "snapshot", "--spec", "-", "--name", "s", "--freeze-limit", "5s")
		cmd.Env = append(os.Environ(), stall(3*time.Second))
		cmd.Stdin = strings.NewReader(mustJSON(t, spec))
		// As a Salt minion's pipe reaches it: open across exec, at 3 to 9.
		cmd.ExtraFiles = []*os.File{pw, pw, pw, pw, pw, pw, pw}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		pw.Close()
		waitFor(t, freezeRecord, 10*time.Second)
		pid := int(readFreezeRecord(t, freezeRecord)["watchdogPID"].(float64))
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		require.NoError(t, err)
		for _, fd := range fds {
			link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			assert.NotEqual(t, fmt.Sprintf("pipe:[%d]", ino), link, "the watchdog holds the run's inherited pipe at fd %s", fd.Name())
		}
		require.NoError(t, cmd.Wait(), out.String())
		n.ok("snapshot-delete", spec, "--name", "s")
	})

	t.Run("a stopped watchdog: the run thaws at the limit plus the margin and kills it", func(t *testing.T) {
		w := startWriter(t, mp)
		cmd, out := n.startSnapshot([]string{stall(20 * time.Second)}, spec, "--name", "s", "--freeze-limit", "2s")
		waitFor(t, freezeRecord, 10*time.Second)
		rec := readFreezeRecord(t, freezeRecord)
		pid := int(rec["watchdogPID"].(float64))
		require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
		stoppedAt := time.Now()
		after, ok := w.wroteAfter(stoppedAt, 6*time.Second)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(pid, syscall.SIGCONT)
			err = <-done
			t.Error("the run did not end while its watchdog was stopped")
		}
		st := w.finish()
		t.Logf("stopped watchdog: writes resumed %s after it was stopped; writer's longest stall %s; %s", after.Round(time.Millisecond), st.Round(time.Millisecond), out.String())
		assert.True(t, ok, "thawed while the watchdog was stopped")
		// The run thaws at the limit, its watchdog's margin (500 ms) and
		// the 200 ms it gives the watchdog to answer; 3.4 s here beside
		// make test's other lane. Without the run's own thaw, writes waited
		// until the watchdog was let go (25 s and more).
		assert.Less(t, st, 2*time.Second+700*time.Millisecond+2*stallMargin, "the writer's longest stall")
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, out.String())
		assert.Equal(t, 1, ee.ExitCode(), out.String())
		assert.Contains(t, out.String(), "thawed by the run, watchdog killed")
		assert.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, 3*time.Second, 20*time.Millisecond, "the watchdog was killed")
		blocked, wrote := writeBlocks(mp, time.Second)
		require.False(t, blocked)
		require.NoError(t, <-wrote)
		noTrace(t, n, u, "s")
	})

	t.Run("a stale freeze past its window: left alone, reported, thawed only with --thaw-stale", func(t *testing.T) {
		cmd, _ := n.startSnapshot([]string{stall(20 * time.Second), failpoint.CrashEnv + "=freeze-watchdog-parent-gone"}, spec, "--name", "s", "--freeze-limit", "10s")
		waitFor(t, freezeRecord, 10*time.Second)
		require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL))
		_ = cmd.Wait()
		// Time passes: the window in which that freeze could only be
		// ours is over (its record's bound a minute ago).
		rec := readFreezeRecord(t, freezeRecord)
		rec["frozenAt"] = time.Now().Add(-2 * time.Minute).UTC().Format(time.RFC3339Nano)
		rec["thawBy"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
		b, err := json.Marshal(rec)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(freezeRecord, b, 0o600))
		// An operator thaws it by hand; a backup tool freezes it since.
		out, err := exec.Command("fsfreeze", "-u", mp).CombinedOutput()
		require.NoError(t, err, "%s", out)
		out, err = exec.Command("fsfreeze", "-f", mp).CombinedOutput()
		require.NoError(t, err, "%s", out)

		for _, verb := range []string{"snapshot", "snapshot-delete"} {
			r := n.do(verb, spec, "--name", "s")
			assert.Equal(t, 3, r.Code, "%s: %s", verb, r.Stdout)
			assert.Equal(t, "stale_freeze", r.errCode(), verb)
			assert.Contains(t, r.errMsg(), "--thaw-stale", verb)
			assert.Contains(t, steps(r.Stderr), "stale-freeze-left", verb)
			blocked, wrote := writeBlocks(mp, 300*time.Millisecond)
			require.True(t, blocked, "%s thawed the backup tool's freeze", verb)
			_ = wrote
		}
		list := n.ok("snapshots", spec).Out["snapshots"].([]any)
		require.Len(t, list, 1)
		assert.Equal(t, mp, list[0].(map[string]any)["staleFreeze"])
		assert.Contains(t, list[0].(map[string]any)["warning"], "--thaw-stale")
		assert.NotContains(t, list[0].(map[string]any)["warning"], "fsfreeze -u")
		lr := n.exec(nil, "", "list")
		require.Equal(t, 0, lr.Code, lr.Stdout)
		c := lr.Out["capacity"].(map[string]any)
		assert.Contains(t, fmt.Sprint(c["snapshotWarnings"]), "--thaw-stale", lr.Stdout)
		assert.Equal(t, float64(1), c["staleFreezes"], lr.Stdout)

		// The operator's explicit action thaws it (the device and mount
		// are the same).
		r := n.ok("snapshot-delete", spec, "--name", "s", "--thaw-stale")
		assert.Contains(t, steps(r.Stderr), "stale-freeze-thawed")
		blocked, wrote := writeBlocks(mp, time.Second)
		require.False(t, blocked)
		require.NoError(t, <-wrote)
		noTrace(t, n, u, "s")
		lr = n.exec(nil, "", "list")
		assert.Nil(t, lr.Out["capacity"].(map[string]any)["staleFreezes"], lr.Stdout)
	})
	umount(t, mp)
	n.ok("unprepare", spec)
}

// Where the state dir shares extents (xfs with reflink), a mounted
// volume is frozen for the reflink alone: no copy first, a short freeze.
func TestSnapshotFreezeReflinkOnly(t *testing.T) {
	n := reflinkNode(t)
	u, spec, mp := mountedFilled(t, n, "freeze-xfs", "128Mi", 64<<20)
	w := startWriter(t, mp)
	r := n.ok("snapshot", spec, "--name", "s", "--freeze-limit", "1s")
	stall := w.finish()
	assert.Equal(t, "reflink", r.str("method"))
	assert.Equal(t, true, r.Out["frozen"])
	assert.Equal(t, []string{"snapshot-reflink-trial", "frozen", "thawed", "snapshot-taken"}, steps(r.Stderr), "no copy made unfrozen first, one timed reflink")
	frozen, err := time.ParseDuration(r.str("frozenFor"))
	require.NoError(t, err)
	t.Logf("reflink: frozen for %s, writer's longest stall %s", frozen, stall.Round(time.Millisecond))
	// Beside the ext4 figure of TestSnapshotFreezeBounded, in the same run.
	fmt.Printf("metric snapshot_writer_stall_ms_max_xfs_reflink %d ms\n", stall.Milliseconds())
	assert.Less(t, frozen, time.Second)
	n.ok("snapshot-delete", spec, "--name", "s")

	// A reflink that takes more than half the limit unfrozen (a file of
	// many extents) is refused before anything is frozen.
	w = startWriter(t, mp)
	r = n.exec([]string{"SALT_VOLUMES_TEST_REFLINK_TRIAL=800ms"}, mustJSON(t, spec), "snapshot", "--spec", "-", "--name", "s", "--freeze-limit", "1s")
	stall = w.finish()
	assert.Equal(t, 3, r.Code, r.Stdout)
	assert.Equal(t, "freeze_limit", r.errCode())
	for _, want := range []string{"a reflink of its", "more than half of --freeze-limit 1s", "Refused before anything was frozen", "LVM volume", "unmount the volume"} {
		assert.Contains(t, r.errMsg(), want)
	}
	assert.NotContains(t, steps(r.Stderr), "frozen")
	noTrace(t, n, u, "s")
	assert.Less(t, stall, 500*time.Millisecond, "nothing frozen")
	umount(t, mp)
	n.ok("unprepare", spec)
}
