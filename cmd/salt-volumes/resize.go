package main

import (
	"time"

	"github.com/spf13/cobra"
)

// resizeCmd asks a volume to grow (a sparse or LVM one to --size, a raw
// one to its device with --to-device), and with --wait follows it back to
// Available.
func (c *cli) resizeCmd() *cobra.Command {
	var size string
	var toDevice, wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "resize NAME",
		Short: "Grow a volume (never shrinks)",
		Long: `Grow a sparse or LVM volume to --size, or a raw volume to what its device
(or partition) has become (--to-device); its filesystem grows with it. A
smaller size is refused (exit 2). The volume goes Pending (reason
Resizing) and back to Available once its node grew it; --wait follows it
there, its steps on stderr. -o json, yaml or name print the volume as the
server answered (with --wait, as it ended).`,
		Example: `  salt-volumes resize data-1 --size 20Gi --wait
  salt-volumes resize raw-1 --to-device`,
		Args:              exactArgs(1, "give one volume NAME"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "volume")
			if err != nil {
				return err
			}
			switch {
			case size == "" && !toDevice:
				return usagef(cmd, "--size: missing: the size a sparse volume grows to, e.g. --size 20Gi (or --to-device for a raw volume whose device grew)")
			case size != "" && toDevice:
				return usagef(cmd, "give --size (a sparse volume) or --to-device (a raw volume), not both")
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			v, err := cl.Resize(cmd.Context(), name, size)
			if err != nil {
				return err
			}
			if wait {
				d, err := c.waitTimeout(cmd, cl, timeout)
				if err != nil {
					return err
				}
				_, err = c.follow(cmd.Context(), cl, name, "Available", d)
				return err
			}
			if !c.human() {
				return c.showVolume(v)
			}
			what := size
			if toDevice {
				what = "its device's size"
			}
			c.say("volume %s: growing to %s\n", name, what)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&size, "size", "", "a sparse or LVM volume: the size it grows to: 20Gi, 500M, bytes (larger than it is)")
	f.BoolVar(&toDevice, "to-device", false, "a raw volume: grow it to what its device (or partition) has become")
	f.BoolVar(&wait, "wait", false, "wait until the volume is Available again (or Failed), printing its steps on stderr")
	timeoutFlag(cmd, &timeout, "with --wait: how long to wait")
	_ = cmd.RegisterFlagCompletionFunc("size", cobra.NoFileCompletions)
	return objects(cmd, objectFormats...)
}
