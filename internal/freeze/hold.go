package freeze

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
)

// ErrOverrun: the step did not finish within the limit; the filesystem
// was thawed at the bound and the step abandoned.
var ErrOverrun = errors.New("the freeze limit passed before the copy finished")

// ErrThawedEarly: the watchdog thawed the filesystem on its own (its
// bound, or a signal) before the step finished: the step's result is not
// of one instant.
var ErrThawedEarly = errors.New("the freeze watchdog thawed it before the copy finished")

// Options of a Hold.
type Options struct {
	// Limit bounds the freeze: when it passes the filesystem is thawed
	// and the step abandoned. The watchdog thaws at Limit plus Margin by
	// itself, in case this process cannot (stopped, or stuck).
	Limit, Margin time.Duration
	// Record is the freeze record's path, Mountpoint where root is mounted.
	Record, Mountpoint string
	// Command starts the watchdog; default this very binary
	// (/proc/self/exe, which an upgrade replacing the file on disk does
	// not change) with WatchdogCommand.
	Command []string
	// Frozen is called once the filesystem is frozen, before the step.
	Frozen func()
}

// Hold freezes the filesystem whose mount root is root, runs step, and
// thaws it: at once when step returns, or at the limit (step's context
// ends then, and Hold waits for it to return before it does). It returns
// how long writes may have waited (from the watchdog's start to the
// thaw). ErrBusy: frozen by someone else, nothing done
// and nothing thawed; ErrOverrun, ErrThawedEarly, ErrNotFrozen: the
// freeze did not cover the whole step.
func Hold(ctx context.Context, root *os.File, o Options, step func(context.Context) error) (time.Duration, error) {
	w, err := startWatchdog(root, o)
	if err != nil {
		return 0, err
	}
	bound := time.NewTimer(time.Until(w.start.Add(o.Limit)))
	defer bound.Stop()
	if cause := w.frozen(ctx, root, bound.C); cause != nil {
		if w.answered {
			w.done() // it did not freeze, or died: nothing of ours to thaw
			return 0, cause
		}
		// Out of time, or cancelled, while it freezes: it is told to
		// thaw, which it does as soon as its freeze is made.
		return w.end(o, cause, w.thaw(root, o))
	}
	if o.Frozen != nil {
		o.Frozen()
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stepDone := make(chan error, 1)
	go func() { stepDone <- runStep(sctx, step) }()
	var cause error
	var th thawed
	finished := false
	select {
	case cause = <-stepDone:
		finished = true
		th = w.thaw(root, o)
	case <-bound.C:
		cause = fmt.Errorf("%w (%s): thawed at the bound", ErrOverrun, o.Limit)
		th = w.thaw(root, o)
	case <-ctx.Done():
		cause = ctx.Err()
		th = w.thaw(root, o)
	case word, ok := <-w.words:
		// The watchdog thawed on its own, or died: the step is
		// abandoned (never run on without a watchdog).
		th = w.heard(root, word, ok)
		cause, th.err = th.err, nil
		if !ok {
			cause = errors.Join(fmt.Errorf("the freeze watchdog (pid %d) died while it held %s frozen: copy abandoned", w.cmd.Process.Pid, w.mp), cause)
		} else if cause == nil {
			cause = ErrThawedEarly
		}
	}
	frozenFor, err := w.end(o, cause, th)
	cancel()
	if !finished {
		<-stepDone
	}
	return frozenFor, err
}

// runStep runs step; a binary built with failpoints first waits as long
// as SALT_VOLUMES_TEST_FREEZE_STALL says, as a copy too slow for its
// limit would (the tests' overrun).
func runStep(ctx context.Context, step func(context.Context) error) error {
	if failpoint.Enabled {
		if d, err := time.ParseDuration(os.Getenv("SALT_VOLUMES_TEST_FREEZE_STALL")); err == nil {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return step(ctx)
}

type watchdog struct {
	cmd   *exec.Cmd
	ctl   *os.File
	words <-chan string
	start time.Time
	mp    string
	limit time.Duration
	// record: the freeze record's path, which names the watchdog's pid
	// once it froze (the freeze is ours even if it never said so).
	record string
	// answered: it said frozen or why not; sawFrozen: it said frozen,
	// so the freeze is ours to undo if it dies.
	answered, sawFrozen bool
}

// thawed is how a thaw went; mayHold: the filesystem may still be frozen
// by us (the record stays, for the next run).
type thawed struct {
	err     error
	mayHold bool
}

func startWatchdog(root *os.File, o Options) (*watchdog, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("starting the freeze watchdog: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "freeze-watchdog"), os.NewFile(uintptr(fds[1]), "control")
	argv := o.Command
	if len(argv) == 0 {
		argv = []string{"/proc/self/exe", WatchdogCommand}
	}
	start := time.Now()
	cmd := exec.Command(argv[0], append(argv[1:len(argv):len(argv)], "--limit", o.Limit.String(), "--margin", o.Margin.String(),
		"--deadline", strconv.FormatInt(start.Add(o.Limit+o.Margin).UnixNano(), 10),
		"--record", o.Record, "--mountpoint", o.Mountpoint)...)
	// Only these reach it (exec.Cmd passes Stdin, Stdout, Stderr and
	// ExtraFiles, and Go opens everything close-on-exec); a descriptor
	// this process itself inherited without close-on-exec (from the
	// Salt minion that ran it) is marked so here, and the watchdog
	// closes any above its own at its start anyway.
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	cmd.ExtraFiles = []*os.File{theirs, root}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("starting the freeze watchdog: %w", err)
	}
	return &watchdog{cmd: cmd, ctl: ours, words: lines(ours), start: start, mp: o.Mountpoint, limit: o.Limit, record: o.Record}, nil
}

// frozen waits for the watchdog's answer to the freeze: nil once frozen.
func (w *watchdog) frozen(ctx context.Context, root *os.File, bound <-chan time.Time) error {
	select {
	case word, ok := <-w.words:
		w.answered = true
		switch {
		case !ok:
			return w.diedUnanswered(root)
		case word == wordFrozen:
			w.sawFrozen = true
			return nil
		}
		return w.final(word)
	case <-bound:
		// FIFREEZE writes the filesystem's dirty data out before it
		// returns, and writers wait meanwhile: that counts too.
		return fmt.Errorf("%w (%s): freezing alone took longer", ErrOverrun, w.limit)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// end removes the record once the filesystem is known thawed, reaps the
// watchdog and returns how long the freeze held, cause joined by any
// error of the thaw.
func (w *watchdog) end(o Options, cause error, th thawed) (time.Duration, error) {
	frozenFor := time.Since(w.start)
	err := th.err
	if !th.mayHold {
		if rerr := RemoveRecord(o.Record); rerr != nil {
			err = errors.Join(err, fmt.Errorf("removing the freeze record: %w", rerr))
		}
	}
	w.done()
	return frozenFor, errors.Join(cause, err)
}

// thaw asks the watchdog to thaw and waits for its last word.
func (w *watchdog) thaw(root *os.File, o Options) thawed {
	_, _ = w.ctl.Write([]byte(wordThaw + "\n")) // EPIPE when it is gone: its words tell
	// At the limit plus the margin the watchdog thaws by itself; one that
	// has not answered a moment later is stopped or stuck.
	wait := time.NewTimer(time.Until(w.start.Add(o.Limit + o.Margin + watchdogSlack)))
	defer wait.Stop()
	for {
		select {
		case word, ok := <-w.words:
			if ok && word == wordFrozen {
				w.sawFrozen = true // asked to thaw before it had answered
				continue
			}
			return w.heard(root, word, ok)
		case <-wait.C:
			return w.unanswered(root)
		}
	}
}

// heard takes the watchdog's last word, or its end without one: a
// watchdog that died after it said frozen leaves its freeze to us (root
// is the same filesystem); one that died before may or may not have
// frozen, which nobody can tell, so nothing is thawed then.
func (w *watchdog) heard(root *os.File, word string, ok bool) thawed {
	if ok {
		err := w.final(word)
		return thawed{err, err != nil && !errors.Is(err, ErrThawedEarly) && !errors.Is(err, ErrNotFrozen) && !errors.Is(err, ErrBusy)}
	}
	if !w.sawFrozen && !w.recorded() {
		return thawed{fmt.Errorf("the freeze watchdog (pid %d) died before it answered, with no record of a freeze: if %s was frozen, that freeze is not known to be ours and was left alone",
			w.cmd.Process.Pid, w.mp), false}
	}
	if err := Thaw(root); err != nil {
		return thawed{fmt.Errorf("the freeze watchdog (pid %d) died holding %s frozen: %w", w.cmd.Process.Pid, w.mp, err), !errors.Is(err, ErrNotFrozen)}
	}
	return thawed{}
}

// watchdogSlack: how long past its bound a watchdog that has not thawed
// is taken for stopped or stuck.
const watchdogSlack = 200 * time.Millisecond

// recorded says whether the freeze record names this run's watchdog: it
// froze (it writes the record only once FIFREEZE returned 0). Its pid
// cannot be another process's yet: it is our child, not reaped.
func (w *watchdog) recorded() bool {
	rec, err := ReadRecord(w.record)
	return err == nil && rec.WatchdogPID == w.cmd.Process.Pid && rec.Thawed == ""
}

// diedUnanswered: the watchdog ended before it said frozen or why not.
// If its record shows it froze, the freeze is ours, and thawed here
// (root is the same filesystem); else nothing is thawed.
func (w *watchdog) diedUnanswered(root *os.File) error {
	th := w.heard(root, "", false)
	if !th.mayHold {
		_ = RemoveRecord(w.record)
	}
	if th.err == nil {
		return fmt.Errorf("the freeze watchdog (pid %d) died before it answered, after it froze %s: thawed", w.cmd.Process.Pid, w.mp)
	}
	return th.err
}

// unanswered: the watchdog did not thaw by its bound (stopped, or stuck).
// A freeze known to be ours (it said frozen, or its record names it) is
// thawed here, through root, and the watchdog killed, so that it does not
// thaw later what may be somebody else's freeze by then.
func (w *watchdog) unanswered(root *os.File) thawed {
	pid := w.cmd.Process.Pid
	if !w.sawFrozen && !w.recorded() {
		// Not killed: one stuck in FIFREEZE would die with its freeze
		// made and unrecorded; alive, it thaws at its own bound.
		return thawed{fmt.Errorf("the freeze watchdog (pid %d) did not answer and recorded no freeze: if %s is frozen, that freeze is not known to be ours and was left alone (the watchdog thaws its own as soon as it can)", pid, w.mp), false}
	}
	err := Thaw(root)
	_ = w.cmd.Process.Kill()
	switch {
	case err == nil:
		return thawed{fmt.Errorf("the freeze watchdog (pid %d) did not thaw %s at its bound (stopped or stuck): thawed by the run, watchdog killed", pid, w.mp), false}
	case errors.Is(err, ErrNotFrozen):
		return thawed{fmt.Errorf("the freeze watchdog (pid %d) did not answer at its bound: killed; %w", pid, err), false}
	}
	return thawed{fmt.Errorf("the freeze watchdog (pid %d) did not thaw %s at its bound and the run's own thaw failed: %w", pid, w.mp, err), true}
}

// final reads the watchdog's last word: nil when it thawed as asked.
func (w *watchdog) final(word string) error {
	verb, rest, _ := strings.Cut(word, " ")
	how, msg, _ := strings.Cut(rest, " ")
	switch verb {
	case wordThawed:
		if how == thawedAsked {
			return nil
		}
		return fmt.Errorf("%s: %w (%s)", w.mp, ErrThawedEarly, how)
	case wordNotFrozen:
		return fmt.Errorf("thawing %s: %w", w.mp, ErrNotFrozen)
	case wordBusy:
		return fmt.Errorf("%s is %w", w.mp, ErrBusy)
	case wordError:
		return fmt.Errorf("freeze watchdog: %s", rest)
	case wordFailed:
		return fmt.Errorf("thawing %s (%s): %s", w.mp, how, msg)
	}
	return fmt.Errorf("freeze watchdog: unexpected %q", word)
}

// done closes the control line (a watchdog still waiting takes that for
// its parent's end and thaws) and reaps the watchdog, waiting a moment at
// most: a process left behind is reaped by init once we exit.
func (w *watchdog) done() {
	w.ctl.Close()
	exited := make(chan struct{})
	go func() {
		_ = w.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(time.Second):
	}
}
