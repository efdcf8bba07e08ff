package main

import (
	"bufio"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// nodesCmd prints Salt's minions with their volumes by phase.
func (c *cli) nodesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the nodes: up or not, beacon, capacity, volumes by phase",
		Long: `List Salt's minions (those up) and every node that reported, with whether
the beacon reports, the sparse volumes' capacity (committed, size, free),
snapshots, orphans and the volumes by phase. Warnings (LVM snapshots or thin
pools filling up) go to stderr. -o wide adds where the sparse files live,
the overcommit ratio and the last report's time.`,
		Example: `  salt-volumes nodes
  salt-volumes nodes -o json | jq '.items[] | select(.up | not) | .name'`,
		Args: noArgs("takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			items, warn, err := cl.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if warn != "" {
				line(c.errw, "warning: %s", warn)
			}
			names := make([]string, len(items))
			for i, n := range items {
				names[i] = n.Name
			}
			if err := c.emit(listOf(items), named("node", names...), func(wide bool) error { return c.nodeTable(items, wide) }); err != nil {
				return err
			}
			// LVM snapshots about to overflow are lost when they do, thin
			// pools that fill stop every LV in them: said under the
			// table, not folded into a column.
			for _, n := range items {
				if n.Capacity == nil {
					continue
				}
				for _, w := range n.Capacity.SnapshotWarnings {
					line(c.errw, "warning: %s: %s", n.Name, w)
				}
				// A thin pool fills for its volumes as for its snapshots.
				for _, p := range n.Capacity.ThinPools {
					if p.DataPercent >= 80 || p.MetadataPercent >= 80 {
						line(c.errw, "warning: %s: thin pool %s: data %.1f%%, metadata %.1f%%: when either is full, every thin LV in it stops taking writes", n.Name, p.Name, p.DataPercent, p.MetadataPercent)
					}
				}
			}
			return nil
		},
	}
	return objects(cmd, objectFormats...)
}

func (c *cli) nodeTable(items []saltvolumes.Node, wide bool) error {
	head := []string{"NODE", "UP", "BEACON", "COMMITTED", "SIZE", "FREE", "SNAPSHOTS", "ORPHANS", "VOLUMES", "PHASES"}
	if wide {
		head = append(head, "PATH", "OVERCOMMIT", "LAST-REPORT")
	}
	t := c.newTable(head...)
	for _, n := range items {
		var ph []string
		for _, p := range phases {
			if n.Phases[p] > 0 {
				ph = append(ph, fmt.Sprintf("%s=%d", p, n.Phases[p]))
			}
		}
		committed, size, free, snaps, path, ratio := "-", "-", "-", "-", "-", "-"
		if c := n.Capacity; c != nil {
			committed = fmt.Sprintf("%s (%.0f%%)", spec.Approx(c.Committed), 100*float64(c.Committed)/float64(max(c.Size, 1)))
			size, free = spec.Approx(c.Size), spec.Approx(c.Free)
			snaps = fmt.Sprintf("%d (%s)", c.Snapshots, spec.Approx(c.SnapshotBytes))
			path, ratio = or(c.Path, "-"), fmt.Sprintf("%g", c.OvercommitRatio)
		}
		beacon, orphans, last := "-", 0, "-"
		if h := n.Health; h != nil && !h.LastReport.IsZero() {
			beacon = "ok"
			switch {
			case h.Silent:
				beacon = "silent " + time.Since(h.LastReport).Truncate(time.Second).String()
			case h.Error != "":
				beacon = "error"
			}
			orphans = len(h.Orphans)
			last = ago(time.Since(h.LastReport), "") + " ago"
		}
		row := []string{n.Name, fmt.Sprint(n.Up), beacon, committed, size, free, snaps, fmt.Sprint(orphans), fmt.Sprint(n.Volumes), strings.Join(ph, " ")}
		if wide {
			row = append(row, path, ratio, last)
		}
		t.row(row...)
	}
	return t.flush()
}

// nodeCmd holds the commands about one node: today, forget.
func (c *cli) nodeCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:     "node",
		Short:   "Commands about one node: forget",
		Long:    "Commands about one node. forget drops a node gone for good from the control plane, with its volumes, touching no disk.",
		Example: `  salt-volumes node forget node-7`,
	}, c.nodeForgetCmd())
}

// nodeForgetCmd drains a node that is gone for good: it lists the node's
// volumes, asks, and forgets exactly those, touching no disk anywhere.
func (c *cli) nodeForgetCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "forget NODE",
		Short: "Forget a node gone for good, and its volumes (no disk touched)",
		Long: `Drain a node that is gone for good (decommissioned, reinstalled under
another id): list its volumes, ask you to type the node's name, then forget
exactly those volumes, whatever their phase, running nothing on any node.
In Kubernetes mode their PersistentVolumes are released. Whatever is on the
node's disks stays; if the node comes back, its next salt_volumes run
reports the volumes and they are adopted again. Not confirmed: exit 3,
nothing forgotten. Role admin.`,
		Example: `  salt-volumes node forget node-7
  salt-volumes node forget node-7 --yes`,
		Args:              exactArgs(1, "give one NODE (its Salt minion id)"),
		ValidArgsFunction: c.completeArgs(listNodes),
		RunE: func(cmd *cobra.Command, args []string) error {
			node, err := argName(cmd, args[0], "node")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			items, err := cl.List(ctx, node)
			if err != nil {
				return err
			}
			if len(items) == 0 {
				fmt.Fprintf(c.out, "node %s: no volumes; nothing to forget\n", node)
				return nil
			}
			fmt.Fprintf(c.out, "These volumes of node %s will be forgotten: dropped from salt-volumes (and their PersistentVolumes released)\n"+
				"without running anything on any node. Whatever is on the node's disks stays; if the node comes back,\n"+
				"its next salt_volumes run reports the volumes and they are adopted again.\n\n", node)
			if err := c.volumeTable(items, false); err != nil {
				return err
			}
			if !yes {
				fmt.Fprintf(c.out, "\nType the node's name (%s) to forget them: ", node)
				answer, _ := interruptible(ctx, func() (string, error) { return bufio.NewReader(c.in).ReadString('\n') })
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if strings.TrimSpace(answer) != node {
					return failf(exitRefused, "node forget: not confirmed; nothing was forgotten (--yes skips the question)")
				}
			}
			names := make([]string, 0, len(items))
			for _, v := range items {
				names = append(names, v.Spec.Name)
			}
			if _, err := cl.ForgetNode(ctx, node, names); err != nil {
				return err
			}
			fmt.Fprintf(c.out, "node %s: %d volume(s) forgotten\n", node, len(names))
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation (scripts)")
	return cmd
}
