package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// token holds the service-token commands: create, list, revoke.
func (c *cli) tokenCmd(ctx context.Context, in []string) error {
	if len(in) == 0 {
		return failf(exitUsage, "token: give a subcommand: token create NAME --role R [--expires D], token list, token revoke NAME")
	}
	switch in[0] {
	case "create":
		fs := c.flags("token create")
		role := fs.String("role", "", "viewer, operator or admin (required)")
		expires := fs.String("expires", "", "lifetime, e.g. 90d or 12h (default: never)")
		pos, cl, err := c.open(fs, in[1:], 1, "give one NAME (lower-case letters, digits and '-')")
		if err != nil {
			return err
		}
		if *role == "" {
			return failf(exitUsage, "token create: --role: missing: give viewer, operator or admin")
		}
		v, err := cl.CreateToken(ctx, pos[0], *role, *expires)
		if err != nil {
			return err
		}
		if c.output == "json" {
			return c.json(v)
		}
		// The secret alone on stdout (scripts: TOKEN=$(salt-volumes token
		// create ...)); what to do with it on stderr.
		fmt.Fprintln(c.out, v.Token)
		exp := "never expires"
		if v.Expires != nil {
			exp = "expires " + v.Expires.Local().Format(time.RFC3339)
		}
		fmt.Fprintf(c.errw, "token %s (role %s, %s): shown this once, stored only as a hash; revoke with: salt-volumes token revoke %s\n", v.Name, v.Role, exp, v.Name)
		return nil
	case "list", "ls":
		fs := c.flags("token list")
		_, cl, err := c.open(fs, in[1:], 0, "takes no arguments")
		if err != nil {
			return err
		}
		items, err := cl.Tokens(ctx)
		if err != nil {
			return err
		}
		if c.output == "json" {
			return c.json(items)
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tKIND\tUSER\tROLE\tCREATED\tEXPIRES\tCREATED BY")
		for _, t := range items {
			exp := "never"
			if t.Expires != nil {
				exp = ago(time.Until(*t.Expires), "in ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Kind, or(t.User, "-"), t.Role, ago(time.Since(t.Created), "")+" ago", exp, or(t.CreatedBy, "-"))
		}
		return tw.Flush()
	case "revoke", "rm":
		fs := c.flags("token revoke")
		pos, cl, err := c.open(fs, in[1:], 1, "give one NAME (salt-volumes token list shows them)")
		if err != nil {
			return err
		}
		v, err := cl.RevokeToken(ctx, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(c.out, "token %s revoked: refused from now on\n", v.Name)
		return nil
	}
	return failf(exitUsage, "token: unknown subcommand %q: give create, list or revoke", in[0])
}

// audit prints the audit trail, oldest first.
func (c *cli) audit(ctx context.Context, in []string) error {
	fs := c.flags("audit")
	user := fs.String("user", "", "only this user's entries (a Salt user, or token:NAME)")
	vol := fs.String("volume", "", "only this volume's entries")
	since := fs.String("since", "", "only entries this recent, e.g. 24h or 7d")
	limit := fs.String("limit", "", "only the newest N entries")
	_, cl, err := c.open(fs, in, 0, "takes no arguments")
	if err != nil {
		return err
	}
	items, err := cl.Audit(ctx, *user, *vol, *since, *limit)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(items)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tUSER\tROLE\tSOURCE\tREQUEST\tVOLUME\tNODE\tDECISION\tREASON")
	for _, e := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s %s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.DateTime), e.User, or(string(e.Role), "-"), e.Source,
			e.Method, e.Route, or(e.Volume, "-"), or(e.Node, "-"), e.Decision, or(e.Reason, "-"))
	}
	return tw.Flush()
}

// whoami prints who the configured token is.
func (c *cli) whoami(ctx context.Context, in []string) error {
	fs := c.flags("whoami")
	_, cl, err := c.open(fs, in, 0, "takes no arguments")
	if err != nil {
		return err
	}
	p, err := cl.WhoAmI(ctx)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(p)
	}
	line := fmt.Sprintf("%s\trole %s\t(%s)", p.User, p.Role, p.Kind)
	if len(p.Groups) > 0 {
		line += "\tgroups " + strings.Join(p.Groups, ",")
	}
	fmt.Fprintln(c.out, line)
	return nil
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

// ago is a duration in its largest whole unit: 3d, 5h, 12m, 40s.
func ago(d time.Duration, prefix string) string {
	if d < 0 {
		return "expired"
	}
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%s%dd", prefix, int(d.Hours()/24))
	case d >= time.Hour:
		return fmt.Sprintf("%s%dh", prefix, int(d.Hours()))
	case d >= time.Minute:
		return fmt.Sprintf("%s%dm", prefix, int(d.Minutes()))
	}
	return fmt.Sprintf("%s%ds", prefix, int(d.Seconds()))
}
