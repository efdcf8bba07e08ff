package main

import "context"

// list prints every volume, or one node's.
func (c *cli) list(ctx context.Context, in []string) error {
	fs := c.flags("ls")
	node := fs.String("node", "", "only this node's volumes")
	_, cl, err := c.open(fs, in, 0, "takes no arguments (filter with --node)")
	if err != nil {
		return err
	}
	items, err := cl.List(ctx, *node)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(map[string]any{"items": items})
	}
	c.table(items)
	return nil
}

// get prints one volume.
func (c *cli) get(ctx context.Context, in []string) error {
	fs := c.flags("get")
	pos, cl, err := c.open(fs, in, 1, "give one volume NAME")
	if err != nil {
		return err
	}
	v, err := cl.Get(ctx, pos[0])
	if err != nil {
		return err
	}
	return c.show(v)
}
