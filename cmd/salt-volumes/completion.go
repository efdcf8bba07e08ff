package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/salt-volumes/salt-volumes/internal/client"
)

// completionCmd prints cobra's completion scripts; the packages install
// them (packaging/completion, kept up to date by a test).
func (c *cli) completionCmd() *cobra.Command {
	shell := func(name, long, example string, gen func(root *cobra.Command, cmd *cobra.Command) error) *cobra.Command {
		return &cobra.Command{
			Use:     name,
			Short:   "the completion script for " + name,
			Long:    long,
			Example: example,
			Args:    noArgs("takes no arguments"),
			RunE: func(cmd *cobra.Command, _ []string) error {
				return gen(cmd.Root(), cmd)
			},
		}
	}
	return group(&cobra.Command{
		Use:   "completion",
		Short: "Shell completion scripts: bash, zsh, fish",
		Long: `Print the completion script of a shell. The packages install them where
each shell finds them; from a build, load one as its example shows.

Completion knows the commands, their flags and the values of flags such as
-o, --phase, --mode and --fs, and asks the server (SALT_VOLUMES_URL and a
token, or the session of salt-volumes login) for the names of volumes,
snapshots and nodes, waiting 2 seconds at most.`,
		Example: `  source <(salt-volumes completion bash)
  salt-volumes completion zsh > "${fpath[1]}/_salt-volumes"
  salt-volumes completion fish > ~/.config/fish/completions/salt-volumes.fish`,
	},
		shell("bash", "The bash completion script (it needs the bash-completion package).", "  source <(salt-volumes completion bash)",
			func(root, cmd *cobra.Command) error { return root.GenBashCompletionV2(cmd.OutOrStdout(), true) }),
		shell("zsh", "The zsh completion script, for a directory of $fpath (compinit loads it).", `  salt-volumes completion zsh > "${fpath[1]}/_salt-volumes"`,
			func(root, cmd *cobra.Command) error { return root.GenZshCompletion(cmd.OutOrStdout()) }),
		shell("fish", "The fish completion script.", "  salt-volumes completion fish > ~/.config/fish/completions/salt-volumes.fish",
			func(root, cmd *cobra.Command) error { return root.GenFishCompletion(cmd.OutOrStdout(), true) }),
	)
}

// fixed completes a flag's value from a fixed list.
func fixed(values ...string) cobra.CompletionFunc {
	return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
}

// lister names the objects of one kind the server has.
type lister struct {
	kind string
	list func(ctx context.Context, cl *client.Client) ([]string, error)
}

var (
	listVolumes = &lister{"volume", func(ctx context.Context, cl *client.Client) ([]string, error) {
		items, err := cl.List(ctx, "")
		names := make([]string, len(items))
		for i, v := range items {
			names[i] = v.Spec.Name
		}
		return names, err
	}}
	listSnapshots = &lister{"snapshot", func(ctx context.Context, cl *client.Client) ([]string, error) {
		items, err := cl.Snapshots(ctx, "")
		names := make([]string, len(items))
		for i, s := range items {
			names[i] = s.Name
		}
		return names, err
	}}
	listNodes = &lister{"node", func(ctx context.Context, cl *client.Client) ([]string, error) {
		items, _, err := cl.Nodes(ctx)
		names := make([]string, len(items))
		for i, n := range items {
			names[i] = n.Name
		}
		return names, err
	}}
	listTokens = &lister{"token", func(ctx context.Context, cl *client.Client) ([]string, error) {
		items, err := cl.Tokens(ctx)
		names := make([]string, len(items))
		for i, t := range items {
			names[i] = t.Name
		}
		return names, err
	}}
)

// completeArgs completes positional arguments: at[i] names what the i-th
// is (nil: nothing to offer, a new name); past them, nothing.
func (c *cli) completeArgs(at ...*lister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) >= len(at) || at[len(args)] == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return c.ask(cmd, toComplete, at[len(args)]), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeFlag completes a flag's value with the names of these kinds;
// with several, as KIND/NAME (create --from).
func (c *cli) completeFlag(kinds ...*lister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return c.ask(cmd, toComplete, kinds...), cobra.ShellCompDirectiveNoFileComp
	}
}

// ask lists the names the server has of each kind that start with
// toComplete (as NAME, or KIND/NAME when it is written so or when there
// are several kinds), within 2 seconds: a slow server costs a Tab press
// no more than that, and a failure offers nothing.
func (c *cli) ask(cmd *cobra.Command, toComplete string, kinds ...*lister) []cobra.Completion {
	// cobra's __complete runs no PersistentPreRunE: the environment here.
	if c.applyEnv(cmd) != nil {
		return nil
	}
	cl, err := c.client()
	if err != nil {
		return nil
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var out []cobra.Completion
	for _, k := range kinds {
		names, err := k.list(ctx, cl)
		if err != nil {
			continue
		}
		prefixed := len(kinds) > 1 || strings.HasPrefix(toComplete, k.kind+"/")
		for _, n := range names {
			if !validName(k.kind, n) {
				// Not a name the API makes: a newline in it would offer
				// two, an escape sequence a terminal's command.
				continue
			}
			if prefixed {
				n = k.kind + "/" + n
			}
			if strings.HasPrefix(n, toComplete) {
				out = append(out, n)
			}
		}
	}
	return out
}
