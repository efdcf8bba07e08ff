// Package kubeauth lets Kubernetes identities use the API in Kubernetes
// mode: a bearer token is checked with a TokenReview, and each action with
// a SubjectAccessReview on the Volume resource, so that kubectl's RBAC and
// the REST API agree on who may do what.
package kubeauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/salt-volumes/salt-volumes/internal/access"
)

// Group and Resource are what SubjectAccessReviews name: the Volume
// resource of deploy/kubernetes/volume-crd.yaml.
const (
	Group    = "salt-volumes.io"
	Resource = "volumes"
)

// cacheTTL: how long an answer of the API server is reused. A revoked
// token or a removed RoleBinding takes effect within it.
const cacheTTL = 10 * time.Second

// Reviewer asks the API server.
type Reviewer struct {
	Client kubernetes.Interface
	// Audiences the token must be for (empty: the API server's own).
	Audiences []string
	Now       func() time.Time

	mu      sync.Mutex
	tokens  map[[32]byte]cached[*access.Principal]
	reviews map[string]cached[decision]
}

type cached[T any] struct {
	v  T
	at time.Time
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

// Authenticate checks token with a TokenReview: the principal (Kind
// "kubernetes", User "k8s:<name>") or access.ErrUnauthenticated.
func (r *Reviewer) Authenticate(ctx context.Context, token string) (*access.Principal, error) {
	key := sha256.Sum256([]byte(token))
	r.mu.Lock()
	if c, ok := r.tokens[key]; ok && r.now().Sub(c.at) < cacheTTL {
		r.mu.Unlock()
		if c.v == nil {
			return nil, access.ErrUnauthenticated
		}
		return c.v, nil
	}
	r.mu.Unlock()
	tr, err := r.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: r.Audiences}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubernetes TokenReview: %w", err)
	}
	var p *access.Principal
	if tr.Status.Authenticated {
		u := tr.Status.User
		p = &access.Principal{User: "k8s:" + u.Username, Groups: u.Groups, Kind: "kubernetes", UID: u.UID}
	}
	r.mu.Lock()
	if r.tokens == nil || len(r.tokens) > 10000 {
		r.tokens = map[[32]byte]cached[*access.Principal]{}
	}
	r.tokens[key] = cached[*access.Principal]{v: p, at: r.now()}
	r.mu.Unlock()
	if p == nil {
		return nil, access.ErrUnauthenticated
	}
	return p, nil
}

// Allowed asks whether p may do verb on the Volume name ("" for the
// collection) with a SubjectAccessReview; the reason is the API server's
// when it gives one.
func (r *Reviewer) Allowed(ctx context.Context, p *access.Principal, verb, name string) (bool, string, error) {
	if p == nil || p.Kind != "kubernetes" {
		return false, "", errors.New("not a Kubernetes identity")
	}
	user := strings.TrimPrefix(p.User, "k8s:")
	key := user + "\x00" + strings.Join(p.Groups, ",") + "\x00" + verb + "\x00" + name
	r.mu.Lock()
	if c, ok := r.reviews[key]; ok && r.now().Sub(c.at) < cacheTTL {
		r.mu.Unlock()
		return c.v.allowed, c.v.reason, nil
	}
	r.mu.Unlock()
	sar, err := r.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: p.Groups, UID: p.UID,
			ResourceAttributes: &authzv1.ResourceAttributes{Group: Group, Resource: Resource, Verb: verb, Name: name}}}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("kubernetes SubjectAccessReview: %w", err)
	}
	d := decision{allowed: sar.Status.Allowed && !sar.Status.Denied, reason: sar.Status.Reason}
	r.mu.Lock()
	if r.reviews == nil || len(r.reviews) > 10000 {
		r.reviews = map[string]cached[decision]{}
	}
	r.reviews[key] = cached[decision]{v: d, at: r.now()}
	r.mu.Unlock()
	return d.allowed, d.reason, nil
}
