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
func (c *cli) readPassword(prompt string) (string, error) {
	if f, ok := c.in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(c.errw, prompt)
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(c.errw)
		return string(b), err
	}
	line, err := bufio.NewReader(c.in).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		return "", failf(exitUsage, "login: no password on standard input")
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// login logs in with a Salt identity and keeps the session.
func (c *cli) login(ctx context.Context, in []string) error {
	fs := c.flags("login")
	user := fs.String("user", os.Getenv("USER"), "Salt user name (default $USER)")
	eauth := fs.String("eauth", "pam", "the master's eauth backend: pam, ldap, file, ...")
	if _, err := args(fs, in, 0, "takes no arguments"); err != nil {
		return err
	}
	if c.url == "" {
		return failf(exitUsage, "no server: set SALT_VOLUMES_URL (e.g. https://salt-master:8080) or pass --url")
	}
	if *user == "" {
		return failf(exitUsage, "login: --user: missing: give your Salt user name")
	}
	pw, err := c.readPassword(fmt.Sprintf("Password for %s (eauth %s): ", *user, *eauth))
	if err != nil {
		return err
	}
	c.token = "-" // client() needs one; the login request sends none
	cl, err := c.client()
	if err != nil {
		return err
	}
	cl.Token = ""
	s, err := cl.Login(ctx, *user, pw, *eauth)
	if err != nil {
		return err
	}
	path, err := saveSession(savedSession{URL: c.url, Token: s.Token, User: s.User, Expire: s.Expire})
	if err != nil {
		return fmt.Errorf("login: saving the session: %w", err)
	}
	if c.output == "json" {
		s.Token = ""
		return c.json(s)
	}
	scope := "no minion"
	if len(s.Scopes) > 0 {
		scope = strings.Join(s.Scopes, ", ")
	}
	fmt.Fprintf(c.out, "logged in as %s (role %s) until %s; your Salt ACL lets you change volumes on: %s\n", s.User, s.Role, s.Expire.Local().Format(time.DateTime), scope)
	fmt.Fprintf(c.errw, "session kept in %s (yours alone); salt-volumes logout ends it\n", path)
	return nil
}

// logout ends the saved session.
func (c *cli) logout(ctx context.Context, in []string) error {
	fs := c.flags("logout")
	if _, err := args(fs, in, 0, "takes no arguments"); err != nil {
		return err
	}
	s := loadSession()
	p, _ := sessionPath()
	if s == nil {
		os.Remove(p)
		fmt.Fprintln(c.out, "not logged in")
		return nil
	}
	if c.url == "" {
		c.url = s.URL
	}
	c.token = s.Token
	cl, err := c.client()
	if err != nil {
		return err
	}
	var ce *client.Error
	if err := cl.Logout(ctx); err != nil && !(errors.As(err, &ce) && ce.Status == 401) {
		return err
	}
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		return err
	}
	fmt.Fprintf(c.out, "logged out %s\n", s.User)
	return nil
}
