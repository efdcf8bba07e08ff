package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// snapshotCmd: snapshot create, ls, get, rm, restore; schedule,
// schedules and unschedule (schedule.go).
func (c *cli) snapshotCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:   "snapshot",
		Short: "Snapshots of volumes, restores and schedules",
		Long: `Snapshots of sparse and LVM volumes, kept on their nodes: take, list,
show, delete, restore a volume in place, and the control plane's
schedules that take and prune them. A snapshot's clone is a new volume:
salt-volumes create NAME --from snapshot/SNAP.`,
		Example: `  salt-volumes snapshot create data-1 before-upgrade --wait
  salt-volumes snapshot ls data-1
  salt-volumes snapshot schedule data-1 --every 1h --keep 24`,
	}, c.snapshotCreateCmd(), c.snapshotLsCmd(), c.snapshotGetCmd(), c.snapshotRmCmd(), c.snapshotRestoreCmd(),
		c.scheduleCmd(), c.schedulesCmd(), c.unscheduleCmd())
}

func (c *cli) snapshotCreateCmd() *cobra.Command {
	var wait bool
	var size string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:     "create VOLUME NAME",
		Aliases: []string{"take"},
		Short:   "Take a snapshot of a volume",
		Long: `Take a snapshot named NAME of VOLUME on its node: a sparse volume's is a
reflink or sparse copy (its filesystem frozen for a bounded time while
mounted), an LVM volume's an LVM snapshot (thick: --size set aside for
copy-on-write; thin: none). Taking one that exists answers it. --wait
waits until it is Ready, printing its phase on stderr. Role operator.`,
		Example: `  salt-volumes snapshot create data-1 before-upgrade --wait
  salt-volumes snapshot create db-lv nightly --size 2Gi`,
		Args:              exactArgs(2, "give the VOLUME and the snapshot's NAME"),
		ValidArgsFunction: c.completeArgs(listVolumes, nil),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, err := argName(cmd, args[0], "volume")
			if err != nil {
				return err
			}
			name, err := argName(cmd, args[1], "snapshot")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			s, err := cl.TakeSnapshot(cmd.Context(), vol, name, size)
			if err != nil {
				return err
			}
			if wait {
				d, err := c.waitTimeout(cmd, cl, timeout)
				if err != nil {
					return err
				}
				if s, err = c.waitSnapshot(cmd.Context(), cl, s.Name, false, d); err != nil {
					return err
				}
			}
			return c.showSnapshot(s)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&wait, "wait", false, "wait until the snapshot is Ready (or Failed), printing its phase on stderr")
	f.StringVar(&size, "size", "", "a thick LVM snapshot's copy-on-write space (default: a quarter of the LV); sparse and thin volumes take none")
	timeoutFlag(cmd, &timeout, "with --wait: how long to wait")
	_ = cmd.RegisterFlagCompletionFunc("size", cobra.NoFileCompletions)
	return objects(cmd, objectFormats...)
}

func (c *cli) snapshotLsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [VOLUME]",
		Aliases: []string{"list"},
		Short:   "List snapshots: all, or one volume's",
		Long: `List snapshots, all or one volume's, with their phase (Pending, Ready,
Failed, Deleting), method, size and space used, age and the schedule that
took them. -o wide adds the volume's UUID, the last job and who asked.`,
		Example: `  salt-volumes snapshot ls
  salt-volumes snapshot ls data-1 -o name`,
		Args:              rangeArgs(0, 1, "give at most one VOLUME"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			vols, err := argNames(cmd, args, "volume")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			vol := ""
			if len(vols) == 1 {
				vol = vols[0]
			}
			items, err := cl.Snapshots(cmd.Context(), vol)
			if err != nil {
				return err
			}
			return c.emit(listOf(items), snapshotNames(items), func(wide bool) error { return c.snapshotTable(items, wide) })
		},
	}
	return objects(cmd, objectFormats...)
}

func (c *cli) snapshotGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one snapshot, and its last restore",
		Long:  "Show one snapshot: its row as snapshot ls prints it, and under it the last restore of its volume from it.",
		Example: `  salt-volumes snapshot get before-upgrade
  salt-volumes snapshot get snapshot/before-upgrade -o json`,
		Args:              exactArgs(1, "give one snapshot NAME"),
		ValidArgsFunction: c.completeArgs(listSnapshots),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "snapshot")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			s, err := cl.Snapshot(cmd.Context(), name)
			if err != nil {
				return err
			}
			return c.showSnapshot(s)
		},
	}
	return objects(cmd, objectFormats...)
}

