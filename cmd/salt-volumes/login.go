package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/salt-volumes/salt-volumes/internal/client"
)

// A person's login is kept in their config directory, readable by them
// alone, and used when no token is given.

type savedSession struct {
	URL    string    `json:"url"`
	Token  string    `json:"token"`
	User   string    `json:"user"`
	Expire time.Time `json:"expire"`
	// The TLS files login was given: the session's server is reached
	// the same way later, without them on every command line.
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
}

func sessionPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no config directory for the session (%v): set XDG_CONFIG_HOME or HOME", err)
	}
	return filepath.Join(dir, "salt-volumes", "session.json"), nil
}

// loadSession returns the saved login (nil: none, or expired).
func loadSession() *savedSession {
	p, err := sessionPath()
	if err != nil {
		return nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	var s savedSession
	if json.Unmarshal(b, &s) != nil || s.Token == "" || (!s.Expire.IsZero() && time.Now().After(s.Expire)) {
		return nil
	}
	return &s
}

// saveSession writes the session atomically, mode 0600.
func saveSession(s savedSession) (string, error) {
	p, err := sessionPath()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return "", err
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	f, err := os.CreateTemp(filepath.Dir(p), ".session-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err == nil {
		_, err = f.Write(b)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(f.Name(), p)
		}
		return p, err
	}
	f.Close()
	return "", err
}

