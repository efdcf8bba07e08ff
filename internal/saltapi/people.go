package saltapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// People: checking a person's Salt credentials, and what their Salt ACL
// allows, for salt-volumes' own logins.

// ErrBadCredentials: the master refused the user, password or eauth.
var ErrBadCredentials = errors.New("the salt master refused the login")

// Identity is a Salt user the master authenticated.
type Identity struct {
	User  string
	Eauth string
	// Expire is when the master's token for the login would have expired
	// (its token_expire).
	Expire time.Time
}

// Authenticate asks the master, through salt-api's /login, whether the
// password is right for user under eauth. The session salt-api opens for
// it is closed at once: serve keeps a session of its own, and what the
// user may do is asked of the master by name (Access).
func (c *Client) Authenticate(ctx context.Context, user, password, eauth string) (Identity, error) {
	body, _ := json.Marshal(map[string]string{"username": user, "password": password, "eauth": eauth})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.URL+"/login", bytes.NewReader(body))
	if err != nil {
		return Identity{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.login.Do(req)
	if err != nil {
		return Identity{}, fmt.Errorf("salt-api login: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode == http.StatusUnauthorized {
		return Identity{}, ErrBadCredentials
	}
	if resp.StatusCode != http.StatusOK {
		return Identity{}, &Error{Status: resp.StatusCode, Body: string(raw), Op: "login of a user"}
	}
	var out struct {
		Return []struct {
			Token  string  `json:"token"`
			Expire float64 `json:"expire"`
			User   string  `json:"user"`
			Eauth  string  `json:"eauth"`
		} `json:"return"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Return) == 0 || out.Return[0].Token == "" {
		return Identity{}, fmt.Errorf("salt-api login: unexpected answer (no token)")
	}
	r := out.Return[0]
	c.logout(ctx, r.Token)
	id := Identity{User: r.User, Eauth: r.Eauth, Expire: time.Unix(int64(r.Expire), 0)}
	if id.User == "" {
		id.User = user
	}
	if id.Eauth == "" {
		id.Eauth = eauth
	}
	return id, nil
}

// logout closes a salt-api session (and, from Salt 3008 on, revokes its
// token); a failure only leaves it to expire.
func (c *Client) logout(ctx context.Context, token string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.URL+"/logout", nil)
	if err != nil {
		return
	}
	req.Header.Set("X-Auth-Token", token)
	req.Header.Set("Accept", "application/json")
	resp, err := c.login.Do(req)
	if err != nil {
		c.cfg.Log.Debug("salt-api logout of a user's session failed; it expires by itself", "error", err)
		return
	}
	resp.Body.Close()
}

// Access is the master's answer about one Salt user (salt/_runners).
type Access struct {
	User   string   `json:"user"`
	Eauth  string   `json:"eauth"`
	Groups []string `json:"groups"`
	// Allowed: per minion asked, whether the user's ACL grants our node
	// function on it.
	Allowed map[string]bool `json:"allowed"`
	// Grants lists the ACL targets that grant the node function.
	Grants []string `json:"grants"`
}

// UserAccess asks the master (runner salt_volumes.access) for user's groups
// and whether their ACL lets them change volumes on each minion.
func (c *Client) UserAccess(ctx context.Context, user, eauth string, minions []string) (Access, error) {
	kw := map[string]any{"person": user, "backend": eauth}
	if len(minions) > 0 {
		kw["minions"] = minions
	}
	raw, err := c.Runner(ctx, "salt_volumes.access", kw)
	if err != nil {
		return Access{}, err
	}
	var out struct {
		Access
		Error string `json:"error"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		var msg string
		if json.Unmarshal(raw, &msg) == nil && strings.Contains(msg, "is not available") {
			return Access{}, fmt.Errorf("the master has no runner salt_volumes.access: run salt-run saltutil.sync_runners on the master (or install the saltext.volumes extension): %s", msg)
		}
		return Access{}, fmt.Errorf("salt_volumes.access: unexpected answer %s", truncate(raw))
	}
	if out.Error != "" {
		return Access{}, fmt.Errorf("salt_volumes.access: %s", out.Error)
	}
	return out.Access, nil
}

type metadataKey struct{}

// WithMetadata returns ctx carrying md for the jobs LocalAsync starts with
// it: Salt keeps a job's metadata in its job cache (jobs.list_job shows it
// as Metadata), beside the user who published it.
func WithMetadata(ctx context.Context, md map[string]any) context.Context {
	return context.WithValue(ctx, metadataKey{}, md)
}

// Metadata is the job metadata ctx carries (nil: none).
func Metadata(ctx context.Context) map[string]any {
	md, _ := ctx.Value(metadataKey{}).(map[string]any)
	return md
}
