package main

import (
	"context"
	"fmt"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// rm asks for a deletion (or, with --forget, drops a Failed volume).
func (c *cli) rm(ctx context.Context, in []string) error {
	fs := c.flags("rm")
	wipe := fs.Bool("wipe", false, "raw devices: also zero the whole device and read a sample back (WipeUnverified if it is not zero); LVM volumes: zero and remove the logical volume")
	forget := fs.Bool("forget", false, "a Failed volume whose node is gone: drop it without running anything on the node")
	wait := fs.Bool("wait", false, "wait until the volume is gone")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
	pos, cl, err := c.open(fs, in, 1, "give one volume NAME")
	if err != nil {
		return err
	}
	if *wipe && *forget {
		return failf(exitUsage, "rm: --forget leaves the node untouched, so it cannot --wipe: use one or the other")
	}
	var v saltvolumes.View
	if *forget {
		v, err = cl.Forget(ctx, pos[0])
	} else {
		v, err = cl.Delete(ctx, pos[0], *wipe)
	}
	if err != nil {
		return err
	}
	if ph := v.Status.Phase; !*forget && (ph == saltvolumes.Pending || ph == saltvolumes.Unknown) {
		fmt.Fprintf(c.out, "volume %s: deletion requested; it starts once the creation ends\n", pos[0])
	} else if !*wait {
		fmt.Fprintf(c.out, "volume %s: deletion requested\n", pos[0])
	}
	if *wait {
		return c.waitFor(ctx, cl, pos[0], "Deleted", *timeout)
	}
	return nil
}
