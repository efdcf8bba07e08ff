// Package access decides who may use the API: roles, the tokens that carry
// them (service tokens for automation, sessions for people), and the audit
// trail of what each of them changed or was refused.
package access

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Role is what a caller may do; each includes the ones before it.
type Role string

const (
	// Viewer reads: volumes, nodes, jobs, the watch stream, metrics.
	Viewer Role = "viewer"
	// Operator also creates, grows and deletes volumes (no wipe), on the
	// minions its Salt ACL covers when it logged in through Salt.
	Operator Role = "operator"
	// Admin also uses raw devices, wipes, forgets volumes and nodes,
	// manages tokens and reads the audit trail.
	Admin Role = "admin"
)

var order = []Role{Viewer, Operator, Admin}

// ParseRole reads a role name; field names the setting for the error.
func ParseRole(field, s string) (Role, error) {
	r := Role(strings.ToLower(strings.TrimSpace(s)))
	if !slices.Contains(order, r) {
		return "", fmt.Errorf("%s: %q is not a role: give viewer, operator or admin", field, s)
	}
	return r, nil
}

// Allows reports whether r includes need.
func (r Role) Allows(need Role) bool {
	return slices.Index(order, r) >= slices.Index(order, need) && slices.Contains(order, r)
}

// Principal is who a request comes from.
type Principal struct {
	// User names the person or the token: a Salt user for a session,
	// "token:<name>" for a service token, "bootstrap" for config's token.
	User   string   `json:"user"`
	Role   Role     `json:"role"`
	Groups []string `json:"groups,omitempty"`
	// Eauth is the Salt eauth backend a session logged in with.
	Eauth string `json:"eauth,omitempty"`
	// Kind: "bootstrap", "service", "session" or "kubernetes" (a token
	// the API server vouched for; RBAC decides each action, not Role).
	Kind string `json:"kind"`
	// UID is a Kubernetes identity's uid (for its SubjectAccessReviews).
	UID string `json:"-"`
	// Owner is the Salt user a service token was made by, when a person
	// made it (with Eauth): their role and Salt ACL bound the token, as
	// they bound the person.
	Owner string `json:"owner,omitempty"`
	// Extra is a Kubernetes identity's extra attributes from its
	// TokenReview (scopes, credential ids), passed on to its
	// SubjectAccessReviews.
	Extra map[string][]string `json:"-"`
}

// Person is the Salt user whose role and ACL bound p: the person of a
// session, the maker of a token a person made; "" for the bootstrap
// token, tokens made with it, and Kubernetes identities.
func (p *Principal) Person() string {
	switch {
	case p == nil:
		return ""
	case p.Kind == "session":
		return p.User
	case p.Kind == "service":
		return p.Owner
	}
	return ""
}

type principalKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// From returns the request's principal (nil outside an authenticated one).
func From(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// RoleMap gives a person their role from their Salt user name, eauth
// backend and groups: the highest of their own entry, their groups' and
// Default. A key "NAME" is for NAME from any backend people may log in
// with (Eauth); "EAUTH:NAME" for NAME from that backend alone, so that
// an LDAP user named like a local admin is not that admin.
type RoleMap struct {
	Users   map[string]Role
	Groups  map[string]Role
	Default Role
	// Eauth lists the backends people may log in with; a login from any
	// other gets no role.
	Eauth []string
}

// DefaultEauth is who may log in when serve's config names no backend:
// the master's local accounts only (PAM). Any other backend is named.
var DefaultEauth = []string{"pam"}

// Backends returns the eauth backends logins are taken from.
func (m RoleMap) Backends() []string {
	if len(m.Eauth) == 0 {
		return DefaultEauth
	}
	return m.Eauth
}

// For returns the role of user from eauth ("" when the map gives none:
// no login).
func (m RoleMap) For(eauth, user string, groups []string) Role {
	if !slices.Contains(m.Backends(), eauth) {
		return ""
	}
	best := m.Default
	better := func(r Role) {
		if r.Allows(Viewer) && (best == "" || r.Allows(best)) {
			best = r
		}
	}
	lookup := func(table map[string]Role, name string) {
		// A name with a colon could pose as another backend's entry
		// ("pam:root" from LDAP): only its own backend's key counts.
		if r, ok := table[name]; ok && !strings.Contains(name, ":") {
			better(r)
		}
		if r, ok := table[eauth+":"+name]; ok {
			better(r)
		}
	}
	lookup(m.Users, user)
	for _, g := range groups {
		lookup(m.Groups, g)
	}
	return best
}

// Lower returns the lower of two roles ("" if either is none).
func Lower(a, b Role) Role {
	switch {
	case !a.Allows(Viewer) || !b.Allows(Viewer):
		return ""
	case a.Allows(b):
		return b
	}
	return a
}
