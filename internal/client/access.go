package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/access"
)

// WhoAmI returns who the client's token is.
func (c *Client) WhoAmI(ctx context.Context) (access.Principal, error) {
	var p access.Principal
	err := c.do(ctx, http.MethodGet, "/api/v1/whoami", nil, &p)
	return p, err
}

// Tokens lists the service tokens and sessions (admin).
func (c *Client) Tokens(ctx context.Context) ([]access.TokenView, error) {
	var out struct {
		Items []access.TokenView `json:"items"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/tokens", nil, &out)
	return out.Items, err
}

// CreateToken issues a service token; its secret is in the answer's Token.
func (c *Client) CreateToken(ctx context.Context, name, role, expires string) (access.TokenView, error) {
	var v access.TokenView
	body := map[string]string{"name": name, "role": role}
	if expires != "" {
		body["expires"] = expires
	}
	err := c.do(ctx, http.MethodPost, "/api/v1/tokens", body, &v)
	return v, err
}

// RevokeToken revokes a token by name.
func (c *Client) RevokeToken(ctx context.Context, name string) (access.TokenView, error) {
	var v access.TokenView
	err := c.do(ctx, http.MethodDelete, "/api/v1/tokens/"+url.PathEscape(name), nil, &v)
	return v, err
}

// Audit reads the audit trail (admin); empty arguments select all.
func (c *Client) Audit(ctx context.Context, user, volume, since string, limit string) ([]access.Entry, error) {
	q := url.Values{}
	for k, v := range map[string]string{"user": user, "volume": volume, "since": since, "limit": limit} {
		if v != "" {
			q.Set(k, v)
		}
	}
	path := "/api/v1/audit"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out struct {
		Items []access.Entry `json:"items"`
	}
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out.Items, err
}

// Session is a person's login as the API answers it.
type Session struct {
	Token  string      `json:"token"`
	Expire time.Time   `json:"expire"`
	User   string      `json:"user"`
	Role   access.Role `json:"role"`
	Groups []string    `json:"groups,omitempty"`
	Eauth  string      `json:"eauth"`
	// Scopes are the minions the user's Salt ACL lets them change volumes
	// on (of those up at login); Grants the ACL's targets that grant it.
	Scopes []string `json:"scopes"`
	Grants []string `json:"grants,omitempty"`
}

// Login logs a person in with their Salt identity; it needs no token.
func (c *Client) Login(ctx context.Context, user, password, eauth string) (Session, error) {
	var s Session
	err := c.do(ctx, http.MethodPost, "/api/v1/login", map[string]string{"username": user, "password": password, "eauth": eauth}, &s)
	return s, err
}

// Logout ends the client's session.
func (c *Client) Logout(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/api/v1/logout", nil, nil)
}
