package kubeauth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/salt-volumes/salt-volumes/internal/access"
)

// apiServer is a fake API server: it knows the tokens in good (made for
// the audience salt-volumes) and in plain (made for the API server
// itself), and counts the reviews it is asked for.
type apiServer struct {
	cs          *fake.Clientset
	tokenRevs   atomic.Int64
	accessRevs  atomic.Int64
	mu          sync.Mutex
	lastReview  authnv1.TokenReviewSpec
	lastAccess  authzv1.SubjectAccessReviewSpec
	allow       func(authzv1.SubjectAccessReviewSpec) bool
	good, plain map[string]authnv1.UserInfo
}

func newAPIServer() *apiServer {
	a := &apiServer{cs: fake.NewClientset(), good: map[string]authnv1.UserInfo{}, plain: map[string]authnv1.UserInfo{}}
	a.cs.PrependReactor("create", "tokenreviews", func(act k8stesting.Action) (bool, runtime.Object, error) {
		a.tokenRevs.Add(1)
		tr := act.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		a.mu.Lock()
		a.lastReview = tr.Spec
		a.mu.Unlock()
		out := tr.DeepCopy()
		if u, ok := a.good[tr.Spec.Token]; ok && contains(tr.Spec.Audiences, "salt-volumes") {
			out.Status = authnv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: []string{"salt-volumes"}}
		} else if _, ok := a.plain[tr.Spec.Token]; ok && len(tr.Spec.Audiences) > 0 {
			// What kube-apiserver answers for a token of its own
			// audience asked for another.
			out.Status = authnv1.TokenReviewStatus{Error: fmt.Sprintf(`[invalid bearer token, token audiences ["https://kubernetes.default.svc.cluster.local"] is invalid for the target audiences %q]`, tr.Spec.Audiences)}
		} else if ok {
			out.Status = authnv1.TokenReviewStatus{Authenticated: true, User: u}
		} else {
			out.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, out, nil
	})
	a.cs.PrependReactor("create", "subjectaccessreviews", func(act k8stesting.Action) (bool, runtime.Object, error) {
		a.accessRevs.Add(1)
		sar := act.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview)
		a.mu.Lock()
		a.lastAccess = sar.Spec
		allow := a.allow
		a.mu.Unlock()
		out := sar.DeepCopy()
		out.Status.Allowed = allow != nil && allow(sar.Spec)
		if !out.Status.Allowed {
			out.Status.Reason = "no RBAC policy matched"
		}
		return true, out, nil
	})
	return a
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "eyJ" + hex.EncodeToString(b)
}

// A flood of 10,000 random bearer tokens costs the API server a bounded
// number of TokenReviews: the source's burst when it all comes at once
// from one address, the global burst from 10,000 addresses, and the
// buckets' rates on top while it lasts. A known token keeps working
// meanwhile, and a refused one is not asked again.
func TestFloodOfRandomTokensIsBounded(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// step: the clock's advance between two requests.
		step    time.Duration
		sources int
		max     int64
	}{
		{"at once, one address", 0, 1, int64(DefaultPerSource.Burst)},
		{"at once, 10,000 addresses", 0, 10000, int64(DefaultGlobal.Burst)},
		{"over 10 s, one address", time.Millisecond, 1, int64(DefaultPerSource.Burst) + int64(10*DefaultPerSource.PerSecond)},
		{"over 10 s, 10,000 addresses", time.Millisecond, 10000, int64(DefaultGlobal.Burst) + int64(10*DefaultGlobal.PerSecond)},
		{"over 10 s, one IPv6 /64", time.Millisecond, -1, int64(DefaultPerSource.Burst) + int64(10*DefaultPerSource.PerSecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPIServer()
			a.good["known"] = authnv1.UserInfo{Username: "system:serviceaccount:ci:deploy"}
			c := &clock{t: time.Unix(1_800_000_000, 0)}
			r := &Reviewer{Client: a.cs, Now: c.now}
			_, err := r.Authenticate(ctx, "known", "10.1.1.1")
			require.NoError(t, err)
			a.tokenRevs.Store(0)
			throttled := 0
			for i := range 10000 {
				src := "192.0.2.7"
				switch {
				case tc.sources > 1:
					src = fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)
				case tc.sources < 0:
					src = fmt.Sprintf("2001:db8::%x", i+1)
				}
				_, err := r.Authenticate(ctx, randomToken(), src)
				require.ErrorIs(t, err, access.ErrUnauthenticated)
				if errors.Is(err, ErrThrottled) {
					throttled++
				}
				c.t = c.t.Add(tc.step)
				if i%1000 == 0 && c.t.Sub(time.Unix(1_800_000_000, 0)) < cacheTTL {
					p, err := r.Authenticate(ctx, "known", "10.1.1.1")
					require.NoError(t, err, "a known token works during the flood (cached)")
					assert.Equal(t, "k8s:system:serviceaccount:ci:deploy", p.User)
				}
			}
			n := a.tokenRevs.Load()
			t.Logf("%s: %d TokenReviews for 10,000 random tokens (%d throttled)", tc.name, n, throttled)
			assert.LessOrEqual(t, n, tc.max)
			assert.Positive(t, n)
			assert.Equal(t, int64(10000), n+int64(throttled))
		})
	}

	t.Run("the same refused token again costs nothing for 10 s", func(t *testing.T) {
		a := newAPIServer()
		c := &clock{t: time.Unix(1_800_000_000, 0)}
		r := &Reviewer{Client: a.cs, Now: c.now}
		for range 1000 {
			_, err := r.Authenticate(ctx, "not-a-token", "192.0.2.7")
			require.ErrorIs(t, err, access.ErrUnauthenticated)
			require.NotErrorIs(t, err, ErrThrottled)
		}
		assert.Equal(t, int64(1), a.tokenRevs.Load())
		c.t = c.t.Add(cacheTTL)
		_, _ = r.Authenticate(ctx, "not-a-token", "192.0.2.7")
		assert.Equal(t, int64(2), a.tokenRevs.Load())
	})

	t.Run("one token used by many requests at once: one TokenReview", func(t *testing.T) {
		a := newAPIServer()
		a.good["fresh"] = authnv1.UserInfo{Username: "alice"}
		r := &Reviewer{Client: a.cs}
		var wg sync.WaitGroup
		for range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := r.Authenticate(ctx, "fresh", "192.0.2.7")
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
		assert.LessOrEqual(t, a.tokenRevs.Load(), int64(DefaultPerSource.Burst), "not throttled")
	})
}

// Only tokens made for serve's audience are taken: a token of the API
// server's own (a kubeconfig's, any pod's) is refused, saying how to make
// one.
func TestAudience(t *testing.T) {
	ctx := context.Background()
	a := newAPIServer()
	a.good["for-us"] = authnv1.UserInfo{Username: "system:serviceaccount:ci:deploy", UID: "u-1"}
	a.plain["pods-own"] = authnv1.UserInfo{Username: "system:serviceaccount:default:default"}
	r := &Reviewer{Client: a.cs}

	p, err := r.Authenticate(ctx, "for-us", "192.0.2.7")
	require.NoError(t, err)
	assert.Equal(t, "k8s:system:serviceaccount:ci:deploy", p.User)
	assert.Equal(t, []string{"salt-volumes"}, a.lastReview.Audiences, "the default audience is asked for")

	_, err = r.Authenticate(ctx, "pods-own", "192.0.2.7")
	require.ErrorIs(t, err, access.ErrUnauthenticated)
	var re *RefusedError
	require.ErrorAs(t, err, &re)
	assert.Contains(t, re.Msg, "kubectl create token SERVICEACCOUNT --audience salt-volumes")

	// An API server that answers without checking the audience.
	a2 := newAPIServer()
	a2.cs.PrependReactor("create", "tokenreviews", func(act k8stesting.Action) (bool, runtime.Object, error) {
		out := act.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		out.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "x"},
			Audiences: []string{"https://kubernetes.default.svc.cluster.local"}}
		return true, out, nil
	})
	_, err = (&Reviewer{Client: a2.cs}).Authenticate(ctx, "pods-own", "192.0.2.7")
	require.ErrorAs(t, err, &re)
	assert.Contains(t, re.Msg, "not for salt-volumes")

	// Audiences from the config.
	a3 := newAPIServer()
	_, _ = (&Reviewer{Client: a3.cs, Audiences: []string{"storage.example.com"}}).Authenticate(ctx, "t", "192.0.2.7")
	assert.Equal(t, []string{"storage.example.com"}, a3.lastReview.Audiences)
}

