package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

// tokensKind is the records' kind for service tokens and sessions: keyed
// by the SHA-256 of the secret, so that checking one is a single read and
// the store never holds a secret that would let its reader in.
const tokensKind = "tokens"

// Token is a stored token: its secret is never kept.
type Token struct {
	Name string `json:"name"`
	// Kind: "service" (created by an admin, for automation) or "session"
	// (a person's login).
	Kind      string    `json:"kind"`
	User      string    `json:"user,omitempty"`
	Role      Role      `json:"role"`
	Groups    []string  `json:"groups,omitempty"`
	Eauth     string    `json:"eauth,omitempty"`
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires,omitempty"`
	CreatedBy string    `json:"createdBy,omitempty"`
	// hash is the record's key.
	hash string
}

// FieldError refuses a request's field, naming it and the fix.
type FieldError struct{ Field, Msg string }

func (e *FieldError) Error() string { return e.Msg }

// ErrUnauthenticated: no token, or one that is wrong, revoked or expired.
var ErrUnauthenticated = errors.New("missing, wrong, revoked or expired token")

// Tokens checks, issues and revokes tokens.
type Tokens struct {
	Records store.Records
	// Bootstrap is config's token: an admin that no record can revoke,
	// for the first login and for recovery.
	Bootstrap string
	Now       func() time.Time
}

func (t *Tokens) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

func hashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// newSecret: 32 random bytes behind a prefix that says what it is (a
// leaked one found in a log or a repository can be recognised).
func newSecret(prefix string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// Check returns who holds secret.
func (t *Tokens) Check(ctx context.Context, secret string) (*Principal, error) {
	if secret == "" {
		return nil, ErrUnauthenticated
	}
	if t.Bootstrap != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(t.Bootstrap)) == 1 {
		return &Principal{User: "bootstrap", Role: Admin, Kind: "bootstrap"}, nil
	}
	if t.Records == nil || !(strings.HasPrefix(secret, "svt_") || strings.HasPrefix(secret, "svs_")) {
		return nil, ErrUnauthenticated
	}
	return t.checkKey(ctx, hashSecret(secret))
}

func (t *Tokens) checkKey(ctx context.Context, key string) (*Principal, error) {
	data, err := t.Records.GetRecord(ctx, tokensKind, key)
	if errors.Is(err, store.ErrNoRecord) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, err
	}
	var tok Token
	if err := json.Unmarshal(data, &tok); err != nil {
		return nil, fmt.Errorf("token record %s: %w", key, err)
	}
	if !tok.Expires.IsZero() && !t.now().Before(tok.Expires) {
		_ = t.Records.DeleteRecord(ctx, tokensKind, key)
		return nil, ErrUnauthenticated
	}
	p := &Principal{User: tok.User, Role: tok.Role, Groups: tok.Groups, Eauth: tok.Eauth, Kind: tok.Kind}
	if tok.Kind == "service" {
		p.User, p.Owner = "token:"+tok.Name, tok.User
	}
	return p, nil
}

// Hash is what a credential is known by without being kept: the SHA-256
// of the secret (a watch ticket carries it, to check the stream's
// credential again while it runs).
func Hash(secret string) string { return hashSecret(secret) }

// CheckHash is Check for a credential known by its Hash.
func (t *Tokens) CheckHash(ctx context.Context, hash string) (*Principal, error) {
	if hash == "" {
		return nil, ErrUnauthenticated
	}
	if t.Bootstrap != "" && subtle.ConstantTimeCompare([]byte(hash), []byte(hashSecret(t.Bootstrap))) == 1 {
		return &Principal{User: "bootstrap", Role: Admin, Kind: "bootstrap"}, nil
	}
	if t.Records == nil {
		return nil, ErrUnauthenticated
	}
	return t.checkKey(ctx, hash)
}

var tokenName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CreateService issues a service token; the secret is returned once and
// kept nowhere. ttl 0: it never expires.
func (t *Tokens) CreateService(ctx context.Context, name string, role Role, ttl time.Duration, by string) (string, *Token, error) {
	return t.CreateServiceBy(ctx, name, role, ttl, &Principal{User: by})
}

