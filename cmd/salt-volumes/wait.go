package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
)

// wait follows a volume until it is Available or Deleted.
func (c *cli) wait(ctx context.Context, in []string) error {
	fs := c.flags("wait")
	target := fs.String("for", "Available", "Available or Deleted")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait")
	pos, cl, err := c.open(fs, in, 1, "give one volume NAME")
	if err != nil {
		return err
	}
	if *target != "Available" && *target != "Deleted" {
		return failf(exitUsage, "wait: --for %s: use Available or Deleted", *target)
	}
	return c.waitFor(ctx, cl, pos[0], *target, *timeout)
}

// waitFor follows the watch stream (no polling) until the volume reaches
// target, fails, or the timeout passes.
func (c *cli) waitFor(ctx context.Context, cl *client.Client, name, target string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *saltvolumes.View
	var result error
	done, seen := false, false
	terminating := false // a Failed volume being deleted is not a failure until its deletion fails
	finish := func(err error) { result, done = err, true }
	err := cl.Watch(ctx, "", name, func(ev saltvolumes.Event) bool {
		if ev.Type == client.Synced {
			if !seen {
				if target == "Deleted" {
					finish(nil)
				} else {
					finish(failf(exitNotFound, "volume %q not found", name))
				}
				return false
			}
			return true
		}
		seen = true
		v := ev.Volume
		last = &v
		switch {
		case ev.Type == saltvolumes.Deleted && target == "Deleted":
			finish(nil)
		case ev.Type == saltvolumes.Deleted:
			finish(failf(exitFailed, "volume %s was deleted", name))
		case target == "Available" && v.Status.Phase == saltvolumes.Available:
			finish(c.show(v))
		case v.Status.Phase == saltvolumes.Terminating:
			terminating = true
		case v.Status.Phase == saltvolumes.Failed && (target == "Available" || terminating):
			_ = c.show(v)
			finish(failf(exitFailed, "volume %s failed: %s", name, v.Status.Message))
		}
		return !done
	})
	if done {
		if result == nil && target == "Deleted" {
			fmt.Fprintf(c.out, "volume %s deleted\n", name)
		}
		return result
	}
	if errors.Is(err, context.DeadlineExceeded) {
		state := "unknown"
		if last != nil {
			state = last.Status.Phase.String()
			if last.Status.Step != "" {
				state += " (step " + last.Status.Step + ")"
			}
		}
		return failf(exitTimeout, "volume %s: not %s after %s; last seen %s", name, target, timeout, state)
	}
	return err
}
