package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/salt-volumes/salt-volumes/internal/access"
)

// auditCmd prints the audit trail, oldest first.
func (c *cli) auditCmd() *cobra.Command {
	var user, vol, since string
	var limit int
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Who changed what, and what was refused (admin)",
		Long: `Print the audit trail, oldest first: every change asked of the API, who
asked (a Salt user, token:NAME, bootstrap, a Kubernetes identity), the
decision (allowed, refused, failed) and why, and the Salt job that carried
an allowed change out. Role admin. Entries have no names: -o name is
refused. -o wide adds groups, status, job and outcome.`,
		Example: `  salt-volumes audit --since 24h
  salt-volumes audit --user alice --volume data-1 -o json`,
		Args: noArgs("takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := argName(cmd, vol, "volume")
			if err != nil {
				return err
			}
			n := ""
			if cmd.Flags().Changed("limit") {
				n = fmt.Sprint(limit)
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			items, err := cl.Audit(cmd.Context(), user, v, since, n)
			if err != nil {
				return err
			}
			return c.emit(listOf(items), nil, func(wide bool) error { return c.auditTable(items, wide) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&user, "user", "", "only this user's entries (a Salt user, or token:NAME)")
	f.StringVar(&vol, "volume", "", "only this volume's entries")
	f.StringVar(&since, "since", "", "only entries this recent, e.g. 24h or 7d")
	f.IntVar(&limit, "limit", 0, "only the newest N entries")
	_ = cmd.RegisterFlagCompletionFunc("volume", c.completeFlag(listVolumes))
	for _, free := range []string{"user", "since", "limit"} {
		_ = cmd.RegisterFlagCompletionFunc(free, cobra.NoFileCompletions)
	}
	return objects(cmd, recordFormats...)
}

func (c *cli) auditTable(items []access.Entry, wide bool) error {
	head := []string{"TIME", "USER", "ROLE", "SOURCE", "REQUEST", "VOLUME", "NODE", "DECISION", "REASON"}
	if wide {
		head = append(head, "GROUPS", "STATUS", "JOB", "OUTCOME")
	}
	t := c.newTable(head...)
	for _, e := range items {
		row := []string{e.Time.Local().Format(time.DateTime), e.User, or(string(e.Role), "-"), e.Source,
			e.Method + " " + e.Route, or(e.Volume, "-"), or(e.Node, "-"), e.Decision, or(e.Reason, "-")}
		if wide {
			row = append(row, or(strings.Join(e.Groups, ","), "-"), fmt.Sprint(e.Status), or(e.JobID, "-"), or(e.Outcome, "-"))
		}
		t.row(row...)
	}
	return t.flush()
}
