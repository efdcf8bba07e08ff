package main

import (
	"context"
	"fmt"
	"time"
)

// resize asks a sparse volume to grow, and with --wait follows it back to
// Available.
func (c *cli) resize(ctx context.Context, in []string) error {
	fs := c.flags("resize")
	size := fs.String("size", "", "the size the volume grows to: 20Gi, 500M, bytes (larger than it is)")
	wait := fs.Bool("wait", false, "wait until the volume is Available again (or Failed)")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
	pos, cl, err := c.open(fs, in, 1, "give one volume NAME")
	if err != nil {
		return err
	}
	if *size == "" {
		return failf(exitUsage, "resize: --size: missing: the size the volume grows to, e.g. --size 20Gi")
	}
	if _, err := cl.Resize(ctx, pos[0], *size); err != nil {
		return err
	}
	if !*wait {
		fmt.Fprintf(c.out, "volume %s: growing to %s\n", pos[0], *size)
		return nil
	}
	return c.waitFor(ctx, cl, pos[0], "Available", *timeout)
}