// readPassword prompts on a terminal without echo; from a pipe it reads
// one line (scripts, tests).
func (c *cli) readPassword(ctx context.Context, prompt string) (string, error) {
	if f, ok := c.in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fd := int(f.Fd())
		fmt.Fprint(c.errw, prompt)
		state, err := term.GetState(fd)
		if err != nil {
			return "", err
		}
		// Ctrl-C reaches us, not the read: the terminal gets its echo
		// back before the command ends.
		b, err := interruptible(ctx, func() (string, error) { b, err := term.ReadPassword(fd); return string(b), err })
		if ctx.Err() != nil {
			_ = term.Restore(fd, state)
		}
		fmt.Fprintln(c.errw)
		return b, err
	}
	line, err := interruptible(ctx, func() (string, error) { return bufio.NewReader(c.in).ReadString('\n') })
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		return "", failf(exitUsage, "login: no password on standard input")
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// interruptible runs a read that knows no context until it returns or
// ctx ends (Ctrl-C), whichever comes first; the read left behind ends
// with the process.
func interruptible(ctx context.Context, read func() (string, error)) (string, error) {
	type result struct {
		s   string
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := read()
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// loginCmd logs in with a Salt identity and keeps the session.
func (c *cli) loginCmd() *cobra.Command {
	var user, eauth string
	cmd := &cobra.Command{
		Use:   "login",
		Short: "Log in with your Salt identity; the session is kept for you",
		Long: `Log in with your Salt user name and password (asked on the terminal, or
read as one line from standard input): the master checks them with the
eauth backend you name, serve's access config gives the role, and your
Salt ACL bounds the minions you may change volumes on. The session is kept
in your config directory, readable by you alone, with the server it was
made with (--url, SALT_VOLUMES_URL) and the TLS files given now; commands
without a token use it, for that server only.`,
		Example: `  salt-volumes login --url https://salt-master:8443 --ca-file ca.pem
  salt-volumes login --user alice --eauth ldap`,
		Args: noArgs("takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.conn.url == "" {
				return failf(exitUsage, "no server: set SALT_VOLUMES_URL (e.g. https://salt-master:8080) or pass --url")
			}
			if user == "" {
				return usagef(cmd, "--user: missing: give your Salt user name")
			}
			pw, err := c.readPassword(cmd.Context(), fmt.Sprintf("Password for %s (eauth %s): ", user, eauth))
			if err != nil {
				return err
			}
			k := c.conn
			for _, f := range []*string{&k.caFile, &k.certFile, &k.keyFile} {
				if *f != "" {
					// Kept for later commands, run from anywhere.
					if abs, err := filepath.Abs(*f); err == nil {
						*f = abs
					}
				}
			}
			// The login request sends no token.
			cl, err := c.httpClient(k.url, "", k)
			if err != nil {
				return err
			}
			s, err := cl.Login(cmd.Context(), user, pw, eauth)
			if err != nil {
				return err
			}
			if err := client.CheckToken(s.Token); err != nil || s.Token == "" {
				return failf(exitFailed, "login: the server answered a session token no request can carry (%v): not kept", err)
			}
			path, err := saveSession(savedSession{URL: strings.TrimRight(k.url, "/"), Token: s.Token, User: s.User, Expire: s.Expire,
				CAFile: k.caFile, CertFile: k.certFile, KeyFile: k.keyFile})
			if err != nil {
				return fmt.Errorf("login: saving the session: %w", err)
			}
			fmt.Fprintf(c.errw, "session kept in %s (yours alone); salt-volumes logout ends it\n", path)
			s.Token = ""
			return c.emit(s, nil, func(bool) error {
				scope := "no minion"
				if len(s.Scopes) > 0 {
					scope = strings.Join(s.Scopes, ", ")
				}
				line(c.out, "logged in as %s (role %s) until %s; your Salt ACL lets you change volumes on: %s", s.User, s.Role, s.Expire.Local().Format(time.DateTime), scope)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&user, "user", "", "your Salt user name (default $USER)")
	f.StringVar(&eauth, "eauth", "pam", "the master's eauth backend: pam, ldap, file, ...")
	_ = f.SetAnnotation("user", annEnv, []string{"USER"})
	_ = cmd.RegisterFlagCompletionFunc("eauth", fixed("pam", "ldap", "file", "auto", "sharedsecret", "django", "rest", "yubico"))
	_ = cmd.RegisterFlagCompletionFunc("user", cobra.NoFileCompletions)
	return objects(cmd, recordFormats...)
}

// logoutCmd ends the saved session, on the server it was made with.
func (c *cli) logoutCmd() *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "logout",
		Short: "End the session salt-volumes login keeps",
		Long: `End the session: on the server it was made with (never another, whatever
--url or SALT_VOLUMES_URL say now: the session's token is for that server
alone), then here. A session that server no longer knows (401) is gone
already; one it cannot be asked about (no answer, exit 7) is kept, to be
ended later. --local drops the session here without asking the server (a
server gone for good): the token stays valid there until it expires or an
admin revokes it (salt-volumes token list shows it).`,
		Example: `  salt-volumes logout
  salt-volumes logout --local`,
		Args: noArgs("takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s := loadSession()
			p, _ := sessionPath()
			if s == nil {
				if p != "" {
					_ = os.Remove(p)
				}
				fmt.Fprintln(c.out, "not logged in")
				return nil
			}
			if local {
				if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
					return err
				}
				until := "it expires"
				if !s.Expire.IsZero() {
					until = "it expires (" + s.Expire.Local().Format(time.DateTime) + ")"
				}
				line(c.out, "session of %s dropped here; %s was not asked: the session stays valid there until %s or an admin revokes it", s.User, client.Redact(s.URL), until)
				return nil
			}
			if c.conn.url != "" && !sameURL(c.conn.url, s.URL) {
				line(c.errw, "the session is with %s, not %s: ending it there", client.Redact(s.URL), client.Redact(c.conn.url))
			}
			// The TLS files login kept, unless others are given now for
			// the session's server.
			k := conn{caFile: s.CAFile, certFile: s.CertFile, keyFile: s.KeyFile}
			if (c.conn.caFile != "" || c.conn.certFile != "") && (c.conn.url == "" || sameURL(c.conn.url, s.URL)) {
				k = c.conn
			}
			cl, err := c.httpClient(s.URL, s.Token, k)
			if err != nil {
				return err
			}
			// 401 from the session's own server: it knows the token no
			// more (expired, revoked, logged out elsewhere).
			var ce *client.Error
			if err := cl.Logout(cmd.Context()); err != nil && !(errors.As(err, &ce) && ce.Status == 401) {
				return hint(err, "the session is kept, to end it later; salt-volumes logout --local drops it here without asking the server (where it stays valid until it expires)")
			}
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				return err
			}
			line(c.out, "logged out %s", s.User)
			return nil
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "drop the session here without asking its server (one gone for good); it stays valid there until it expires")
	return cmd
}
