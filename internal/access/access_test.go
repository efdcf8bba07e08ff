package access

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

func openRecords(t *testing.T) *store.Bolt {
	s, err := store.Open(filepath.Join(t.TempDir(), "v.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRoles(t *testing.T) {
	assert.True(t, Admin.Allows(Operator))
	assert.True(t, Operator.Allows(Viewer))
	assert.False(t, Viewer.Allows(Operator))
	assert.False(t, Operator.Allows(Admin))
	assert.False(t, Role("root").Allows(Viewer), "an unknown role allows nothing")
	r, err := ParseRole("access.users.alice", " Operator ")
	require.NoError(t, err)
	assert.Equal(t, Operator, r)
	_, err = ParseRole("access.users.alice", "root")
	require.EqualError(t, err, `access.users.alice: "root" is not a role: give viewer, operator or admin`)
}

func TestTokensExpireAndRevoke(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	tk := &Tokens{Records: openRecords(t), Bootstrap: "the-bootstrap-token-0123", Now: func() time.Time { return now }}

	p, err := tk.Check(ctx, "the-bootstrap-token-0123")
	require.NoError(t, err)
	assert.Equal(t, Principal{User: "bootstrap", Role: Admin, Kind: "bootstrap"}, *p)

	short, _, err := tk.CreateService(ctx, "short", Viewer, time.Hour, "bootstrap")
	require.NoError(t, err)
	forever, tok, err := tk.CreateService(ctx, "forever", Operator, 0, "bootstrap")
	require.NoError(t, err)
	assert.True(t, tok.Expires.IsZero())
	p, err = tk.Check(ctx, short)
	require.NoError(t, err)
	assert.Equal(t, "token:short", p.User)
	assert.Equal(t, Viewer, p.Role)

	now = now.Add(time.Hour)
	_, err = tk.Check(ctx, short)
	assert.ErrorIs(t, err, ErrUnauthenticated, "expired at its hour")
	_, err = tk.Check(ctx, forever)
	require.NoError(t, err)
	all, err := tk.List(ctx)
	require.NoError(t, err)
	require.Len(t, all, 1, "the expired one is gone")

	_, err = tk.Check(ctx, forever+"x")
	assert.ErrorIs(t, err, ErrUnauthenticated)
	_, err = tk.Check(ctx, "")
	assert.ErrorIs(t, err, ErrUnauthenticated)
	_, err = tk.Revoke(ctx, "forever")
	require.NoError(t, err)
	_, err = tk.Check(ctx, forever)
	assert.ErrorIs(t, err, ErrUnauthenticated)
	_, err = tk.Revoke(ctx, "forever")
	assert.ErrorIs(t, err, ErrNoToken)

	var fe *FieldError
	_, _, err = tk.CreateService(ctx, "Bad Name", Viewer, 0, "")
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "name", fe.Field)

	// A session: a person's login, with its groups and expiry.
	sec, stok, err := tk.CreateSession(ctx, &Principal{User: "alice", Role: Operator, Groups: []string{"web"}, Eauth: "pam"}, 12*time.Hour)
	require.NoError(t, err)
	assert.Regexp(t, `^session-[0-9a-f]{12}$`, stok.Name)
	p, err = tk.Check(ctx, sec)
	require.NoError(t, err)
	assert.Equal(t, Principal{User: "alice", Role: Operator, Groups: []string{"web"}, Eauth: "pam", Kind: "session"}, *p)
	require.NoError(t, tk.RevokeSecret(ctx, sec))
	_, err = tk.Check(ctx, sec)
	assert.ErrorIs(t, err, ErrUnauthenticated, "logged out")
}

func TestParseTTL(t *testing.T) {
	for in, want := range map[string]time.Duration{"": 0, "0": 0, "90d": 90 * 24 * time.Hour, "12h": 12 * time.Hour, "30m": 30 * time.Minute} {
		got, err := ParseTTL("expires", in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"soon", "-1h", "0d", "1.5d", "d"} {
		_, err := ParseTTL("expires", in)
		require.Error(t, err, in)
		assert.Contains(t, err.Error(), "expires: ", in)
	}
}

func TestAuditBounds(t *testing.T) {
	ctx := context.Background()
	a := &Audit{Records: openRecords(t), MaxEntries: 3, MaxAge: time.Hour}
	old := time.Now().Add(-2 * time.Hour).UTC()
	a.Record(ctx, Entry{Time: old, User: "old", Decision: "allowed"})
	for i := range pruneEvery + 1 {
		a.Record(ctx, Entry{User: "alice", Volume: "v" + string(rune('a'+i%26)), Decision: "allowed"})
	}
	got, err := a.List(ctx, Filter{})
	require.NoError(t, err)
	// Trimmed at the 1st write (the old entry, past maxAge) and the 51st
	// (to the newest 3); the 52nd stays until the next trim.
	assert.Len(t, got, 4)
	for _, e := range got {
		assert.Equal(t, "alice", e.User, "the entry past maxAge went first")
	}
	got, err = a.List(ctx, Filter{Limit: 1})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "v"+string(rune('a'+pruneEvery%26)), got[0].Volume, "the newest")
}

func TestRoleMap(t *testing.T) {
	m := RoleMap{Users: map[string]Role{"alice": Operator, "bob": Viewer}, Groups: map[string]Role{"storage": Admin, "web": Viewer}}
	assert.Equal(t, Operator, m.For("pam", "alice", nil))
	assert.Equal(t, Admin, m.For("pam", "bob", []string{"web", "storage"}), "the highest of the user's and their groups'")
	assert.Equal(t, Viewer, m.For("pam", "dave", []string{"web"}))
	assert.Equal(t, Role(""), m.For("pam", "mallory", []string{"other"}), "no role: no login")
	m.Default = Viewer
	assert.Equal(t, Viewer, m.For("pam", "mallory", nil))
	assert.Equal(t, Operator, m.For("pam", "alice", nil), "the default never lowers a role")
}

// A user entry names a person of the backends logins are taken from, not
// anyone of that name on any backend the master has (an LDAP "admin" is
// not the local admin).
func TestRoleMapKeysByEauth(t *testing.T) {
	m := RoleMap{Users: map[string]Role{"admin": Admin, "ldap:bob": Operator}, Groups: map[string]Role{"ldap:storage": Admin}}
	assert.Equal(t, []string{"pam"}, m.Backends(), "the default list is explicit: pam")
	assert.Equal(t, Admin, m.For("pam", "admin", nil))
	assert.Equal(t, Role(""), m.For("ldap", "admin", nil), "ldap is not a backend logins are taken from")
	assert.Equal(t, Role(""), m.For("file", "admin", nil))
	m.Eauth = []string{"pam", "ldap"}
	assert.Equal(t, Admin, m.For("ldap", "admin", nil), "a bare name is for every listed backend")
	assert.Equal(t, Operator, m.For("ldap", "bob", nil))
	assert.Equal(t, Role(""), m.For("pam", "bob", nil), "ldap:bob is not pam's bob")
	assert.Equal(t, Admin, m.For("ldap", "carol", []string{"storage"}))
	assert.Equal(t, Role(""), m.For("pam", "carol", []string{"storage"}), "ldap:storage is not pam's group")
	m.Users["pam:root"] = Admin
	assert.Equal(t, Role(""), m.For("ldap", "pam:root", nil), "an LDAP user named pam:root is not PAM's root")
	assert.Equal(t, Admin, m.For("pam", "root", nil))
}

// A token a person makes never reaches further than they do.
func TestTokensOfAPersonAreBoundByThem(t *testing.T) {
	ctx := context.Background()
	tk := &Tokens{Records: openRecords(t), Bootstrap: "the-bootstrap-token-0123"}
	alice := &Principal{User: "alice", Role: Operator, Eauth: "pam", Kind: "session"}
	_, _, err := tk.CreateServiceBy(ctx, "too-much", Admin, 0, alice)
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "role", fe.Field)
	assert.Contains(t, fe.Msg, "at most their own role (operator)")
	sec, tok, err := tk.CreateServiceBy(ctx, "ci", Operator, 0, alice)
	require.NoError(t, err)
	assert.Equal(t, "alice", tok.User)
	p, err := tk.Check(ctx, sec)
	require.NoError(t, err)
	assert.Equal(t, "token:ci", p.User)
	assert.Equal(t, "alice", p.Person(), "alice's ACL and role bound it")
	assert.Equal(t, "pam", p.Eauth)
	p2, err := tk.CheckHash(ctx, Hash(sec))
	require.NoError(t, err)
	assert.Equal(t, p, p2)
	boot, err := tk.Check(ctx, "the-bootstrap-token-0123")
	require.NoError(t, err)
	sec, _, err = tk.CreateServiceBy(ctx, "fleet", Admin, 0, boot)
	require.NoError(t, err)
	p, err = tk.Check(ctx, sec)
	require.NoError(t, err)
	assert.Equal(t, "", p.Person(), "the bootstrap token makes fleet-wide tokens")
	assert.Equal(t, Operator, Lower(Admin, Operator))
	assert.Equal(t, Viewer, Lower(Viewer, Admin))
	assert.Equal(t, Role(""), Lower(Viewer, ""))
}

