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
// on SIGTERM, SIGINT or SIGHUP, or at --limit plus --margin after it
// started freezing, whichever comes first. It runs in a session of its
// own (Setsid), so that a signal to its parent's process group, which is
// how a Salt watchdog or a shell kills a command, does not reach it.
func RunWatchdog(args []string) int {
	fl := flag.NewFlagSet(WatchdogCommand, flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	limit := fl.Duration("limit", 0, "the freeze limit")
	margin := fl.Duration("margin", 0, "slack past the limit before the watchdog thaws itself")
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
	w := &watchdogProc{ctl: os.NewFile(3, "control"), root: os.NewFile(4, *mountpoint),
		record: *record, mountpoint: *mountpoint, limit: *limit}
	return w.run(*limit + *margin)
}

func isType(fd int, mode uint32) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == mode
}

type watchdogProc struct {
	ctl, root          *os.File
	record, mountpoint string
	limit              time.Duration
}

func (w *watchdogProc) run(bound time.Duration) int {
	words := lines(w.ctl)
	// Installed before the freeze: a signal that comes while it is being
	// made finds the handler and thaws it at once.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	start := time.Now()
	rec, err := w.freeze(start)
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
	how := w.wait(words, sigs, time.Until(start.Add(bound)))
	if how == ThawedParentGone {
		failpoint.Hit("freeze-watchdog-parent-gone")
	}
	err = Thaw(w.root)
	w.settle(rec, how, err)
	switch {
	case err == nil:
		w.say(wordThawed + " " + how)
	case errors.Is(err, ErrNotFrozen):
		w.say(wordNotFrozen + " " + how)
	default:
		w.say(wordFailed + " " + how + " " + oneLine(err))
		return 1
	}
	return 0
}

// freeze makes the freeze and its record; a record that cannot be
// written undoes the freeze (a freeze no later run could find).
func (w *watchdogProc) freeze(start time.Time) (*Record, error) {
	id, err := Identify(w.root)
	if err != nil {
		return nil, err
	}
	if err := Freeze(w.root); err != nil {
		return nil, err
	}
	self := os.Getpid()
	rec := &Record{Version: 1, Mountpoint: w.mountpoint, Identity: id, WatchdogPID: self, WatchdogStart: processStart(self),
		BootID: BootID(), FrozenAt: start.UTC(), Limit: w.limit.String()}
	if err := WriteRecord(w.record, rec); err != nil {
		return nil, errors.Join(fmt.Errorf("recording the freeze of %s: %w", w.mountpoint, err), Thaw(w.root))
	}
	return rec, nil
}

// wait returns why the freeze ends: asked, the parent gone, a signal or
// the bound.
func (w *watchdogProc) wait(words <-chan string, sigs <-chan os.Signal, left time.Duration) string {
	bound := time.NewTimer(left)
	defer bound.Stop()
	for {
		select {
		case word, ok := <-words:
			if !ok {
				return ThawedParentGone
			}
			if word == wordThaw {
				return thawedAsked
			}
		case <-bound.C:
			return ThawedAtBound
		case <-sigs:
			return ThawedSignal
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