func (c *cli) snapshotRmCmd() *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Delete a snapshot from its node",
		Long: `Ask for a snapshot's deletion on its node (phase Deleting); the record goes
once the node has deleted it. --wait waits for that. Role operator.`,
		Example:           `  salt-volumes snapshot rm before-upgrade --wait`,
		Args:              exactArgs(1, "give one snapshot NAME"),
		ValidArgsFunction: c.completeArgs(listSnapshots),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "snapshot")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			s, err := cl.DeleteSnapshot(cmd.Context(), name)
			if err != nil {
				return err
			}
			if !wait {
				return c.showSnapshot(s)
			}
			if !c.human() {
				// The object as the deletion was recorded; then the wait.
				if err := c.showSnapshot(s); err != nil {
					return err
				}
			}
			d, err := c.waitTimeout(cmd, cl, timeout)
			if err != nil {
				return err
			}
			if _, err = c.waitSnapshot(cmd.Context(), cl, s.Name, true, d); err != nil {
				return err
			}
			line(c.errw, "snapshot %s deleted from %s", name, s.Node)
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the snapshot is gone from its node")
	timeoutFlag(cmd, &timeout, "with --wait: how long to wait")
	return objects(cmd, objectFormats...)
}

func (c *cli) snapshotRestoreCmd() *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "restore NAME",
		Short: "Put a sparse or LVM volume back to a snapshot, in place",
		Long: `Put the snapshot's volume back to it in place: what was written since is
lost, as a deletion loses it. The volume must be Available, unmounted and
unused; role operator (admin while a claim holds its PersistentVolume).
A thick LVM snapshot is used up by the restore (LVM merges it into the
volume): take a clone first (create --from snapshot/NAME) to keep a copy;
a thin one is kept.
--wait waits until it is Restored (or Failed: the volume was left as it
was, unless the message says the restore did not finish: an LVM restore
that failed after its merge, whose volume already holds the snapshot's
data; ask the restore again to finish it), printing its phase on stderr.`,
		Example:           `  salt-volumes snapshot restore before-upgrade --wait`,
		Args:              exactArgs(1, "give one snapshot NAME: its volume is put back to it (unmounted, nothing using it)"),
		ValidArgsFunction: c.completeArgs(listSnapshots),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "snapshot")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			s, err := cl.RestoreSnapshot(cmd.Context(), name)
			if err != nil {
				return err
			}
			if wait {
				d, err := c.waitTimeout(cmd, cl, timeout)
				if err != nil {
					return err
				}
				if s, err = c.waitRestore(cmd.Context(), cl, s.Name, d); err != nil {
					return err
				}
				line(c.errw, "volume %s restored from snapshot %s on %s", s.Volume, name, s.Node)
			}
			return c.showSnapshot(s)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the volume is restored (or the restore failed)")
	timeoutFlag(cmd, &timeout, "with --wait: how long to wait")
	return objects(cmd, objectFormats...)
}

