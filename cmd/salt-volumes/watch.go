package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// watch prints every change of every volume (or one node's) until Ctrl-C.
func (c *cli) watch(ctx context.Context, in []string) error {
	fs := c.flags("watch")
	node := fs.String("node", "", "only this node's volumes")
	_, cl, err := c.open(fs, in, 0, "takes no arguments (filter with --node)")
	if err != nil {
		return err
	}
	enc := json.NewEncoder(c.out)
	err = cl.Watch(ctx, *node, "", func(ev saltvolumes.Event) bool {
		if ev.Type == client.Synced {
			return true
		}
		if c.output == "json" {
			_ = enc.Encode(ev)
			return true
		}
		v := ev.Volume
		fmt.Fprintf(c.out, "%s %-8s %-20s %-12s %-12s %s\n", time.Now().Format("15:04:05"), ev.Type, v.Spec.Name, v.Spec.Node,
			v.Status.Phase, detail(v))
		return true
	})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// nodes prints Salt's minions with their volumes by phase.
func (c *cli) nodes(ctx context.Context, in []string) error {
	fs := c.flags("nodes")
	_, cl, err := c.open(fs, in, 0, "takes no arguments")
	if err != nil {
		return err
	}
	items, warn, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	if warn != "" {
		fmt.Fprintln(c.errw, "warning:", warn)
	}
	if c.output == "json" {
		return c.json(map[string]any{"items": items})
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tUP\tBEACON\tCOMMITTED\tSIZE\tFREE\tSNAPSHOTS\tORPHANS\tVOLUMES\tPHASES")
	for _, n := range items {
		var ph []string
		for _, p := range []string{"Unknown", "Pending", "Available", "Failed", "Terminating"} {
			if n.Phases[p] > 0 {
				ph = append(ph, fmt.Sprintf("%s=%d", p, n.Phases[p]))
			}
		}
		committed, size, free, snaps := "-", "-", "-", "-"
		if c := n.Capacity; c != nil {
			committed = fmt.Sprintf("%s (%.0f%%)", spec.Approx(c.Committed), 100*float64(c.Committed)/float64(max(c.Size, 1)))
			size, free = spec.Approx(c.Size), spec.Approx(c.Free)
			snaps = fmt.Sprintf("%d (%s)", c.Snapshots, spec.Approx(c.SnapshotBytes))
		}
		beacon, orphans := "-", 0
		if h := n.Health; h != nil && !h.LastReport.IsZero() {
			beacon = "ok"
			switch {
			case h.Silent:
				beacon = "silent " + time.Since(h.LastReport).Truncate(time.Second).String()
			case h.Error != "":
				beacon = "error"
			}
			orphans = len(h.Orphans)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", n.Name, n.Up, beacon, committed, size, free, snaps, orphans, n.Volumes, strings.Join(ph, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// LVM snapshots about to overflow are lost when they do, thin pools
	// that fill stop every LV in them: said under the table, not folded
	// into a column.
	for _, n := range items {
		if n.Capacity != nil {
			for _, w := range n.Capacity.SnapshotWarnings {
				fmt.Fprintf(c.errw, "warning: %s: %s\n", n.Name, w)
			}
			// A thin pool fills for its volumes as for its snapshots.
			for _, p := range n.Capacity.ThinPools {
				if p.DataPercent >= 80 || p.MetadataPercent >= 80 {
					fmt.Fprintf(c.errw, "warning: %s: thin pool %s: data %.1f%%, metadata %.1f%%: when either is full, every thin LV in it stops taking writes\n", n.Name, p.Name, p.DataPercent, p.MetadataPercent)
				}
			}
		}
	}
	return nil
}
