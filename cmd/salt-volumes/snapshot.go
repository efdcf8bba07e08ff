package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"text/tabwriter"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// snapshotCmd: snapshot create VOLUME NAME, ls [VOLUME], get NAME, rm NAME,
// restore NAME; schedule, schedules and unschedule (schedule.go).
func (c *cli) snapshotCmd(ctx context.Context, in []string) error {
	if len(in) == 0 {
		return failf(exitUsage, "snapshot: give a subcommand: snapshot create VOLUME NAME [--wait], snapshot ls [VOLUME], snapshot get NAME, snapshot rm NAME [--wait], snapshot restore NAME [--wait], snapshot schedule VOLUME --every D --keep N, snapshot schedules [VOLUME], snapshot unschedule VOLUME")
	}
	sub := in[0]
	if handled, err := c.scheduleCmd(ctx, sub, in[1:]); handled {
		return err
	}
	switch sub {
	case "create", "take":
		fs := c.flags("snapshot create")
		wait := fs.Bool("wait", false, "wait until the snapshot is Ready (or Failed)")
		size := fs.String("size", "", "a thick LVM snapshot's copy-on-write space (default: a quarter of the LV); sparse and thin volumes take none")
		timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
		pos, cl, err := c.open(fs, in[1:], 2, "give the VOLUME and the snapshot's NAME")
		if err != nil {
			return err
		}
		s, err := cl.TakeSnapshot(ctx, pos[0], pos[1], *size)
		if err != nil {
			return err
		}
		if *wait {
			if s, err = c.waitSnapshot(ctx, cl, s.Name, false, *timeout); err != nil {
				return err
			}
		}
		return c.showSnapshots([]saltvolumes.Snapshot{s})
	case "ls", "list":
		fs := c.flags("snapshot ls")
		pos, cl, err := c.open(fs, in[1:], -1, "give at most one VOLUME")
		if err != nil {
			return err
		}
		if len(pos) > 1 {
			return failf(exitUsage, "snapshot ls: give at most one VOLUME")
		}
		vol := ""
		if len(pos) == 1 {
			vol = pos[0]
		}
		items, err := cl.Snapshots(ctx, vol)
		if err != nil {
			return err
		}
		return c.showSnapshots(items)
	case "get":
		fs := c.flags("snapshot get")
		pos, cl, err := c.open(fs, in[1:], 1, "give one snapshot NAME")
		if err != nil {
			return err
		}
		s, err := cl.Snapshot(ctx, pos[0])
		if err != nil {
			return err
		}
		return c.showSnapshots([]saltvolumes.Snapshot{s})
	case "rm", "delete":
		fs := c.flags("snapshot rm")
		wait := fs.Bool("wait", false, "wait until the snapshot is gone from its node")
		timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
		pos, cl, err := c.open(fs, in[1:], 1, "give one snapshot NAME")
		if err != nil {
			return err
		}
		s, err := cl.DeleteSnapshot(ctx, pos[0])
		if err != nil {
			return err
		}
		if *wait {
			if _, err = c.waitSnapshot(ctx, cl, s.Name, true, *timeout); err != nil {
				return err
			}
			fmt.Fprintf(c.errw, "snapshot %s deleted from %s\n", s.Name, s.Node)
			return nil
		}
		return c.showSnapshots([]saltvolumes.Snapshot{s})
	case "restore":
		fs := c.flags("snapshot restore")
		wait := fs.Bool("wait", false, "wait until the volume is restored (or the restore failed)")
		timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
		pos, cl, err := c.open(fs, in[1:], 1, "give one snapshot NAME: its volume is put back to it (unmounted, nothing using it)")
		if err != nil {
			return err
		}
		s, err := cl.RestoreSnapshot(ctx, pos[0])
		if err != nil {
			return err
		}
		if *wait {
			if s, err = c.waitRestore(ctx, cl, s.Name, *timeout); err != nil {
				return err
			}
			fmt.Fprintf(c.errw, "volume %s restored from snapshot %s on %s\n", s.Volume, s.Name, s.Node)
		}
		return c.showSnapshots([]saltvolumes.Snapshot{s})
	}
	return failf(exitUsage, "snapshot %s: not a subcommand: create, ls, get, rm, restore, schedule, schedules or unschedule", sub)
}

// waitSnapshot polls until the snapshot is Ready (or gone, for a
// deletion); Failed ends it with the node's message.
func (c *cli) waitSnapshot(ctx context.Context, cl *client.Client, name string, gone bool, timeout time.Duration) (saltvolumes.Snapshot, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := cl.Snapshot(ctx, name)
		var ce *client.Error
		switch {
		case gone && errors.As(err, &ce) && ce.Status == http.StatusNotFound:
			return s, nil
		case err != nil:
			return s, err
		case s.Phase == "Failed":
			return s, failf(exitFailed, "snapshot %s failed: %s", name, s.Message)
		case !gone && s.Phase == "Ready":
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, failf(exitTimeout, "snapshot %s: still %s after %s", name, s.Phase, timeout)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitRestore polls until the snapshot's restore is Restored; Failed ends
// it with the node's message (the volume was left as it was).
func (c *cli) waitRestore(ctx context.Context, cl *client.Client, name string, timeout time.Duration) (saltvolumes.Snapshot, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := cl.Snapshot(ctx, name)
		switch {
		case err != nil:
			return s, err
		case s.Restore == nil:
			return s, failf(exitFailed, "snapshot %s: its restore is not recorded (restarted or forgotten?)", name)
		case s.Restore.Phase == "Failed":
			return s, failf(exitFailed, "restoring volume %s from snapshot %s failed: %s", s.Volume, name, s.Restore.Message)
		case s.Restore.Phase == "Restored":
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, failf(exitTimeout, "snapshot %s: the restore of volume %s is still %s after %s", name, s.Volume, s.Restore.Phase, timeout)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (c *cli) showSnapshots(items []saltvolumes.Snapshot) error {
	if c.output == "json" {
		if len(items) == 1 {
			return c.json(items[0])
		}
		return c.json(items)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVOLUME\tNODE\tPHASE\tMETHOD\tSIZE\tUSED\tTAKEN\tSCHEDULE\tMESSAGE")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Volume, s.Node, s.Phase, method, size, used, taken, or(s.Schedule, "-"), or(s.Message, ""))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range items {
		if rs := s.Restore; rs != nil && len(items) == 1 {
			// One snapshot's last restore, under its row: too long for a
			// column of the list.
			line := fmt.Sprintf("last restore of %s: %s, asked by %s %s ago", s.Volume, rs.Phase, or(rs.RequestedBy, "-"), ago(time.Since(rs.RequestedAt), ""))
			if rs.Phase == "Restored" {
				line += fmt.Sprintf(" (%s in %s, same loop device: %t)", or(rs.Method, "-"), or(rs.Took, "-"), rs.SameDevice)
			}
			if rs.Message != "" {
				line += ": " + rs.Message
			}
			fmt.Fprintln(c.out, line)
			for _, w := range rs.Warnings {
				fmt.Fprintln(c.out, "  warning: "+w)
			}
		}
	}
	return nil
}
