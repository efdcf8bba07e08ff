package main

import (
	"context"
	"fmt"
)

// status prints whether the server serves and its role among replicas.
func (c *cli) status(ctx context.Context, in []string) error {
	fs := c.flags("status")
	_, cl, err := c.open(fs, in, 0, "takes no arguments")
	if err != nil {
		return err
	}
	role, err := cl.Status(ctx)
	if c.output == "json" && err == nil {
		return c.json(map[string]any{"url": cl.URL, "status": role})
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "%s\t%s\n", cl.URL, role)
	return nil
}
