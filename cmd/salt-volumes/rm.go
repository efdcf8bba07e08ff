package main

import (
	"time"

	"github.com/spf13/cobra"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// rmCmd asks for a deletion (or, with --forget, drops a Failed volume).
func (c *cli) rmCmd() *cobra.Command {
	var wipe, forget, wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Delete a volume (or forget a Failed one)",
		Long: `Ask for a volume's deletion: its node removes what the volume's record says
was made for it, and nothing else. A volume still being created can be
deleted: the removal starts when the creation's run returns. Refused (exit
3, with the reason) while the volume is being deleted already, was last
reported in use on its node, or has snapshots.

--forget drops a Failed volume whose node is gone for good, running nothing
anywhere. -o json, yaml or name print the volume as the deletion was
recorded; with --wait the command then follows it until it is gone (its
steps on stderr).`,
		Example: `  salt-volumes rm data-1 --wait
  salt-volumes rm raw-1 --wipe --wait
  salt-volumes rm old-1 --forget
  salt-volumes ls --phase Failed -o name | xargs -n1 salt-volumes rm`,
		Args:              exactArgs(1, "give one volume NAME"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "volume")
			if err != nil {
				return err
			}
			if wipe && forget {
				return usagef(cmd, "--forget leaves the node untouched, so it cannot --wipe: use one or the other")
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			var v saltvolumes.View
			if forget {
				v, err = cl.Forget(cmd.Context(), name)
			} else {
				v, err = cl.Delete(cmd.Context(), name, wipe)
			}
			if err != nil {
				return err
			}
			if !c.human() {
				if err := c.showVolume(v); err != nil {
					return err
				}
			}
			if ph := v.Status.Phase; !forget && (ph == saltvolumes.Pending || ph == saltvolumes.Unknown) {
				c.say("volume %s: deletion requested; it starts once the creation ends\n", name)
			} else if !wait {
				c.say("volume %s: deletion requested\n", name)
			}
			if !wait {
				return nil
			}
			d, err := c.waitTimeout(cmd, cl, timeout)
			if err != nil {
				return err
			}
			if _, err := c.follow(cmd.Context(), cl, name, "Deleted", d); err != nil {
				return err
			}
			c.say("volume %s deleted\n", name)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&wipe, "wipe", false, "raw devices: also zero the whole device and read a sample back (WipeUnverified if it is not zero); LVM volumes: zero and remove the logical volume")
	f.BoolVar(&forget, "forget", false, "a Failed volume whose node is gone: drop it without running anything on the node")
	f.BoolVar(&wait, "wait", false, "wait until the volume is gone, printing its steps on stderr")
	timeoutFlag(cmd, &timeout, "with --wait: how long to wait")
	return objects(cmd, objectFormats...)
}
