package main

import (
	"context"
	"fmt"
	"time"
)

// resize asks a volume to grow (a sparse one to --size, a raw one to its
// device with --to-device), and with --wait follows it back to Available.
func (c *cli) resize(ctx context.Context, in []string) error {
	fs := c.flags("resize")
	size := fs.String("size", "", "a sparse volume: the size it grows to: 20Gi, 500M, bytes (larger than it is)")
	toDevice := fs.Bool("to-device", false, "a raw volume: grow it to what its device (or partition) has become")
	wait := fs.Bool("wait", false, "wait until the volume is Available again (or Failed)")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
	pos, cl, err := c.open(fs, in, 1, "give one volume NAME")
	if err != nil {
		return err
	}
	switch {
	case *size == "" && !*toDevice:
		return failf(exitUsage, "resize: --size: missing: the size a sparse volume grows to, e.g. --size 20Gi (or --to-device for a raw volume whose device grew)")
	case *size != "" && *toDevice:
		return failf(exitUsage, "resize: give --size (a sparse volume) or --to-device (a raw volume), not both")
	}
	if _, err := cl.Resize(ctx, pos[0], *size); err != nil {
		return err
	}
	if !*wait {
		what := *size
		if *toDevice {
			what = "its device's size"
		}
		fmt.Fprintf(c.out, "volume %s: growing to %s\n", pos[0], what)
		return nil
	}
	return c.waitFor(ctx, cl, pos[0], "Available", *timeout)
}
