package main

import (
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

var phases = []string{"Unknown", "Pending", "Available", "Failed", "Terminating", "Locked"}

// lsCmd lists volumes: every one, or those of a node, a phase, a label
// selector.
func (c *cli) lsCmd() *cobra.Command {
	var node, selector string
	var inPhase []string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List volumes",
		Long: `List volumes with their node, kind, size, phase and device, and the one
thing worth reading about each in its phase (its step, its message, or its
/dev/disk path). --node asks the server for one node's; --phase and
--selector filter what it answers. -o wide adds the UUID, the reason, the
last Salt job and the labels.`,
		Example: `  salt-volumes ls
  salt-volumes ls --node node-1 -o json
  salt-volumes ls --phase Failed,Pending
  salt-volumes ls -l tier=db,env!=test -o name`,
		Args: noArgs("takes no arguments (filter with --node, --phase, --selector)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := argName(cmd, node, "node")
			if err != nil {
				return err
			}
			want, err := phaseSet(cmd, inPhase)
			if err != nil {
				return err
			}
			sel, err := labels.Parse(selector)
			if err != nil {
				return usagef(cmd, "--selector %q: %v", selector, err)
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			items, err := cl.List(cmd.Context(), n)
			if err != nil {
				return err
			}
			// Client-side: the API filters by node only.
			kept := items[:0]
			for _, v := range items {
				if (len(want) == 0 || want[v.Status.Phase.String()]) && sel.Matches(labels.Set(volumeLabels(v))) {
					kept = append(kept, v)
				}
			}
			return c.showVolumes(kept)
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "only the volumes of `NODE` (a Salt minion id)")
	f.StringSliceVar(&inPhase, "phase", nil, "only volumes in these `PHASES`: Unknown, Pending, Available, Failed, Terminating, Locked (comma-separated, or repeated)")
	f.StringVarP(&selector, "selector", "l", "", "only volumes whose labels (their PersistentVolume's: create --label) match `SELECTOR`, e.g. tier=db,env!=test")
	_ = cmd.RegisterFlagCompletionFunc("node", c.completeFlag(listNodes))
	_ = cmd.RegisterFlagCompletionFunc("phase", fixed(phases...))
	return objects(cmd, objectFormats...)
}

// phaseSet reads --phase, any case.
func phaseSet(cmd *cobra.Command, in []string) (map[string]bool, error) {
	want := map[string]bool{}
	for _, p := range in {
		ok := false
		for _, known := range phases {
			if strings.EqualFold(p, known) {
				want[known], ok = true, true
			}
		}
		if !ok {
			return nil, usagef(cmd, "--phase %s: use %s", p, strings.Join(phases, ", "))
		}
	}
	return want, nil
}

func volumeLabels(v saltvolumes.View) map[string]string {
	if v.Spec.Template == nil {
		return nil
	}
	return v.Spec.Template.Metadata.Labels
}

// getCmd prints one volume.
func (c *cli) getCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one volume",
		Long: `Show one volume: its row as ls prints it, and what its node last reported
of it (state, space allocated and used, where it is mounted). -o json or
yaml prints all of it: spec, status (phase, reason, message, jobId, step,
device, persistentPath), whether it may be deleted now and why not.`,
		Example: `  salt-volumes get data-1
  salt-volumes get volume/data-1 -o yaml`,
		Args:              exactArgs(1, "give one volume NAME"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := argName(cmd, args[0], "volume")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			v, err := cl.Get(cmd.Context(), n)
			if err != nil {
				return err
			}
			return c.showVolume(v)
		},
	}
	return objects(cmd, objectFormats...)
}
