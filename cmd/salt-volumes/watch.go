package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
)

// watchCmd prints every change of every volume (or one node's) until
// Ctrl-C.
func (c *cli) watchCmd() *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Print every change of the volumes as it happens",
		Long: `Follow the server's watch stream: every volume as it is now (ADDED), then
each change as it happens (ADDED, MODIFIED, DELETED), one line each, until
Ctrl-C (exit 130) or the server ends the stream (exit 7: run it again).
-o json prints each event as one line of JSON ({"type", "volume"}), -o yaml
as one YAML document, -o name the volume's name.`,
		Example: `  salt-volumes watch
  salt-volumes watch --node node-1 -o json | jq -r 'select(.type == "MODIFIED") | .volume.status.phase'`,
		Args: noArgs("takes no arguments (filter with --node)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := argName(cmd, node, "node")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			return cl.Watch(cmd.Context(), n, "", func(ev saltvolumes.Event) bool {
				if ev.Type == client.Synced {
					return true
				}
				v := ev.Volume
				switch c.format() {
				case fmtJSON:
					if b, err := jsonBytes(ev, ""); err == nil {
						_, _ = c.out.Write(b)
					}
				case fmtYAML:
					if b, err := yamlBytes(ev); err == nil {
						fmt.Fprintf(c.out, "---\n%s", b)
					}
				case fmtName:
					if n := "volume/" + v.Spec.Name; validKindName(n) {
						fmt.Fprintln(c.out, n)
					} else {
						fmt.Fprintf(c.errw, "salt-volumes: watch: left out a volume name the server sent that is not a volume name: %s\n", strconv.QuoteToASCII(v.Spec.Name))
					}
				default:
					line(c.out, "%s %-8s %-20s %-12s %-12s %s", time.Now().Format("15:04:05"), ev.Type, v.Spec.Name, v.Spec.Node, v.Status.Phase, detail(v))
				}
				return true
			})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "only the volumes of `NODE` (a Salt minion id)")
	_ = cmd.RegisterFlagCompletionFunc("node", c.completeFlag(listNodes))
	return objects(cmd, objectFormats...)
}
