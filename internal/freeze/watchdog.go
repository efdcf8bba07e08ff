package freeze

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
)

// WatchdogCommand is the hidden subcommand of salt-volume-exec that runs
// RunWatchdog.
const WatchdogCommand = "freeze-watchdog"

// The watchdog's words on its control line (one a line): the answer to
// the freeze (busy, error, frozen), then, once, how it thawed.
const (
	wordFrozen    = "frozen"
	wordBusy      = "busy"
	wordError     = "error"
	wordThaw      = "thaw"   // the parent's only word
	wordThawed    = "thawed" // thawed HOW
	wordNotFrozen = "not-frozen"
	wordFailed    = "thaw-failed" // thaw-failed HOW MESSAGE
	thawedAsked   = "asked"
)

// RunWatchdog is the watchdog's process: fd 3 is its control line to the
// run that asked for the freeze, fd 4 the mount root to freeze. It
// freezes, records the freeze, says so, and thaws on the word "thaw", on
// the line's end (its parent died: a SIGKILL closes every descriptor),
// on SIGTERM, SIGINT or SIGHUP, or at --deadline (the run's start plus
// the limit and the margin, absolute: a slow exec does not move it),
// whichever comes first. That bound is armed before FIFREEZE, in a timer
// of its own, so that it thaws whatever the rest is blocked on (the
// record's fsync on a slow disk). It runs in a session of its own
// (Setsid), so that a signal to its parent's process group, which is how
// a Salt watchdog or a shell kills a command, does not reach it.
func RunWatchdog(args []string) int {
	// Descriptors its caller's caller left open without close-on-exec
	// (a Salt minion's pipe): holding them would keep their readers
	// waiting for as long as the freeze.
	_ = unix.CloseRange(5, ^uint(0), 0)
	fl := flag.NewFlagSet(WatchdogCommand, flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	limit := fl.Duration("limit", 0, "the freeze limit")
	margin := fl.Duration("margin", 0, "slack past the limit before the watchdog thaws itself")
	deadline := fl.Int64("deadline", 0, "when to thaw at the latest (Unix nanoseconds)")
	record := fl.String("record", "", "the freeze record's path")
	mountpoint := fl.String("mountpoint", "", "where the filesystem is mounted (for the record)")
	if err := fl.Parse(args); err != nil || *limit <= 0 || *margin < 0 || *record == "" {
		fmt.Fprintln(os.Stderr, "freeze-watchdog is started by salt-volume-exec snapshot, not by hand")
		return 2
	}
	// What a run hands over: a socket and a directory. Anything else (a
	// hand-made call with stray descriptors) is not frozen.
	if !isType(3, unix.S_IFSOCK) || !isType(4, unix.S_IFDIR) {
		fmt.Fprintln(os.Stderr, "freeze-watchdog is started by salt-volume-exec snapshot, not by hand")
		return 2
	}
	by := time.Now().Add(*limit + *margin)
	if *deadline > 0 {
		by = time.Unix(0, *deadline)
	}
	w := &watchdogProc{ctl: os.NewFile(3, "control"), root: os.NewFile(4, *mountpoint),
		record: *record, mountpoint: *mountpoint, limit: *limit}
	return w.run(by)
}

func isType(fd int, mode uint32) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == mode
}

type watchdogProc struct {
	ctl, root          *os.File
	record, mountpoint string
	limit              time.Duration

	// The bound's timer and the main path agree under mu on who thaws:
	// frozen once FIFREEZE returned 0, expired once the bound passed,
	// ended once the main path thaws itself.
	mu                     sync.Mutex
	frozen, expired, ended bool
}

func (w *watchdogProc) run(by time.Time) int {
	// Installed before the freeze: a signal that comes while it is being
	// made finds the handler and thaws it at once.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	boundThaw := make(chan error, 1)
	bound := time.AfterFunc(time.Until(by), func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.ended {
			return
		}
		w.expired = true
		if w.frozen {
			boundThaw <- Thaw(w.root)
		}
	})
	defer bound.Stop()
	start := time.Now()
	rec, err := w.freeze(start, by)
	if err != nil {
		if errors.Is(err, ErrBusy) {
			w.say(wordBusy)
		} else {
			w.say(wordError + " " + oneLine(err))
		}
		return 0
	}
	w.say(wordFrozen)
	failpoint.Hit("freeze-watchdog-frozen")
	how, thawErr, done := w.wait(lines(w.ctl), sigs, boundThaw)
	if how == ThawedParentGone {
		failpoint.Hit("freeze-watchdog-parent-gone")
	}
	if !done {
		thawErr = w.thawOnce(boundThaw)
		if thawErr == errBoundThawed {
			how, thawErr = ThawedAtBound, <-boundThaw
		}
	}
	w.settle(rec, how, thawErr)
	switch {
	case thawErr == nil:
		w.say(wordThawed + " " + how)
	case errors.Is(thawErr, ErrNotFrozen):
		w.say(wordNotFrozen + " " + how)
	default:
		w.say(wordFailed + " " + how + " " + oneLine(thawErr))
		return 1
	}
	return 0
}

