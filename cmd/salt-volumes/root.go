package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The root's groups of commands, in the order --help shows them.
var groups = []*cobra.Group{
	{ID: "volumes", Title: "Volumes:"},
	{ID: "snapshots", Title: "Snapshots:"},
	{ID: "nodes", Title: "Nodes and the control plane:"},
	{ID: "people", Title: "People and tokens:"},
	{ID: "kubernetes", Title: "Kubernetes:"},
}

// Annotations: annOutputs on a command lists the -o formats it prints
// (none: it prints no objects, and refuses -o); annEnv on a flag names
// the environment variable read when the flag is not given.
const (
	annOutputs = "salt-volumes.io/outputs"
	annEnv     = "salt-volumes.io/env"
)

// Output formats: every command that prints objects takes them all
// (objectFormats), those that print no list of named objects fewer.
const (
	fmtTable = "table"
	fmtWide  = "wide"
	fmtJSON  = "json"
	fmtYAML  = "yaml"
	fmtName  = "name"
)

var (
	objectFormats = []string{fmtTable, fmtWide, fmtJSON, fmtYAML, fmtName}
	recordFormats = []string{fmtTable, fmtWide, fmtJSON, fmtYAML} // no names: audit entries, whoami, status, version
	allFormats    = objectFormats
)

func (c *cli) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "salt-volumes",
		Short: "local persistent volumes on Salt-managed nodes",
		Long: `salt-volumes serve is the control plane: it runs beside the salt-master,
starts the salt_volumes states on minions, learns their outcome from the
master's event bus and job cache, and serves a REST API, a web UI and
metrics. Every other command is a client of that API.

The client finds the server through --url and its token through --token
or --token-file, or the environment (SALT_VOLUMES_URL, SALT_VOLUMES_TOKEN,
SALT_VOLUMES_TOKEN_FILE); without a token, through the session
salt-volumes login keeps. An https server with a private CA needs --ca-file
(SALT_VOLUMES_CA), one that asks for client certificates --cert-file and
--key-file (SALT_VOLUMES_CERT, SALT_VOLUMES_KEY).

Commands that print objects take -o table (the default), wide, json, yaml
or name: lists print as {"items": [...]} in JSON and YAML, one object as
itself; names (volume/NAME, snapshot/NAME) are taken back as arguments.`,
		Example: `  export SALT_VOLUMES_URL=http://127.0.0.1:8080 SALT_VOLUMES_TOKEN_FILE=/etc/salt-volumes/token
  salt-volumes nodes
  salt-volumes create data-1 --node node-1 --size 10Gi --wait
  salt-volumes snapshot create data-1 before-upgrade
  salt-volumes ls -o name | xargs -n1 salt-volumes get`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				msg := fmt.Sprintf("unknown command %q", args[0])
				if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
					msg += ": did you mean " + strings.Join(s, " or ") + "?"
				}
				return usagef(cmd, "%s", msg)
			}
			return nil
		},
		// Bare: what there is to do, and the usage error it is.
		RunE: func(cmd *cobra.Command, _ []string) error {
			_ = cmd.Help()
			return errUsage
		},
		PersistentPreRunE: c.prepare,
		SilenceErrors:     true,
		SilenceUsage:      true,
		// What SuggestionsFor finds for a typo (cobra sets it only on
		// its own path, which our Args replaces).
		SuggestionsMinimumDistance: 2,
		DisableAutoGenTag:          true,
		// Ours (completion.go): with examples, without powershell.
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usagef(cmd, "%v", err) })
	pf := root.PersistentFlags()
	pf.StringVar(&c.conn.url, "url", "", "the API's address, e.g. http://127.0.0.1:8080 (env SALT_VOLUMES_URL)")
	pf.StringVar(&c.conn.token, "token", "", "API token (env SALT_VOLUMES_TOKEN; prefer it or --token-file: a flag shows in ps)")
	pf.StringVar(&c.conn.tokenFile, "token-file", "", "file holding the API token (env SALT_VOLUMES_TOKEN_FILE)")
	pf.StringVar(&c.conn.caFile, "ca-file", "", "CA certificates to trust for an https URL, besides the system's (env SALT_VOLUMES_CA)")
	pf.StringVar(&c.conn.certFile, "cert-file", "", "client certificate, for a server that asks for one (env SALT_VOLUMES_CERT)")
	pf.StringVar(&c.conn.keyFile, "key-file", "", "the client certificate's key (env SALT_VOLUMES_KEY)")
	pf.StringVarP(&c.output, "output", "o", "", "output format: table (the default), wide, json, yaml or name")
	pf.BoolVar(&c.noHeaders, "no-headers", false, "print tables without their heading line")
	for _, e := range rootEnv {
		_ = pf.SetAnnotation(e.flag, annEnv, []string{e.env})
	}
	_ = root.RegisterFlagCompletionFunc("output", fixed(allFormats...))
	for _, f := range []string{"token-file", "ca-file", "cert-file", "key-file"} {
		_ = root.MarkPersistentFlagFilename(f)
	}

	root.AddGroup(groups...)
	for i, cmds := range [][]*cobra.Command{
		{c.createCmd(), c.lsCmd(), c.getCmd(), c.rmCmd(), c.resizeCmd(), c.waitCmd(), c.watchCmd()},
		{c.snapshotCmd()},
		{c.nodesCmd(), c.nodeCmd(), c.statusCmd(), c.serveCmd(), c.storeCmd()},
		{c.loginCmd(), c.logoutCmd(), c.whoamiCmd(), c.tokenCmd(), c.auditCmd()},
		{c.pvCmd(), c.storageClassCmd()},
	} {
		for _, cmd := range cmds {
			cmd.GroupID = groups[i].ID
			root.AddCommand(cmd)
		}
	}
	root.AddCommand(c.versionCmd(), c.completionCmd())
	root.SetHelpCommand(c.helpCmd())

	// The root's help ends with what a script needs: the environment it
	// reads and the exit codes.
	usage := root.UsageFunc()
	root.SetUsageFunc(func(cmd *cobra.Command) error {
		if err := usage(cmd); err != nil || cmd.HasParent() {
			return err
		}
		w := cmd.OutOrStderr()
		fmt.Fprint(w, "\nEnvironment:\n")
		for _, e := range environment(cmd) {
			fmt.Fprintf(w, "  %-24s %s\n", e.name, e.what)
		}
		fmt.Fprint(w, "\nExit codes:\n")
		for _, e := range exitCodes {
			fmt.Fprintf(w, "  %-4d %s\n", e.code, e.what)
		}
		return nil
	})
	return root
}

