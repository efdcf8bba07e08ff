package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/salt-volumes/salt-volumes/internal/client"
)

// statusCmd prints whether the server serves and its role among replicas.
func (c *cli) statusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Whether serve is ready, and which replica leads",
		Long: `Ask serve's /readyz: whether it is ready (its event source connected), and
its role among replicas: leader, follower of another, or the only one. Not
ready is exit 7 (503: ask again), said as the server says it, or "not
ready (HTTP 503)".`,
		Example: `  salt-volumes status
  salt-volumes status -o json`,
		Args: noArgs("takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			role, err := cl.Status(cmd.Context())
			if err != nil {
				return err
			}
			u := client.Redact(cl.URL)
			return c.emit(map[string]any{"url": u, "status": role}, nil, func(bool) error {
				_, err := fmt.Fprintf(c.out, "%s\t%s\n", cleanCell(u), cleanCell(role))
				return err
			})
		},
	}
	return objects(cmd, recordFormats...)
}
