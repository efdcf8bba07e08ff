package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// waitCmd follows a volume until it is Available or Deleted.
func (c *cli) waitCmd() *cobra.Command {
	var target string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait NAME",
		Short: "Wait until a volume is Available, or Deleted",
		Long: `Follow a volume on the server's watch stream (no polling) until it is
Available, or with --for Deleted until it is gone, printing each step it
goes through on stderr; then print it (on stdout, in the -o format).

A volume that ends Failed is exit 1. A Locked volume (an encrypted one
whose container is not open) is waited for: it becomes Available once its
node opens it. A timeout is exit 5: the work goes on,
and running wait again follows it further. A stream the server ended (a
restart, a failover) is exit 7, safe to run again. The default --timeout is
the server's jobTimeout (GET /api/v1/info) and a minute more, so that a job
the server gives up on is seen Failed rather than timed out here.`,
		Example: `  salt-volumes wait data-1
  salt-volumes wait data-1 --for Deleted --timeout 2m
  salt-volumes wait volume/data-1 -o json 2>/dev/null`,
		Args:              exactArgs(1, "give one volume NAME"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "volume")
			if err != nil {
				return err
			}
			if target != "Available" && target != "Deleted" {
				return usagef(cmd, "--for %s: use Available or Deleted", target)
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			d, err := c.waitTimeout(cmd, cl, timeout)
			if err != nil {
				return err
			}
			last, err := c.follow(cmd.Context(), cl, name, target, d)
			if err != nil || target == "Available" {
				return err
			}
			return c.showDeleted(name, last)
		},
	}
	cmd.Flags().StringVar(&target, "for", "Available", "what to wait for: Available or Deleted")
	timeoutFlag(cmd, &timeout, "how long to wait")
	_ = cmd.RegisterFlagCompletionFunc("for", fixed("Available", "Deleted"))
	return objects(cmd, objectFormats...)
}

// timeoutFlag is the --timeout of every command that waits.
func timeoutFlag(cmd *cobra.Command, d *time.Duration, what string) {
	cmd.Flags().DurationVar(d, "timeout", 0, what+" (default: the server's jobTimeout and a minute)")
}

// defaultJobTimeout is serve's jobTimeout when its config sets none;
// maxJobTimeoutSeconds the largest one a wait takes from a server (24 h).
const (
	defaultJobTimeout    = 10 * time.Minute
	maxJobTimeoutSeconds = 24 * 60 * 60
)

// waitTimeout is --timeout, or the server's jobTimeout and a minute: a
// job that takes all its time ends (Failed, JobTimeout) before the wait
// does, so the wait says what happened rather than that it stopped
// looking.
func (c *cli) waitTimeout(cmd *cobra.Command, cl *client.Client, given time.Duration) (time.Duration, error) {
	if cmd.Flags().Changed("timeout") {
		if given <= 0 {
			return 0, usagef(cmd, "--timeout %s: give a duration above 0, e.g. 5m", given)
		}
		return given, nil
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
	defer cancel()
	// Checked before it is multiplied: a number near int64's largest
	// would wrap into a negative duration.
	if info, err := cl.Info(ctx); err == nil && info.JobTimeoutSeconds >= 1 && info.JobTimeoutSeconds <= maxJobTimeoutSeconds {
		return time.Duration(info.JobTimeoutSeconds)*time.Second + time.Minute, nil
	}
	// A server without GET /api/v1/info (older), one a Kubernetes
	// identity may not ask (403 without list on volumes), or one whose
	// jobTimeoutSeconds is out of 1 s .. 24 h: serve's default.
	return defaultJobTimeout + time.Minute, nil
}

// step is a volume's progress in one line: its phase, its step, why it
// failed or is locked.
func step(v saltvolumes.View) string {
	s := v.Status.Phase.String()
	if v.Status.Step != "" {
		s += ", step " + v.Status.Step
		if p := v.Status.Progress; p != nil && p.Total > 0 {
			s += " " + progressText(*p)
		}
	}
	if v.Status.Reason != "" {
		s += ", " + v.Status.Reason
	}
	if v.Deleting && (v.Status.Phase == saltvolumes.Pending || v.Status.Phase == saltvolumes.Unknown) {
		s += ", deletion waiting for the creation"
	}
	if (v.Status.Phase == saltvolumes.Failed || v.Status.Phase == saltvolumes.Locked) && v.Status.Message != "" {
		s += ": " + v.Status.Message
	}
	return s
}

// progressText is a long step's advance for people: "1.5GiB of 4GiB (37 %)".
func progressText(p saltvolumes.Progress) string {
	return fmt.Sprintf("%s of %s (%d %%)", spec.Approx(p.Done), spec.Approx(p.Total), percent(p))
}

func percent(p saltvolumes.Progress) int64 {
	if p.Total <= 0 || p.Done <= 0 {
		return 0
	}
	// In floats: Done*100 overflows past 92 PiB, and the server's bound
	// is no reason to trust it here.
	return max(0, min(100, int64(float64(p.Done)/float64(p.Total)*100)))
}

// progressBar is the line a terminal shows for a long step, drawn again
// in place as the step goes: "volume data-1: copying [#####.....] 50 %  2GiB of 4GiB"
// (subject "volume data-1").
func progressBar(subject, stepName string, p saltvolumes.Progress) string {
	const width = 30
	filled := max(0, min(width, int(percent(p)*width/100)))
	return fmt.Sprintf("%s: %s [%s%s] %3d %%  %s of %s", subject, stepName,
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), percent(p), spec.Approx(p.Done), spec.Approx(p.Total))
}