// rootEnv are the connection flags' environment variables, in the order
// the help lists them.
var rootEnv = []struct{ env, flag string }{
	{"SALT_VOLUMES_URL", "url"}, {"SALT_VOLUMES_TOKEN", "token"}, {"SALT_VOLUMES_TOKEN_FILE", "token-file"},
	{"SALT_VOLUMES_CA", "ca-file"}, {"SALT_VOLUMES_CERT", "cert-file"}, {"SALT_VOLUMES_KEY", "key-file"},
}

// envVar is an environment variable the CLI reads, and what for.
type envVar struct{ name, what string }

// environment lists the variables the tree's flags read when they are
// not given (the root's first), and those the session's file is found by.
func environment(root *cobra.Command) []envVar {
	var out []envVar
	seen := map[string]bool{}
	for _, e := range rootEnv {
		seen[e.env] = true
		out = append(out, envVar{e.env, "--" + e.flag + ", when it is not given"})
	}
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		cmd.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			for _, e := range f.Annotations[annEnv] {
				if !seen[e] {
					seen[e] = true
					out = append(out, envVar{e, "the default of " + cmd.CommandPath() + " --" + f.Name})
				}
			}
		})
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return append(out, envVar{"XDG_CONFIG_HOME, HOME", "where the session of salt-volumes login is kept: $XDG_CONFIG_HOME/salt-volumes/session.json, else ~/.config/salt-volumes/session.json"})
}

