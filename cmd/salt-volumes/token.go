package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/salt-volumes/salt-volumes/internal/access"
)

// tokenCmd holds the service-token commands: create, list, revoke.
func (c *cli) tokenCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:   "token",
		Short: "Service tokens: create, list, revoke (admin)",
		Long: `Service tokens, for programs (Prometheus, CI): made with a role, stored as
hashes in the store and shared by replicas, revoked by name. People log in
instead (salt-volumes login). Role admin.`,
		Example: `  salt-volumes token create prometheus --role viewer --expires 90d
  salt-volumes token list
  salt-volumes token revoke prometheus`,
	}, c.tokenCreateCmd(), c.tokenListCmd(), c.tokenRevokeCmd())
}

func (c *cli) tokenCreateCmd() *cobra.Command {
	var role, expires string
	cmd := &cobra.Command{
		Use:   "create NAME --role ROLE",
		Short: "Make a service token; its secret is printed once",
		Long: `Make a service token of a role (viewer, operator or admin). Its secret is
printed alone on stdout, once (it is stored only as a hash), what to do
with it on stderr; -o json or yaml print the token with its secret.`,
		Example: `  TOKEN=$(salt-volumes token create ci --role operator --expires 30d)`,
		Args:    exactArgs(1, "give one NAME (lower-case letters, digits and '-')"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "token")
			if err != nil {
				return err
			}
			if role == "" {
				return usagef(cmd, "--role: missing: give viewer, operator or admin")
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			v, err := cl.CreateToken(cmd.Context(), name, role, expires)
			if err != nil {
				return err
			}
			if !c.human() {
				return c.emit(v, nil, nil)
			}
			// The secret alone on stdout (scripts: TOKEN=$(salt-volumes
			// token create ...)); what to do with it on stderr. One a
			// request cannot carry is not printed: it is of no use, and
			// could be a terminal's command (the server's are
			// base64url).
			if v.Token == "" || strings.ContainsFunc(v.Token, func(r rune) bool { return r <= ' ' || r > '~' }) {
				return failf(exitFailed, "token create: the server answered a secret no request can carry: not printed; revoke the token: salt-volumes token revoke %s", name)
			}
			fmt.Fprintln(c.out, v.Token)
			exp := "never expires"
			if v.Expires != nil {
				exp = "expires " + v.Expires.Local().Format(time.RFC3339)
			}
			line(c.errw, "token %s (role %s, %s): shown this once, stored only as a hash; revoke with: salt-volumes token revoke %s", name, v.Role, exp, name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&role, "role", "", "viewer, operator or admin (required)")
	f.StringVar(&expires, "expires", "", "lifetime, e.g. 90d or 12h (default: never)")
	_ = cmd.RegisterFlagCompletionFunc("role", fixed("viewer", "operator", "admin"))
	_ = cmd.RegisterFlagCompletionFunc("expires", cobra.NoFileCompletions)
	// No -o name: the secret, shown once, would be lost.
	return objects(cmd, fmtTable, fmtJSON, fmtYAML)
}

func (c *cli) tokenListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the service tokens and the sessions (never a secret)",
		Long:    "List the service tokens and people's sessions: kind, user, role, age, expiry and who made them; never a secret. -o wide adds their groups.",
		Example: `  salt-volumes token list
  salt-volumes token list -o json | jq -r '.items[] | select(.kind == "session") | .user'`,
		Args: noArgs("takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			items, err := cl.Tokens(cmd.Context())
			if err != nil {
				return err
			}
			names := make([]string, len(items))
			for i, t := range items {
				names[i] = t.Name
			}
			return c.emit(listOf(items), named("token", names...), func(wide bool) error { return c.tokenTable(items, wide) })
		},
	}
	return objects(cmd, objectFormats...)
}

func (c *cli) tokenTable(items []access.TokenView, wide bool) error {
	head := []string{"NAME", "KIND", "USER", "ROLE", "CREATED", "EXPIRES", "CREATED BY"}
	if wide {
		head = append(head, "GROUPS")
	}
	t := c.newTable(head...)
	for _, tok := range items {
		exp := "never"
		if tok.Expires != nil {
			exp = ago(time.Until(*tok.Expires), "in ")
		}
		row := []string{tok.Name, tok.Kind, or(tok.User, "-"), string(tok.Role), ago(time.Since(tok.Created), "") + " ago", exp, or(tok.CreatedBy, "-")}
		if wide {
			row = append(row, or(strings.Join(tok.Groups, ","), "-"))
		}
		t.row(row...)
	}
	return t.flush()
}

func (c *cli) tokenRevokeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "revoke NAME",
		Aliases: []string{"rm"},
		Short:   "Revoke a token: refused from now on",
		Long:    "Revoke a service token or a session by name: every replica refuses it from now on, and its open watch streams end. -o json, yaml or name print the token revoked.",
		Example: `  salt-volumes token revoke prometheus
  salt-volumes token list -o name | grep ci- | xargs -n1 salt-volumes token revoke`,
		Args:              exactArgs(1, "give one NAME (salt-volumes token list shows them)"),
		ValidArgsFunction: c.completeArgs(listTokens),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "token")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			v, err := cl.RevokeToken(cmd.Context(), name)
			if err != nil {
				return err
			}
			if !c.human() {
				return c.emit(v, named("token", v.Name), nil)
			}
			line(c.out, "token %s revoked: refused from now on", name)
			return nil
		},
	}
	return objects(cmd, objectFormats...)
}
