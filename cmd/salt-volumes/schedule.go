package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// scheduleCmd: snapshot schedule VOLUME --every D --keep N [--max-age D],
// snapshot schedules [VOLUME] [--source api|salt], snapshot unschedule
// VOLUME. It answers handled=false for the other subcommands.
func (c *cli) scheduleCmd(ctx context.Context, sub string, in []string) (bool, error) {
	switch sub {
	case "schedule":
		fs := c.flags("snapshot schedule")
		every := fs.String("every", "", "how often a snapshot is taken: 15m, 1h, 1d (at least 1m)")
		keep := fs.Int("keep", 0, "how many of the schedule's own snapshots are kept, 1 to 1000")
		maxAge := fs.String("max-age", "", "also prune the schedule's snapshots older than this, e.g. 7d (optional)")
		pos, cl, err := c.open(fs, in, 1, "give one VOLUME (--every D --keep N [--max-age D])")
		if err != nil {
			return true, err
		}
		if *every == "" || *keep == 0 {
			return true, failf(exitUsage, "snapshot schedule: give --every (e.g. 1h) and --keep (1 to 1000)")
		}
		sc, err := cl.SetSnapshotSchedule(ctx, pos[0], *every, *keep, *maxAge)
		if err != nil {
			return true, err
		}
		return true, c.showSchedules([]saltvolumes.SnapshotSchedule{sc})
	case "schedules":
		fs := c.flags("snapshot schedules")
		source := fs.String("source", "", "api or salt: only the schedules made through the API, or only the nodes' Salt schedules")
		pos, cl, err := c.open(fs, in, -1, "give at most one VOLUME")
		if err != nil {
			return true, err
		}
		if len(pos) > 1 {
			return true, failf(exitUsage, "snapshot schedules: give at most one VOLUME")
		}
		vol := ""
		if len(pos) == 1 {
			vol = pos[0]
		}
		items, err := cl.SnapshotSchedules(ctx, vol, *source)
		if err != nil {
			return true, err
		}
		return true, c.showSchedules(items)
	case "unschedule":
		fs := c.flags("snapshot unschedule")
		pos, cl, err := c.open(fs, in, 1, "give one VOLUME: its schedule goes, its snapshots stay")
		if err != nil {
			return true, err
		}
		sc, err := cl.DeleteSnapshotSchedule(ctx, pos[0])
		if err != nil {
			return true, err
		}
		fmt.Fprintf(c.errw, "snapshot schedule of %s removed; its snapshots stay (salt-volumes snapshot ls %s)\n", sc.Volume, sc.Volume)
		return true, nil
	}
	return false, nil
}

func (c *cli) showSchedules(items []saltvolumes.SnapshotSchedule) error {
	if c.output == "json" {
		if len(items) == 1 {
			return c.json(items[0])
		}
		return c.json(items)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tSOURCE\tSCHEDULE\tNODE\tEVERY\tKEEP\tMAX-AGE\tLAST-SUCCESS\tLAST-SNAPSHOT\tSTATE\tMESSAGE")
	for _, s := range items {
		last := "-"
		if s.LastSuccess != nil {
			last = ago(time.Since(*s.LastSuccess), "") + " ago"
		}
		state := "ok"
		switch {
		case s.Overdue:
			state = "overdue"
		case s.Failing:
			state = "failing"
		case s.LastSuccess == nil:
			state = "waiting"
		}
		keep := "-"
		if s.Keep > 0 {
			keep = fmt.Sprint(s.Keep)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Volume, s.Source, s.Schedule, s.Node, or(s.Every, "-"), keep,
			or(s.MaxAge, "-"), last, or(s.LastSnapshot, "-"), state, s.LastError)
	}
	return tw.Flush()
}