// stepLines prints what --wait follows on stderr: a long step's bytes
// as one bar drawn again in place on a terminal, anything else (or
// anywhere else: a log, a pipe) as a line.
type stepLines struct {
	c     *cli
	drawn bool // a bar's line is open
}

// show prints subject's state: the bar of p (step stepName) when bar
// says one may be drawn, else the line text.
func (w *stepLines) show(subject, stepName, text string, p *saltvolumes.Progress, bar bool) {
	if bar && p != nil && p.Total > 0 && w.c.errTerminal() {
		fmt.Fprintf(w.c.errw, "\r\033[K%s", fitLine(cleanCell(progressBar(subject, stepName, *p)), w.c.errColumns()))
		w.drawn = true
		return
	}
	w.end()
	line(w.c.errw, "%s: %s", subject, text)
}

// end closes a bar's line, if one is open.
func (w *stepLines) end() {
	if w.drawn {
		fmt.Fprintln(w.c.errw)
		w.drawn = false
	}
}

// fitLine cuts s to a terminal line of cols columns: a line that wraps
// is not drawn again in place by a carriage return.
func fitLine(s string, cols int) string {
	if r := []rune(s); cols > 1 && len(r) >= cols {
		return string(r[:cols-1])
	}
	return s
}

// follow watches a volume on the watch stream (no polling) until it is
// target (Available or Deleted), ends Failed, or timeout passes; each
// step it takes goes to stderr, stdout keeps what the command prints. A
// volume reaching Available, or ending Failed, is printed here; for
// Deleted, follow returns the volume as last seen (nil: it was gone
// already).
func (c *cli) follow(ctx context.Context, cl *client.Client, name, target string, timeout time.Duration) (*saltvolumes.View, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *saltvolumes.View
	var result error
	done, lastStep := false, ""
	out := &stepLines{c: c}
	defer out.end()
	terminating := false // a Failed volume being deleted is not a failure until its deletion fails
	finish := func(err error) { result, done = err, true }
	err := cl.Watch(ctx, "", name, func(ev saltvolumes.Event) bool {
		if ev.Type == client.Synced {
			if last == nil {
				if target == "Deleted" {
					finish(nil)
				} else {
					finish(failf(exitNotFound, "volume %q not found", name))
				}
				return false
			}
			return true
		}
		v := ev.Volume
		last = &v
		if ev.Type == saltvolumes.Deleted {
			if target == "Deleted" {
				finish(nil)
			} else {
				finish(failf(exitFailed, "volume %s was deleted", name))
			}
			return false
		}
		if s := step(v); s != lastStep {
			// A long step on a terminal: one bar, drawn again in place;
			// elsewhere (a log, a pipe) a plain line per report.
			// A reason (a retry, a failure) is said in full, on a line.
			out.show("volume "+name, v.Status.Step, s, v.Status.Progress, v.Status.Reason == "")
			lastStep = s
		}
		switch {
		case target == "Available" && v.Status.Phase == saltvolumes.Available:
			finish(c.showVolume(v))
		case v.Status.Phase == saltvolumes.Terminating:
			terminating = true
		case v.Status.Phase == saltvolumes.Failed && (target == "Available" || terminating):
			_ = c.showVolume(v)
			finish(failf(exitFailed, "volume %s failed: %s", name, cleanCell(v.Status.Message)))
		}
		return !done
	})
	if done {
		return last, result
	}
	again := fmt.Sprintf("keep following with: salt-volumes wait %s --for %s", name, target)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		state := "nothing yet (the watch did not list it)"
		if last != nil {
			state = step(*last)
		}
		return last, failf(exitTimeout, "volume %s: not %s after %s; last seen %s; %s", name, target, timeout, cleanCell(state), again)
	case errors.Is(err, client.ErrStreamEnded):
		return last, failf(exitRetry, "volume %s: %v before it was %s; %s", name, err, target, again)
	}
	return last, err
}

// showDeleted prints a volume that is gone: a line for people, its name,
// or (JSON, YAML) the volume as last seen.
func (c *cli) showDeleted(name string, last *saltvolumes.View) error {
	switch c.format() {
	case fmtJSON, fmtYAML:
		if last == nil {
			fmt.Fprintf(c.errw, "volume %s: not found (deleted already)\n", name)
			return nil
		}
		return c.showVolume(*last)
	case fmtName:
		fmt.Fprintln(c.out, "volume/"+name)
		return nil
	}
	fmt.Fprintf(c.out, "volume %s deleted\n", name)
	return nil
}

// errColumns is stderr's width in columns (80 when it cannot tell).
func (c *cli) errColumns() int {
	if f, ok := c.errw.(*os.File); ok {
		if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 0 {
			return w
		}
	}
	return 80
}

// errTerminal says whether stderr is a terminal (a bar can be drawn in
// place there): an *os.File on one, or a writer that says it is one.
func (c *cli) errTerminal() bool {
	switch w := c.errw.(type) {
	case *os.File:
		return term.IsTerminal(int(w.Fd()))
	case interface{ IsTerminal() bool }:
		return w.IsTerminal()
	}
	return false
}
