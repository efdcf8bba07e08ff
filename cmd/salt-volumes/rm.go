package main

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
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
3, with the reason) while the volume was last reported in use on its node,
or has snapshots. A volume being deleted already (Terminating) is exit 0:
what rm asks is under way, and --wait follows it. A request that gets no
answer is sent again (twice); a volume then not found was deleted by the
request whose answer was lost (exit 0); rm of a name there never was is
exit 4.

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
			v, state, err := c.deleteOnce(cmd.Context(), cl, name, wipe, forget)
			if err != nil {
				return err
			}
			switch state {
			case rmGone:
				// Deleted (or forgotten) by a request whose answer was
				// lost: nothing left to wait for.
				c.say("volume %s: gone already (a request whose answer was lost deleted it)\n", name)
				if !c.human() {
					return c.showDeleted(name, nil)
				}
				return nil
			case rmAlready:
				if wipe {
					c.say("volume %s: already being deleted (its --wipe as that deletion asked)\n", name)
				} else {
					c.say("volume %s: already being deleted\n", name)
				}
			}
			if !c.human() {
				if err := c.showVolume(v); err != nil {
					return err
				}
			}
			if ph := v.Status.Phase; !forget && (ph == saltvolumes.Pending || ph == saltvolumes.Unknown) {
				c.say("volume %s: deletion requested; it starts once the creation ends\n", name)
			} else if !wait && state == rmAsked {
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

// What deleteOnce found: the deletion asked now, one under way already,
// or the volume gone after a request whose answer was lost.
const (
	rmAsked = iota
	rmAlready
	rmGone
)

// deleteOnce asks for a deletion (or forget) however many requests it
// takes: one that gets no answer is sent again, and then a volume not
// found is one that request deleted (rmGone). A volume being deleted
// already (409, Terminating) is what rm asks for (rmAlready), whoever
// asked first.
func (c *cli) deleteOnce(ctx context.Context, cl *client.Client, name string, wipe, forget bool) (saltvolumes.View, int, error) {
	lost := false
	for try := 0; ; try++ {
		var v saltvolumes.View
		var err error
		if forget {
			v, err = cl.Forget(ctx, name)
		} else {
			v, err = cl.Delete(ctx, name, wipe)
		}
		if err == nil {
			return v, rmAsked, nil
		}
		var te *client.TransportError
		if errors.As(err, &te) {
			lost = true
			if te.Retryable() && try < len(resendAfter) && sleep(ctx, resendAfter[try]) {
				continue
			}
			if te.Retryable() {
				err = hint(err, "no answer: the deletion may have been recorded; salt-volumes get %s says, and salt-volumes rm %s again is safe", name, name)
			}
			return v, rmAsked, err
		}
		var ce *client.Error
		if !errors.As(err, &ce) {
			return v, rmAsked, err
		}
		switch {
		case ce.Status == http.StatusNotFound && lost:
			return v, rmGone, nil
		case ce.Status == http.StatusConflict && ce.Body.Code == saltvolumes.CodeDeleteForbidden && !forget:
			if got, gerr := cl.Get(ctx, name); gerr == nil && got.Status.Phase == saltvolumes.Terminating {
				return got, rmAlready, nil
			}
		}
		return v, rmAsked, err
	}
}
