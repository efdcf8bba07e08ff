package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"
)

// node holds the commands about one node: today, forget.
func (c *cli) node(ctx context.Context, in []string) error {
	if len(in) == 0 || in[0] != "forget" {
		return failf(exitUsage, "node: give a subcommand: node forget NODE [--yes]")
	}
	return c.nodeForget(ctx, in[1:])
}

// nodeForget drains a node that is gone for good: it lists the node's
// volumes, asks, and forgets exactly those, touching no disk anywhere.
func (c *cli) nodeForget(ctx context.Context, in []string) error {
	fs := c.flags("node forget")
	yes := fs.Bool("yes", false, "do not ask for confirmation (scripts)")
	pos, cl, err := c.open(fs, in, 1, "give one NODE (its Salt minion id)")
	if err != nil {
		return err
	}
	node := pos[0]
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
	c.table(items)
	if !*yes {
		fmt.Fprintf(c.out, "\nType the node's name (%s) to forget them: ", node)
		answer, _ := bufio.NewReader(c.in).ReadString('\n')
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
}
