package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// scheduleCmd: snapshot schedule VOLUME --every D --keep N [--max-age D].
func (c *cli) scheduleCmd() *cobra.Command {
	var every, maxAge string
	var keep int
	cmd := &cobra.Command{
		Use:   "schedule VOLUME",
		Short: "Set a volume's snapshot schedule: every, keep, max age",
		Long: `Set (or change) the snapshot schedule of a volume: the leading control
plane takes a snapshot every --every and prunes the schedule's own
snapshots beyond --keep (and older than --max-age), never others. Role
operator (admin for a raw device).`,
		Example: `  salt-volumes snapshot schedule data-1 --every 1h --keep 24
  salt-volumes snapshot schedule data-1 --every 1d --keep 7 --max-age 7d -o json`,
		Args:              exactArgs(1, "give one VOLUME (--every D --keep N [--max-age D])"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, err := argName(cmd, args[0], "volume", "schedule")
			if err != nil {
				return err
			}
			if every == "" || keep == 0 {
				return usagef(cmd, "give --every (e.g. 1h) and --keep (1 to 1000)")
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			sc, err := cl.SetSnapshotSchedule(cmd.Context(), vol, every, keep, maxAge)
			if err != nil {
				return err
			}
			return c.emit(sc, scheduleNames([]saltvolumes.SnapshotSchedule{sc}), func(wide bool) error {
				return c.scheduleTable([]saltvolumes.SnapshotSchedule{sc}, wide)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&every, "every", "", "how often a snapshot is taken: 15m, 1h, 1d (at least 1m)")
	f.IntVar(&keep, "keep", 0, "how many of the schedule's own snapshots are kept, 1 to 1000")
	f.StringVar(&maxAge, "max-age", "", "also prune the schedule's snapshots older than this, e.g. 7d (optional)")
	for _, free := range []string{"every", "keep", "max-age"} {
		_ = cmd.RegisterFlagCompletionFunc(free, cobra.NoFileCompletions)
	}
	return objects(cmd, objectFormats...)
}

// schedulesCmd: snapshot schedules [VOLUME] [--source api|salt].
func (c *cli) schedulesCmd() *cobra.Command {
	var source string
	cmd := &cobra.Command{
		Use:   "schedules [VOLUME]",
		Short: "List snapshot schedules: the API's and the nodes' Salt ones",
		Long: `List snapshot schedules, all or one volume's: those made through the API
(source api, run by the leading control plane) and those of the nodes'
Salt minion scheduler (source salt, pillar salt_volumes:snapshot_schedules),
with their last success and whether they are failing or overdue. -o wide
adds the next slot, the failures in a row and who made it; -o name names
the API's schedules alone, schedule/VOLUME, as unschedule takes them (a
Salt schedule is removed from its node's pillar).`,
		Example: `  salt-volumes snapshot schedules
  salt-volumes snapshot schedules data-1 --source api -o json`,
		Args:              rangeArgs(0, 1, "give at most one VOLUME"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			vols, err := argNames(cmd, args, "volume", "schedule")
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
			items, err := cl.SnapshotSchedules(cmd.Context(), vol, source)
			if err != nil {
				return err
			}
			return c.emit(listOf(items), scheduleNames(items), func(wide bool) error { return c.scheduleTable(items, wide) })
		},
	}
	cmd.Flags().StringVar(&source, "source", "", "api or salt: only the schedules made through the API, or only the nodes' Salt schedules")
	_ = cmd.RegisterFlagCompletionFunc("source", fixed("api", "salt"))
	return objects(cmd, objectFormats...)
}

// unscheduleCmd: snapshot unschedule VOLUME.
func (c *cli) unscheduleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "unschedule VOLUME",
		Short: "Remove a volume's snapshot schedule (its snapshots stay)",
		Long: `Remove the snapshot schedule of a volume made through the API; the
snapshots it took stay. -o json, yaml or name print the schedule removed.`,
		Example:           `  salt-volumes snapshot unschedule data-1`,
		Args:              exactArgs(1, "give one VOLUME: its schedule goes, its snapshots stay"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, err := argName(cmd, args[0], "volume", "schedule")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			sc, err := cl.DeleteSnapshotSchedule(cmd.Context(), vol)
			if err != nil {
				return err
			}
			line(c.errw, "snapshot schedule of %s removed; its snapshots stay (salt-volumes snapshot ls %s)", vol, vol)
			if c.human() {
				return nil
			}
			return c.emit(sc, scheduleNames([]saltvolumes.SnapshotSchedule{sc}), nil)
		},
	}
	return objects(cmd, objectFormats...)
}

// scheduleNames are the API schedules' names, schedule/VOLUME, which
// unschedule (and schedule) take back; a node's Salt schedule has none
// they take (its pillar names it, and unschedule removes API schedules
// only): -o name leaves it out.
func scheduleNames(items []saltvolumes.SnapshotSchedule) []string {
	var names []string
	for _, s := range items {
		if s.Source != "salt" {
			names = append(names, s.Volume)
		}
	}
	return named("schedule", names...)
}

func (c *cli) scheduleTable(items []saltvolumes.SnapshotSchedule, wide bool) error {
	head := []string{"VOLUME", "SOURCE", "SCHEDULE", "NODE", "EVERY", "KEEP", "MAX-AGE", "LAST-SUCCESS", "LAST-SNAPSHOT", "STATE", "MESSAGE"}
	if wide {
		head = append(head, "NEXT", "FAILURES", "CREATED-BY")
	}
	t := c.newTable(head...)
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
		row := []string{s.Volume, s.Source, s.Schedule, s.Node, or(s.Every, "-"), keep, or(s.MaxAge, "-"), last, or(s.LastSnapshot, "-"), state, s.LastError}
		if wide {
			next := "-"
			if s.NextAt != nil {
				next = ago(time.Until(*s.NextAt), "in ")
			}
			row[len(row)-1] = or(s.LastError, "-")
			row = append(row, next, fmt.Sprint(s.Failures), or(s.CreatedBy, "-"))
		}
		t.row(row...)
	}
	return t.flush()
}