// CreateServiceBy issues a service token for by: one a person asks for
// never reaches further than they do: its role is at most theirs (checked
// again on every use, so a demotion lowers it), and their Salt ACL bounds
// its changes. The bootstrap token (and tokens it made) make fleet-wide
// tokens.
func (t *Tokens) CreateServiceBy(ctx context.Context, name string, role Role, ttl time.Duration, by *Principal) (string, *Token, error) {
	person := by.Person()
	if person != "" && !by.Role.Allows(role) {
		return "", nil, &FieldError{"role", fmt.Sprintf("role: %s may not make a %s token: a token made by a person has at most their own role (%s); the bootstrap token makes any", by.User, role, by.Role)}
	}
	if !tokenName.MatchString(name) {
		return "", nil, &FieldError{"name", fmt.Sprintf("name: %q is not a token name: lower-case letters, digits and '-', at most 63", name)}
	}
	if strings.HasPrefix(name, "session-") {
		// Sessions are named so: a service token of such a name would
		// make a revocation by name ambiguous.
		return "", nil, &FieldError{"name", fmt.Sprintf("name: %q: names starting with session- are the sessions' (people's logins); choose another", name)}
	}
	if !role.Allows(Viewer) {
		return "", nil, &FieldError{"role", fmt.Sprintf("role: %q is not a role: give viewer, operator or admin", role)}
	}
	if ttl < 0 {
		return "", nil, &FieldError{"expires", fmt.Sprintf("expires: %s is in the past: give a positive duration such as 90d, or none", ttl)}
	}
	all, err := t.List(ctx)
	if err != nil {
		return "", nil, err
	}
	for _, o := range all {
		if o.Kind == "service" && o.Name == name {
			return "", nil, &FieldError{"name", fmt.Sprintf("name: a token named %q exists: revoke it first or choose another name", name)}
		}
	}
	now := t.now().UTC()
	tok := &Token{Name: name, Kind: "service", Role: role, Created: now, CreatedBy: by.User}
	if person != "" {
		tok.User, tok.Eauth = person, by.Eauth
	}
	if ttl > 0 {
		tok.Expires = now.Add(ttl)
	}
	secret, err := t.put(ctx, "svt_", tok)
	return secret, tok, err
}

// CreateSession issues a person's session after the master accepted
// their login.
func (t *Tokens) CreateSession(ctx context.Context, p *Principal, ttl time.Duration) (string, *Token, error) {
	now := t.now().UTC()
	tok := &Token{Kind: "session", User: p.User, Role: p.Role, Groups: p.Groups, Eauth: p.Eauth,
		Created: now, Expires: now.Add(ttl), CreatedBy: p.User}
	secret, err := t.put(ctx, "svs_", tok)
	return secret, tok, err
}

func (t *Tokens) put(ctx context.Context, prefix string, tok *Token) (string, error) {
	secret, err := newSecret(prefix)
	if err != nil {
		return "", err
	}
	tok.hash = hashSecret(secret)
	if tok.Name == "" {
		// A session's name: enough of the hash to tell sessions apart
		// in a listing, nothing that lets anyone in.
		tok.Name = "session-" + tok.hash[:12]
	}
	data, err := json.Marshal(tok)
	if err != nil {
		return "", err
	}
	if err := t.Records.PutRecord(ctx, tokensKind, tok.hash, data); err != nil {
		return "", err
	}
	return secret, nil
}

// List returns every token that has not expired, by name; expired ones
// are deleted on the way.
func (t *Tokens) List(ctx context.Context) ([]*Token, error) {
	if t.Records == nil {
		return nil, nil
	}
	recs, err := t.Records.ListRecords(ctx, tokensKind)
	if err != nil {
		return nil, err
	}
	now := t.now()
	var out []*Token
	for _, r := range recs {
		var tok Token
		if json.Unmarshal(r.Data, &tok) != nil {
			continue
		}
		tok.hash = r.Key
		if !tok.Expires.IsZero() && !now.Before(tok.Expires) {
			_ = t.Records.DeleteRecord(ctx, tokensKind, r.Key)
			continue
		}
		out = append(out, &tok)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ErrNoToken: revoking a name no token has.
var ErrNoToken = errors.New("no such token")

// Revoke deletes the named token (a service token's name, or a session's
// as List shows it); it is refused by every replica from the next request.
func (t *Tokens) Revoke(ctx context.Context, name string) (*Token, error) {
	all, err := t.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, tok := range all {
		if tok.Name == name {
			return tok, t.Records.DeleteRecord(ctx, tokensKind, tok.hash)
		}
	}
	return nil, fmt.Errorf("%w: %q (salt-volumes token list shows them)", ErrNoToken, name)
}

// RevokeSecret ends the session (or token) that secret is: a logout.
func (t *Tokens) RevokeSecret(ctx context.Context, secret string) error {
	if t.Records == nil || secret == "" {
		return nil
	}
	return t.Records.DeleteRecord(ctx, tokensKind, hashSecret(secret))
}

// ParseTTL reads a lifetime: Go's durations (12h, 90m) or whole days
// (90d); "" and "0" mean none.
func ParseTTL(field, s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err == nil && n > 0 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	} else if v, err := time.ParseDuration(s); err == nil && v > 0 {
		return v, nil
	}
	return 0, fmt.Errorf("%s: %q is not a lifetime: write it like 90d, 12h or 30m", field, s)
}

// TokenView is a token as the API lists it: never its secret (kept
// nowhere, shown once in Token when created).
type TokenView struct {
	Name      string     `json:"name"`
	Kind      string     `json:"kind"`
	User      string     `json:"user,omitempty"`
	Role      Role       `json:"role"`
	Groups    []string   `json:"groups,omitempty"`
	Created   time.Time  `json:"created"`
	Expires   *time.Time `json:"expires,omitempty"`
	CreatedBy string     `json:"createdBy,omitempty"`
	Token     string     `json:"token,omitempty"`
}

// ViewToken is t as listed.
func ViewToken(t *Token) TokenView {
	v := TokenView{Name: t.Name, Kind: t.Kind, User: t.User, Role: t.Role, Groups: t.Groups, Created: t.Created, CreatedBy: t.CreatedBy}
	if !t.Expires.IsZero() {
		e := t.Expires
		v.Expires = &e
	}
	return v
}