// prepare runs before every command: flags not given take their
// environment variables (read here, not as defaults, so that help and
// the man pages say the same on every machine), and -o must be one the
// command prints.
func (c *cli) prepare(cmd *cobra.Command, _ []string) error {
	if err := c.applyEnv(cmd); err != nil {
		return err
	}
	if c.output == "" {
		return nil
	}
	if !slices.Contains(allFormats, c.output) {
		return usagef(cmd, "-o %s: use %s", c.output, orList(allFormats))
	}
	outs := outputsOf(cmd)
	switch {
	case len(outs) == 0:
		return usagef(cmd, "-o %s: %s prints no objects; leave -o out", c.output, cmd.CommandPath())
	case !slices.Contains(outs, c.output):
		return usagef(cmd, "-o %s: %s prints %s only", c.output, cmd.CommandPath(), orList(outs))
	}
	return nil
}

// applyEnv gives each flag not given on the command line the value of its
// environment variable. A token given one way on the command line (--token
// or --token-file) beats the other way from the environment.
func (c *cli) applyEnv(cmd *cobra.Command) error {
	fs := cmd.Flags()
	if fs.Changed("token") && fs.Changed("token-file") {
		return usagef(cmd, "give --token or --token-file, not both")
	}
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		env := f.Annotations[annEnv]
		if len(env) == 0 || f.Changed || err != nil {
			return
		}
		if (f.Name == "token" && fs.Changed("token-file")) || (f.Name == "token-file" && fs.Changed("token")) {
			return
		}
		if v := os.Getenv(env[0]); v != "" {
			// Value.Set, not fs.Set: the flag stays "not given".
			if e := f.Value.Set(v); e != nil {
				err = usagef(cmd, "%s=%q (for --%s): %v", env[0], v, f.Name, e)
			}
		}
	})
	return err
}

// objects marks a command as printing objects in these -o formats.
func objects(cmd *cobra.Command, formats ...string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annOutputs] = strings.Join(formats, ",")
	return cmd
}

func outputsOf(cmd *cobra.Command) []string {
	if s := cmd.Annotations[annOutputs]; s != "" {
		return strings.Split(s, ",")
	}
	return nil
}

// name is how messages name a command: its path below the root.
func name(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return cmd.Name()
	}
	_, p, _ := strings.Cut(cmd.CommandPath(), " ")
	return p
}

// usagef is a usage error of cmd: exit 2, and where its usage is.
func usagef(cmd *cobra.Command, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	if cmd.HasParent() {
		msg = name(cmd) + ": " + msg
	}
	return failf(exitUsage, "%s\nRun '%s --help' for usage.", msg, cmd.CommandPath())
}

// orList is "a, b or c".
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// Positional arguments: what says what they should be.
func noArgs(what string) cobra.PositionalArgs { return rangeArgs(0, 0, what) }

func exactArgs(n int, what string) cobra.PositionalArgs { return rangeArgs(n, n, what) }

func rangeArgs(lo, hi int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usagef(cmd, "%s", what)
		}
		return nil
	}
}

// group is a command of subcommands: alone, or with an unknown
// subcommand, a usage error naming them.
func group(cmd *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		var names []string
		for _, s := range cmd.Commands() {
			if s.IsAvailableCommand() {
				names = append(names, s.Name())
			}
		}
		list := orList(names)
		if len(args) == 0 {
			return usagef(cmd, "give a subcommand: %s", list)
		}
		return usagef(cmd, "%q is not a subcommand: give %s", args[0], list)
	}
	cmd.AddCommand(subs...)
	return cmd
}

// helpCmd is help [COMMAND]...: exit 0 with the command's help, 2 for a
// command there is not.
func (c *cli) helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]...",
		Short: "Help about any command",
		Long:  "The help of a command: what it does, its flags and examples (the same as COMMAND --help).",
		Example: `  salt-volumes help
  salt-volumes help snapshot create`,
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			parent, rest, err := cmd.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var out []cobra.Completion
			for _, s := range parent.Commands() {
				if s.IsAvailableCommand() && strings.HasPrefix(s.Name(), toComplete) {
					out = append(out, cobra.CompletionWithDesc(s.Name(), s.Short))
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := cmd.Root().Find(args)
			if err != nil || len(rest) > 0 || target == nil {
				return usagef(cmd, "no command %q: salt-volumes --help lists them", strings.Join(args, " "))
			}
			target.InitDefaultHelpFlag()
			return target.Help()
		},
	}
}