// Refusals are kept apart from the changes: a flood of them never pushes
// a change out, repeats are one entry with a count, and no entry is
// larger than its bounds whatever the request carried.
func TestRefusalsCannotEvictChanges(t *testing.T) {
	ctx := context.Background()
	a := &Audit{Records: openRecords(t), MaxEntries: 100}
	a.Record(ctx, Entry{User: "alice", Method: "POST", Route: "/api/v1/volumes", Volume: "db", Decision: "allowed", Status: 201})
	for i := range 6000 {
		a.Record(ctx, Entry{User: "token:viewer", Source: "10.0.0.9", Method: "DELETE", Route: "/api/v1/volumes/db", Decision: "refused", Status: 403})
		if i%1000 == 0 {
			// and from ever new routes, as a flood would
			a.Record(ctx, Entry{User: "token:viewer", Source: "10.0.0.9", Method: "DELETE", Route: "/api/v1/volumes/x" + strings.Repeat("y", 70000) + string(rune('a'+i/1000)), Decision: "refused", Status: 403})
		}
	}
	for i := range 300 {
		a.Record(ctx, Entry{User: "token:viewer", Source: "10.0.0.9", Method: "DELETE", Route: fmt.Sprintf("/api/v1/volumes/v%d", i), Decision: "refused", Status: 403})
	}
	all, err := a.List(ctx, Filter{})
	require.NoError(t, err)
	var changes, refusals, counted int
	for _, e := range all {
		assert.LessOrEqual(t, len(e.Route), maxField+len("…(cut)"))
		if e.Decision == "allowed" {
			changes++
			assert.Equal(t, "alice", e.User)
			continue
		}
		refusals++
		counted += e.Count
	}
	assert.Equal(t, 1, changes, "alice's create is still there")
	assert.LessOrEqual(t, refusals, 100+pruneEvery, "refusals within their own bound")
	got, err := a.List(ctx, Filter{User: "token:viewer"})
	require.NoError(t, err)
	var same *Entry
	for i := range got {
		if got[i].Route == "/api/v1/volumes/db" {
			same = &got[i]
		}
	}
	require.NotNil(t, same, "the repeated refusal is one entry")
	assert.Equal(t, 6000, same.Count)
	require.NotNil(t, same.Last)
}