// poll asks for a snapshot every half second until done says it is
// there, printing each phase it takes on stderr, and the bytes of its
// job's copy (progress: the snapshot's or its restore's) as --wait shows
// a volume's: a bar on a terminal, a line per report elsewhere. The
// timeout bounds every request too: a server that stops answering
// mid-poll ends it then, as a timeout.
func (c *cli) poll(parent context.Context, cl *client.Client, name string, timeout time.Duration, done func(saltvolumes.Snapshot, error) (string, bool, error), progress func(saltvolumes.Snapshot) *saltvolumes.Progress) (saltvolumes.Snapshot, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	last := ""
	out := &stepLines{c: c}
	defer out.end()
	timedOut := func(s saltvolumes.Snapshot) (saltvolumes.Snapshot, error) {
		return s, failf(exitTimeout, "snapshot %s: still %s after %s; salt-volumes snapshot get %s shows how it goes on", name, or(last, "not seen"), timeout, name)
	}
	for {
		s, err := cl.Snapshot(ctx, name)
		if err != nil && ctx.Err() != nil && parent.Err() == nil {
			return timedOut(s)
		}
		phase, ok, err := done(s, err)
		var p *saltvolumes.Progress
		if phase != "" && err == nil && !ok {
			p = progress(s)
		}
		shown := phase
		if p != nil && p.Total > 0 {
			shown += ", " + p.Step + " " + progressText(*p)
		}
		if shown != "" && shown != last {
			stepName := ""
			if p != nil {
				stepName = p.Step
			}
			out.show("snapshot "+name, stepName, shown, p, true)
			last = shown
		}
		if ok || err != nil {
			return s, err
		}
		select {
		case <-ctx.Done():
			if parent.Err() == nil {
				return timedOut(s)
			}
			return s, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitSnapshot polls until the snapshot is Ready (or gone, for a
// deletion); Failed ends it with the node's message.
func (c *cli) waitSnapshot(ctx context.Context, cl *client.Client, name string, gone bool, timeout time.Duration) (saltvolumes.Snapshot, error) {
	return c.poll(ctx, cl, name, timeout, func(s saltvolumes.Snapshot, err error) (string, bool, error) {
		var ce *client.Error
		switch {
		case gone && errors.As(err, &ce) && ce.Status == http.StatusNotFound:
			return "gone", true, nil
		case err != nil:
			return "", false, err
		case s.Phase == "Failed":
			return s.Phase, false, failf(exitFailed, "snapshot %s failed: %s", name, cleanCell(s.Message))
		}
		return s.Phase, !gone && s.Phase == "Ready", nil
	}, func(s saltvolumes.Snapshot) *saltvolumes.Progress { return s.Progress })
}

// waitRestore polls until the snapshot's restore is Restored; Failed ends
// it with the node's message (the volume was left as it was).
func (c *cli) waitRestore(ctx context.Context, cl *client.Client, name string, timeout time.Duration) (saltvolumes.Snapshot, error) {
	return c.poll(ctx, cl, name, timeout, func(s saltvolumes.Snapshot, err error) (string, bool, error) {
		switch {
		case err != nil:
			return "", false, err
		case s.Restore == nil:
			return "", false, failf(exitFailed, "snapshot %s: its restore is not recorded (restarted or forgotten?)", name)
		case s.Restore.Phase == "Failed":
			return "restore Failed", false, failf(exitFailed, "restoring volume %s from snapshot %s failed: %s", cleanCell(s.Volume), name, cleanCell(s.Restore.Message))
		}
		return "restore " + s.Restore.Phase, s.Restore.Phase == "Restored", nil
	}, func(s saltvolumes.Snapshot) *saltvolumes.Progress {
		if s.Restore == nil {
			return nil
		}
		return s.Restore.Progress
	})
}

func snapshotNames(items []saltvolumes.Snapshot) []string {
	names := make([]string, len(items))
	for i, s := range items {
		names[i] = s.Name
	}
	return named("snapshot", names...)
}

// showSnapshot prints one snapshot; in a table with its last restore
// under its row (too long for a column).
func (c *cli) showSnapshot(s saltvolumes.Snapshot) error {
	return c.emit(s, snapshotNames([]saltvolumes.Snapshot{s}), func(wide bool) error {
		if err := c.snapshotTable([]saltvolumes.Snapshot{s}, wide); err != nil {
			return err
		}
		if rs := s.Restore; rs != nil {
			text := fmt.Sprintf("last restore of %s: %s, asked by %s %s ago", s.Volume, rs.Phase, or(rs.RequestedBy, "-"), ago(time.Since(rs.RequestedAt), ""))
			if rs.Phase == "Restored" {
				text += fmt.Sprintf(" (%s in %s, same loop device: %t)", or(rs.Method, "-"), or(rs.Took, "-"), rs.SameDevice)
			}
			if rs.Message != "" {
				text += ": " + rs.Message
			}
			line(c.out, "%s", text)
			for _, w := range rs.Warnings {
				line(c.out, "  warning: %s", w)
			}
		}
		return nil
	})
}

func (c *cli) snapshotTable(items []saltvolumes.Snapshot, wide bool) error {
	head := []string{"NAME", "VOLUME", "NODE", "PHASE", "METHOD", "SIZE", "USED", "TAKEN", "SCHEDULE", "MESSAGE"}
	if wide {
		head = append(head, "VOLUME-UUID", "JOB", "REQUESTED-BY")
	}
	t := c.newTable(head...)
	for _, s := range items {
		size, used, taken := "-", "-", "-"
		if s.Size > 0 {
			size, used = spec.FormatSize(s.Size), spec.FormatSize(s.Allocated)
		}
		if s.TakenAt != nil {
			taken = ago(time.Since(*s.TakenAt), "") + " ago"
		}
		method := or(s.Method, "-")
		if s.Frozen {
			method += " (frozen)"
		}
		phase := s.Phase
		if p := s.Progress; p != nil && p.Total > 0 {
			phase += fmt.Sprintf(" (%s %d %%)", p.Step, percent(*p))
		}
		if rs := s.Restore; rs != nil && rs.Progress != nil && rs.Progress.Total > 0 {
			phase += fmt.Sprintf(" (restoring, %s %d %%)", rs.Progress.Step, percent(*rs.Progress))
		}
		row := []string{s.Name, s.Volume, s.Node, phase, method, size, used, taken, or(s.Schedule, "-"), s.Message}
		if wide {
			row[len(row)-1] = or(s.Message, "-")
			row = append(row, s.VolumeUUID, or(s.JobID, "-"), or(s.RequestedBy, "-"))
		}
		t.row(row...)
	}
	return t.flush()
}