var errBoundThawed = errors.New("thawed at the bound")

// thawOnce thaws unless the bound's timer does (errBoundThawed: its
// result comes on boundThaw).
func (w *watchdogProc) thawOnce(boundThaw <-chan error) error {
	w.mu.Lock()
	if w.expired {
		w.mu.Unlock()
		return errBoundThawed
	}
	w.ended = true
	w.mu.Unlock()
	return Thaw(w.root)
}

// freeze makes the freeze and its record; a record that cannot be
// written undoes the freeze (a freeze no later run could find). Nothing
// is frozen once the bound passed or when the run that asked is gone or
// has withdrawn (its control line ended, or says thaw).
func (w *watchdogProc) freeze(start, by time.Time) (*Record, error) {
	id, err := Identify(w.root)
	if err != nil {
		return nil, err
	}
	if !time.Now().Before(by) {
		return nil, errors.New("the freeze limit passed before the watchdog could freeze: nothing frozen")
	}
	fds := []unix.PollFd{{Fd: 3, Events: unix.POLLIN | unix.POLLRDHUP}}
	if n, _ := unix.Poll(fds, 0); n > 0 {
		return nil, errors.New("its run ended or withdrew before the freeze: nothing frozen")
	}
	if err := Freeze(w.root); err != nil {
		return nil, err
	}
	w.mu.Lock()
	if w.expired {
		w.mu.Unlock()
		return nil, errors.Join(errors.New("freezing took past the bound: thawed at once"), Thaw(w.root))
	}
	w.frozen = true
	w.mu.Unlock()
	self := os.Getpid()
	rec := &Record{Version: 1, Mountpoint: w.mountpoint, Identity: id, WatchdogPID: self, WatchdogStart: processStart(self),
		BootID: BootID(), FrozenAt: start.UTC(), Limit: w.limit.String(), ThawBy: by.UTC()}
	if err := WriteRecord(w.record, rec); err != nil {
		terr := w.thawOnce(nil)
		if terr == errBoundThawed {
			terr = nil
		}
		_ = RemoveRecord(w.record)
		return nil, errors.Join(fmt.Errorf("recording the freeze of %s: %w", w.mountpoint, err), terr)
	}
	return rec, nil
}

// wait returns why the freeze ends: asked, the parent gone, a signal or
// the bound (done: the bound's timer has thawed, with err).
func (w *watchdogProc) wait(words <-chan string, sigs <-chan os.Signal, boundThaw <-chan error) (how string, err error, done bool) {
	for {
		select {
		case word, ok := <-words:
			if !ok {
				return ThawedParentGone, nil, false
			}
			if word == wordThaw {
				return thawedAsked, nil, false
			}
		case err := <-boundThaw:
			return ThawedAtBound, err, true
		case <-sigs:
			return ThawedSignal, nil, false
		}
	}
}

// settle leaves the record as the thaw left things: gone after a thaw
// asked for (the parent reports it), kept with how it went otherwise, for
// the next run to report, or to retry when FITHAW failed.
func (w *watchdogProc) settle(rec *Record, how string, thawErr error) {
	if how == thawedAsked && (thawErr == nil || errors.Is(thawErr, ErrNotFrozen)) {
		_ = RemoveRecord(w.record)
		return
	}
	if how != thawedAsked {
		rec.Thawed = how
	}
	rec.ThawedAt = time.Now().UTC()
	if thawErr != nil {
		rec.ThawError = thawErr.Error()
	}
	_ = WriteRecord(w.record, rec)
}

func (w *watchdogProc) say(word string) {
	_, _ = w.ctl.Write([]byte(word + "\n"))
}

// lines delivers the lines read from f, closed when f ends.
func lines(f *os.File) <-chan string {
	ch := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			ch <- sc.Text()
		}
		close(ch)
	}()
	return ch
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }
