// Package kubeauth lets Kubernetes identities use the API in Kubernetes
// mode: a bearer token made for serve's audience is checked with a
// TokenReview, and each action with a SubjectAccessReview on our group's
// resources (volumes, their snapshots subresource, volumesnapshots), so
// that kubectl's RBAC and the REST API agree on who may do what.
package kubeauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/salt-volumes/salt-volumes/internal/access"
)

// Group and the resources SubjectAccessReviews name: the Volume resource
// of deploy/kubernetes/volume-crd.yaml, its snapshots subresource (taking
// a snapshot of a volume), and the VolumeSnapshot resource of
// volumesnapshot-crd.yaml (a snapshot, by the control plane's name).
const (
	Group                = "salt-volumes.io"
	Resource             = "volumes"
	SnapshotResource     = "volumesnapshots"
	SnapshotsSubresource = "snapshots"
)

// DefaultAudience is the audience a token must be made for when the
// config names none: kubectl create token SA --audience salt-volumes.
const DefaultAudience = "salt-volumes"

// cacheTTL: how long an answer of the API server is reused. A revoked
// token or a removed RoleBinding takes effect within it.
const cacheTTL = 10 * time.Second

// maxCached bounds each cache (tokens known, tokens refused, decisions).
const maxCached = 10000

// Limit is a token bucket: TokenReviews a second, and the burst.
type Limit struct {
	PerSecond float64
	Burst     int
}

// Default bounds on TokenReviews of tokens not in the cache (a cached
// token, accepted or refused, costs none for cacheTTL): per client
// address (an IPv6 client's /64), and for all clients together.
var (
	DefaultPerSource = Limit{PerSecond: 5, Burst: 20}
	DefaultGlobal    = Limit{PerSecond: 20, Burst: 50}
	// DefaultPerPrincipal bounds SubjectAccessReviews not in the cache,
	// per Kubernetes identity: a decision is cached per object name, so
	// one identity asking for many names (real or made up) would
	// otherwise make one review per request. A UI page or a CLI command
	// asks a handful.
	DefaultPerPrincipal = Limit{PerSecond: 10, Burst: 50}
)

// maxSources bounds the per-source buckets kept; past it (after dropping
// the idle ones) a new source is throttled until some go idle.
const maxSources = 10000

// ErrThrottled: a token not in the cache, from a source (or with all
// sources together) past its bound on TokenReviews; no TokenReview was
// made. It is an access.ErrUnauthenticated, to be answered 429.
var ErrThrottled = fmt.Errorf("%w: too many new Kubernetes tokens: retry in a second", access.ErrUnauthenticated)

// ErrReviewsThrottled: an identity asked for more decisions not in the
// cache than its bound (PerPrincipal); no SubjectAccessReview was made.
// To be answered 429.
var ErrReviewsThrottled = errors.New("too many distinct requests needing a Kubernetes SubjectAccessReview from this identity: retry in a second")

// RefusedError: the API server did not accept the token for serve's
// audience. It is an access.ErrUnauthenticated; Msg says what to do.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return e.Msg }
func (e *RefusedError) Unwrap() error { return access.ErrUnauthenticated }

// Attributes are what one request asks of RBAC, as a
// SubjectAccessReview's resource attributes in our group (cluster-scoped:
// no namespace).
type Attributes struct {
	Verb        string
	Resource    string
	Subresource string
	// Name of the object; "" for the collection.
	Name string
}

// Target names the resource as kubectl does, and the object if any:
// "volumes.salt-volumes.io/snapshots data-1".
func (a Attributes) Target() string {
	t := a.Resource + "." + Group
	if a.Subresource != "" {
		t += "/" + a.Subresource
	}
	if a.Name != "" {
		t += " " + a.Name
	}
	return t
}

// Reviewer asks the API server.
type Reviewer struct {
	Client kubernetes.Interface
	// Audiences the token must be made for (kubectl create token
	// --audience); empty: DefaultAudience. Never the API server's own: a
	// kubeconfig's token or any pod's would work against serve then.
	Audiences []string
	// PerSource and Global bound TokenReviews of tokens not cached
	// (zero: DefaultPerSource, DefaultGlobal).
	PerSource, Global Limit
	// PerPrincipal bounds SubjectAccessReviews of decisions not cached,
	// per identity (zero: DefaultPerPrincipal).
	PerPrincipal Limit
	Now          func() time.Time

	mu       sync.Mutex
	known    map[[32]byte]cached[*access.Principal]
	refused  map[[32]byte]cached[error]
	inflight map[[32]byte]*call
	sources  map[string]*rate.Limiter
	global   *rate.Limiter
	reviews  map[string]cached[decision]
	askers   map[string]*rate.Limiter
}

type cached[T any] struct {
	v  T
	at time.Time
}

// call is a TokenReview under way, which requests with the same token
// wait for instead of making their own.
type call struct {
	done chan struct{}
	p    *access.Principal
	err  error
}

type decision struct {
	allowed bool
	reason  string
}

func (r *Reviewer) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reviewer) audiences() []string {
	if len(r.Audiences) == 0 {
		return []string{DefaultAudience}
	}
	return r.Audiences
}

// Authenticate checks token with a TokenReview for serve's audience: the
// principal (Kind "kubernetes", User "k8s:<name>", with the user's groups,
// uid and extra) or an access.ErrUnauthenticated (a *RefusedError when the
// token is not for serve's audience, ErrThrottled when source, the
// client's address, or all clients together asked for too many
// TokenReviews of tokens not cached). Answers, refusals included, are
// cached by the token's hash for 10 s.
func (r *Reviewer) Authenticate(ctx context.Context, token, source string) (*access.Principal, error) {
	key := sha256.Sum256([]byte(token))
	now := r.now()
	r.mu.Lock()
	c0, wasKnown := r.known[key]
	if wasKnown && now.Sub(c0.at) < cacheTTL {
		r.mu.Unlock()
		return c0.v, nil
	}
	if c, ok := r.refused[key]; ok && now.Sub(c.at) < cacheTTL {
		r.mu.Unlock()
		return nil, c.v
	}
	if c, ok := r.inflight[key]; ok {
		r.mu.Unlock()
		select {
		case <-c.done:
			return c.p, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// A token that was valid (kept until the cache is full) is checked
	// again unthrottled: a flood does not end its watch streams.
	if !wasKnown && !r.allowReview(source, now) {
		r.mu.Unlock()
		return nil, ErrThrottled
	}
	c := &call{done: make(chan struct{})}
	if r.inflight == nil {
		r.inflight = map[[32]byte]*call{}
	}
	r.inflight[key] = c
	r.mu.Unlock()

	c.p, c.err = r.review(ctx, token)

	r.mu.Lock()
	delete(r.inflight, key)
	switch {
	case c.err == nil:
		r.known = store(r.known, key, c.p, r.now())
	case errors.Is(c.err, access.ErrUnauthenticated):
		delete(r.known, key)
		r.refused = store(r.refused, key, c.err, r.now())
	}
	r.mu.Unlock()
	close(c.done)
	return c.p, c.err
}

// review makes one TokenReview.
func (r *Reviewer) review(ctx context.Context, token string) (*access.Principal, error) {
	auds := r.audiences()
	tr, err := r.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: auds}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubernetes TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		if strings.Contains(tr.Status.Error, "audience") {
			return nil, &RefusedError{Msg: fmt.Sprintf("this Kubernetes token is not made for salt-volumes (audience %s): "+
				"make one with kubectl create token SERVICEACCOUNT --audience %s; a kubeconfig's or a pod's own token is not accepted", auds[0], auds[0])}
		}
		return nil, access.ErrUnauthenticated
	}
	// An API server that ignores the audiences asked for (older than
	// 1.13, or a webhook) answers with none of them.
	if len(tr.Status.Audiences) > 0 && !slices.ContainsFunc(tr.Status.Audiences, func(a string) bool { return slices.Contains(auds, a) }) {
		return nil, &RefusedError{Msg: fmt.Sprintf("this Kubernetes token is valid for %s, not for salt-volumes (audience %s): make one with kubectl create token SERVICEACCOUNT --audience %s",
			strings.Join(tr.Status.Audiences, ", "), auds[0], auds[0])}
	}
	u := tr.Status.User
	p := &access.Principal{User: "k8s:" + u.Username, Groups: u.Groups, Kind: "kubernetes", UID: u.UID}
	if len(u.Extra) > 0 {
		p.Extra = map[string][]string{}
		for k, v := range u.Extra {
			p.Extra[k] = slices.Clone([]string(v))
		}
	}
	return p, nil
}

// allowReview takes a TokenReview from source's bucket and the global
// one, or neither. r.mu is held.
func (r *Reviewer) allowReview(source string, now time.Time) bool {
	per, all := r.PerSource, r.Global
	if per.PerSecond <= 0 {
		per = DefaultPerSource
	}
	if all.PerSecond <= 0 {
		all = DefaultGlobal
	}
	if r.global == nil {
		r.global = rate.NewLimiter(rate.Limit(all.PerSecond), all.Burst)
	}
	if r.sources == nil {
		r.sources = map[string]*rate.Limiter{}
	}
	l := bucket(r.sources, sourceKey(source), per, now)
	if l == nil || l.TokensAt(now) < 1 || r.global.TokensAt(now) < 1 {
		return false
	}
	return l.AllowN(now, 1) && r.global.AllowN(now, 1)
}

// allowAsk takes a SubjectAccessReview from who's bucket. r.mu is held.
func (r *Reviewer) allowAsk(who string, now time.Time) bool {
	per := r.PerPrincipal
	if per.PerSecond <= 0 {
		per = DefaultPerPrincipal
	}
	if r.askers == nil {
		r.askers = map[string]*rate.Limiter{}
	}
	l := bucket(r.askers, who, per, now)
	return l != nil && l.AllowN(now, 1)
}

// bucket returns key's bucket in m, made with per when new; nil when m
// holds maxSources buckets even after dropping those full again (their
// keys asked nothing lately).
func bucket(m map[string]*rate.Limiter, key string, per Limit, now time.Time) *rate.Limiter {
	if l, ok := m[key]; ok {
		return l
	}
	if len(m) >= maxSources {
		for k, b := range m {
			if b.TokensAt(now) >= float64(per.Burst) {
				delete(m, k)
			}
		}
		if len(m) >= maxSources {
			return nil
		}
	}
	l := rate.NewLimiter(rate.Limit(per.PerSecond), per.Burst)
	m[key] = l
	return l
}

// sourceKey: an address, IPv6 ones by their /64 (one host can hold all
// of it).
// SourceKey is what one client is counted as when requests are bounded
// per source: an IPv4 address (an IPv4-mapped IPv6 one unmapped), or an
// IPv6 address's /64, which one host usually holds whole.
func SourceKey(source string) string { return sourceKey(source) }

func sourceKey(source string) string {
	a, err := netip.ParseAddr(source)
	if err != nil {
		return source
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// store caches v under key, dropping the expired entries (all of them
// when none is) once the map holds maxCached.
func store[K comparable, T any](m map[K]cached[T], key K, v T, now time.Time) map[K]cached[T] {
	if m == nil {
		m = map[K]cached[T]{}
	}
	if len(m) >= maxCached {
		for k, c := range m {
			if now.Sub(c.at) >= cacheTTL {
				delete(m, k)
			}
		}
		if len(m) >= maxCached {
			m = map[K]cached[T]{}
		}
	}
	m[key] = cached[T]{v: v, at: now}
	return m
}

// Allowed asks whether p may do what a says with a SubjectAccessReview
// (p's user, groups, uid and extra); the reason is the API server's when
// it gives one.
func (r *Reviewer) Allowed(ctx context.Context, p *access.Principal, a Attributes) (bool, string, error) {
	if p == nil || p.Kind != "kubernetes" {
		return false, "", errors.New("not a Kubernetes identity")
	}
	user := strings.TrimPrefix(p.User, "k8s:")
	var extra map[string]authzv1.ExtraValue
	var b strings.Builder
	for _, s := range []string{user, p.UID, a.Verb, a.Resource, a.Subresource, a.Name} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	b.WriteString(strings.Join(p.Groups, "\x01"))
	if len(p.Extra) > 0 {
		extra = map[string]authzv1.ExtraValue{}
		keys := make([]string, 0, len(p.Extra))
		for k, v := range p.Extra {
			extra[k] = authzv1.ExtraValue(slices.Clone(v))
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b.WriteString("\x00" + k + "\x01" + strings.Join(p.Extra[k], "\x01"))
		}
	}
	key := b.String()
	r.mu.Lock()
	if c, ok := r.reviews[key]; ok && r.now().Sub(c.at) < cacheTTL {
		r.mu.Unlock()
		return c.v.allowed, c.v.reason, nil
	}
	if !r.allowAsk(user+"\x00"+p.UID, r.now()) {
		r.mu.Unlock()
		return false, "", ErrReviewsThrottled
	}
	r.mu.Unlock()
	sar, err := r.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: p.Groups, UID: p.UID, Extra: extra,
			ResourceAttributes: &authzv1.ResourceAttributes{Group: Group, Resource: a.Resource, Subresource: a.Subresource,
				Verb: a.Verb, Name: a.Name}}}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("kubernetes SubjectAccessReview: %w", err)
	}
	d := decision{allowed: sar.Status.Allowed && !sar.Status.Denied, reason: sar.Status.Reason}
	r.mu.Lock()
	r.reviews = store(r.reviews, key, d, r.now())
	r.mu.Unlock()
	return d.allowed, d.reason, nil
}
