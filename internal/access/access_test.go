package access

import (
	"context"
	"path/filepath"
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
	assert.Equal(t, Operator, m.For("alice", nil))
	assert.Equal(t, Admin, m.For("bob", []string{"web", "storage"}), "the highest of the user's and their groups'")
	assert.Equal(t, Viewer, m.For("dave", []string{"web"}))
	assert.Equal(t, Role(""), m.For("mallory", []string{"other"}), "no role: no login")
	m.Default = Viewer
	assert.Equal(t, Viewer, m.For("mallory", nil))
	assert.Equal(t, Operator, m.For("alice", nil), "the default never lowers a role")
}
