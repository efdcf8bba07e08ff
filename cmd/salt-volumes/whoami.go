package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// whoamiCmd prints who the token (or session) is.
func (c *cli) whoamiCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "whoami",
		Short:   "Who the token or session is: user, role, kind",
		Long:    "Print who the server takes the token (or the session) for: the user (a Salt user, token:NAME, bootstrap, a Kubernetes identity), the role (viewer, operator, admin), the kind and the groups.",
		Example: `  salt-volumes whoami`,
		Args:    noArgs("takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			p, err := cl.WhoAmI(cmd.Context())
			if err != nil {
				return err
			}
			return c.emit(p, nil, func(bool) error {
				cells := []string{p.User, "role " + string(p.Role), "(" + p.Kind + ")"}
				if len(p.Groups) > 0 {
					cells = append(cells, "groups "+strings.Join(p.Groups, ","))
				}
				for i := range cells {
					cells[i] = cleanCell(cells[i])
				}
				_, err := fmt.Fprintln(c.out, strings.Join(cells, "\t"))
				return err
			})
		},
	}
	return objects(cmd, recordFormats...)
}