// A SubjectAccessReview carries the identity whole (groups, uid, extra)
// and the request's attributes; answers are cached per identity and
// attributes.
func TestAllowedAttributes(t *testing.T) {
	ctx := context.Background()
	a := newAPIServer()
	extra := map[string]authnv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"ci-7"}, "authentication.kubernetes.io/credential-id": {"JTI=abc"}}
	a.good["t"] = authnv1.UserInfo{Username: "system:serviceaccount:ci:deploy", UID: "u-1", Groups: []string{"system:serviceaccounts"}, Extra: extra}
	a.allow = func(s authzv1.SubjectAccessReviewSpec) bool {
		ra := s.ResourceAttributes
		return ra.Verb == "create" && ra.Resource == "volumes" && ra.Subresource == "snapshots" && ra.Name == "data-1" &&
			s.Extra["authentication.kubernetes.io/pod-name"][0] == "ci-7"
	}
	r := &Reviewer{Client: a.cs}
	p, err := r.Authenticate(ctx, "t", "192.0.2.7")
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"authentication.kubernetes.io/pod-name": {"ci-7"}, "authentication.kubernetes.io/credential-id": {"JTI=abc"}}, p.Extra)

	take := Attributes{Verb: "create", Resource: Resource, Subresource: SnapshotsSubresource, Name: "data-1"}
	ok, _, err := r.Allowed(ctx, p, take)
	require.NoError(t, err)
	assert.True(t, ok)
	s := a.lastAccess
	assert.Equal(t, "system:serviceaccount:ci:deploy", s.User)
	assert.Equal(t, "u-1", s.UID)
	assert.Equal(t, []string{"system:serviceaccounts"}, s.Groups)
	assert.Equal(t, authzv1.ExtraValue{"ci-7"}, s.Extra["authentication.kubernetes.io/pod-name"])
	assert.Equal(t, authzv1.ResourceAttributes{Group: "salt-volumes.io", Resource: "volumes", Subresource: "snapshots", Verb: "create", Name: "data-1"}, *s.ResourceAttributes)
	assert.Equal(t, "volumes.salt-volumes.io/snapshots data-1", take.Target())

	// A get on the same name, another resource, another name: each its
	// own review; the same again: cached.
	for _, at := range []Attributes{
		{Verb: "get", Resource: Resource, Name: "data-1"},
		{Verb: "create", Resource: Resource, Name: "data-1"},
		{Verb: "create", Resource: Resource, Subresource: SnapshotsSubresource, Name: "data-2"},
		{Verb: "delete", Resource: SnapshotResource, Name: "data-1"},
	} {
		ok, reason, err := r.Allowed(ctx, p, at)
		require.NoError(t, err)
		assert.False(t, ok, at)
		assert.Equal(t, "no RBAC policy matched", reason)
	}
	assert.Equal(t, int64(5), a.accessRevs.Load())
	ok, _, _ = r.Allowed(ctx, p, take)
	assert.True(t, ok)
	assert.Equal(t, int64(5), a.accessRevs.Load(), "cached")

	// The same user with other extra attributes is asked anew.
	q := *p
	q.Extra = map[string][]string{"authentication.kubernetes.io/pod-name": {"other"}}
	ok, _, _ = r.Allowed(ctx, &q, take)
	assert.False(t, ok)
	assert.Equal(t, int64(6), a.accessRevs.Load())

	_, _, err = r.Allowed(ctx, &access.Principal{User: "bootstrap", Kind: "bootstrap"}, take)
	assert.Error(t, err)
}

