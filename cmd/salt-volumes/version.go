package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// versionCmd prints the client's version; it asks no server.
func (c *cli) versionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of salt-volumes",
		Long:  "Print the version of this binary (a release tag, or the next release with -dev and the commit). The server's is in GET /api/v1/info.",
		Example: `  salt-volumes version
  salt-volumes version -o json`,
		Args: noArgs("takes no arguments"),
		RunE: func(*cobra.Command, []string) error {
			return c.emit(map[string]string{"version": version}, nil, func(bool) error {
				_, err := fmt.Fprintln(c.out, version)
				return err
			})
		},
	}
	return objects(cmd, recordFormats...)
}
