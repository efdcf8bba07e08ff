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

// RoleMap gives a person their role from their Salt user name and groups:
// the highest of their own entry, their groups' and Default.
type RoleMap struct {
	Users   map[string]Role
	Groups  map[string]Role
	Default Role
}

// For returns the role ("" when the map gives none: no login).
func (m RoleMap) For(user string, groups []string) Role {
	best := m.Default
	better := func(r Role) {
		if r.Allows(Viewer) && (best == "" || r.Allows(best)) {
			best = r
		}
	}
	if r, ok := m.Users[user]; ok {
		better(r)
	}
	for _, g := range groups {
		if r, ok := m.Groups[g]; ok {
			better(r)
		}
	}
	return best
}