func TestSourceKey(t *testing.T) {
	assert.Equal(t, "192.0.2.7", sourceKey("192.0.2.7"))
	assert.Equal(t, "192.0.2.7", sourceKey("::ffff:192.0.2.7"))
	assert.Equal(t, "2001:db8::/64", sourceKey("2001:db8::1"))
	assert.Equal(t, sourceKey("2001:db8::ffff:1"), sourceKey("2001:db8::2"))
	assert.Equal(t, "@", sourceKey("@"))
}

// A token that was valid is checked again when its cache entry expires
// even while new tokens are throttled: a flood does not cut off those in
// use (their watch streams recheck them).
func TestKnownTokensAreNotThrottled(t *testing.T) {
	ctx := context.Background()
	a := newAPIServer()
	a.good["known"] = authnv1.UserInfo{Username: "alice"}
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	r := &Reviewer{Client: a.cs, Now: c.now, Global: Limit{PerSecond: 0.001, Burst: 1}}
	_, err := r.Authenticate(ctx, "known", "192.0.2.7")
	require.NoError(t, err)
	_, err = r.Authenticate(ctx, randomToken(), "192.0.2.8")
	require.ErrorIs(t, err, ErrThrottled)
	c.t = c.t.Add(cacheTTL)
	_, err = r.Authenticate(ctx, "known", "")
	require.NoError(t, err)
	assert.Equal(t, int64(2), a.tokenRevs.Load())
	_, err = r.Authenticate(ctx, randomToken(), "192.0.2.8")
	require.ErrorIs(t, err, ErrThrottled)

	// Revoked: refused, and then it is a new token again.
	delete(a.good, "known")
	c.t = c.t.Add(cacheTTL)
	_, err = r.Authenticate(ctx, "known", "")
	require.ErrorIs(t, err, access.ErrUnauthenticated)
	require.NotErrorIs(t, err, ErrThrottled)
	c.t = c.t.Add(cacheTTL)
	_, err = r.Authenticate(ctx, "known", "")
	require.ErrorIs(t, err, ErrThrottled)
}

// #48: one identity asking for many object names (a decision is cached
// per name) makes at most its bucket of SubjectAccessReviews; past it,
// ErrReviewsThrottled and no review, while another identity and the
// decisions already cached still answer.
func TestReviewsAreBoundedPerIdentity(t *testing.T) {
	ctx := context.Background()
	a := newAPIServer()
	a.good["mallory"] = authnv1.UserInfo{Username: "mallory", UID: "m-1"}
	a.good["alice"] = authnv1.UserInfo{Username: "alice", UID: "a-1"}
	now := time.Unix(1_800_000_000, 0)
	r := &Reviewer{Client: a.cs, PerPrincipal: Limit{PerSecond: 1, Burst: 5}, Now: func() time.Time { return now }}
	m, err := r.Authenticate(ctx, "mallory", "192.0.2.7")
	require.NoError(t, err)
	al, err := r.Authenticate(ctx, "alice", "192.0.2.8")
	require.NoError(t, err)
	first := Attributes{Verb: "get", Resource: Resource, Name: "v-0"}
	throttled := 0
	for i := range 100 {
		_, _, err := r.Allowed(ctx, m, Attributes{Verb: "get", Resource: Resource, Name: fmt.Sprintf("v-%d", i)})
		if errors.Is(err, ErrReviewsThrottled) {
			throttled++
		} else {
			require.NoError(t, err)
		}
	}
	assert.Equal(t, int64(5), a.accessRevs.Load(), "the burst, then nothing")
	assert.Equal(t, 95, throttled)
	_, _, err = r.Allowed(ctx, m, first)
	assert.NoError(t, err, "a decision already made is answered from the cache")
	_, _, err = r.Allowed(ctx, al, first)
	assert.NoError(t, err, "another identity has its own bucket")
	now = now.Add(2 * time.Second)
	_, _, err = r.Allowed(ctx, m, Attributes{Verb: "get", Resource: Resource, Name: "later"})
	assert.NoError(t, err, "the bucket refills")
}
