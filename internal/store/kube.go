package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// KubeConfig says how the Kubernetes backend reaches the API server.
type KubeConfig struct {
	Client dynamic.Interface
	// RequestTimeout bounds one request (default 10s).
	RequestTimeout time.Duration
	Log            *slog.Logger
}

// Kube keeps each volume as a Volume object (salt-volumes.io/v1alpha1,
// cluster-scoped) in the Kubernetes API server, i.e. in the cluster's
// etcd: kubectl, GitOps and RBAC work on the same objects as the REST API.
//
// The spec is the object's spec; the status goes through the status
// subresource: fields for people (phase, conditions, printer columns) and,
// under status.record, the control plane's own bookkeeping. A Revision is
// the object's resourceVersion; every write names the one it read.
// Volumes carry our finalizer from their first write on, so a kubectl
// delete only marks them (DeleteRequested, DeletionMarked); Delete lets
// the object go once the storage is reclaimed.
//
// The API server has no transaction spanning two objects: a uuid given
// explicitly is checked against the cache, not reserved in the same step
// as the name (the uuid defaults to metadata.uid, unique by construction).
type Kube struct {
	api     dynamic.ResourceInterface
	timeout time.Duration
	log     *slog.Logger
	stop    context.CancelFunc
	done    chan struct{}

	// createMu orders this replica's creates: the uuid check and the
	// create are one step here (not across replicas).
	createMu sync.Mutex

	revCache // objs, creating and deleting are under its lock too
	// objs holds each volume's object as last read, for writes that send
	// the whole object (the status subresource's update).
	objs map[string]*unstructured.Unstructured
	// creating and deleting name the volumes this replica is writing in
	// two steps: the watch's view of the step between (an object without
	// its status, one without our finalizer) is not a change of the
	// volume and is kept from the cache and its watchers.
	creating, deleting map[string]bool
	// Skipped lists objects that could not be read (reported, left alone).
	Skipped []string
}

// OpenKube lists every Volume object and starts the watch.
func OpenKube(ctx context.Context, cfg KubeConfig) (*Kube, error) {
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Kube{api: cfg.Client.Resource(VolumeResource), timeout: cfg.RequestTimeout, log: cfg.Log,
		revCache: newRevCache(), objs: map[string]*unstructured.Unstructured{},
		creating: map[string]bool{}, deleting: map[string]bool{}, done: make(chan struct{})}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	rv, err := s.relist(lctx)
	cancel()
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go s.watch(wctx, rv)
	return s, nil
}

// Close stops the watch.
func (s *Kube) Close() error {
	s.stop()
	<-s.done
	return nil
}

func kubeUnavailable(what string, err error) error {
	return fmt.Errorf("%s: %w: %v", what, ErrUnavailable, err)
}

// relist reads every Volume and makes the cache say the same. Returns the
// list's resourceVersion, where the watch goes on.
func (s *Kube) relist(ctx context.Context) (string, error) {
	list, err := s.api.List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("listing Volume objects: the Volume resource is not installed: kubectl apply -f deploy/kubernetes/volume-crd.yaml")
		}
		return "", kubeUnavailable("listing Volume objects", err)
	}
	rev, err := revisionOf(list.GetResourceVersion())
	if err != nil {
		return "", err
	}
	fresh := map[string]*volume.Volume{}
	objs := map[string]*unstructured.Unstructured{}
	var skipped []string
	for i := range list.Items {
		u := &list.Items[i]
		v, err := volumeFromObject(u)
		if err != nil {
			skipped = append(skipped, err.Error())
			continue
		}
		fresh[u.GetName()], objs[u.GetName()] = v, u
	}
	s.mu.Lock()
	defer s.unlockAndSend()
	s.Skipped = skipped
	s.resync(fresh, rev, func(v *volume.Volume) { s.apply(objs[v.Spec.Name], v) }, func(name string) { s.remove(name, rev) })
	return list.GetResourceVersion(), nil
}

// apply takes an object into the shared revisioned cache, unless this
// replica is between the two steps of its own write of it (the caller
// holds mu).
func (s *Kube) apply(u *unstructured.Unstructured, v *volume.Volume) {
	name := v.Spec.Name
	if s.deleting[name] || (s.creating[name] && !hasRecord(u)) {
		return
	}
	if s.put(v, string(u.GetUID())) {
		s.objs[name] = u
	}
}

// remove drops name and its object (the caller holds mu).
func (s *Kube) remove(name string, rev int64) {
	var uid string
	if u := s.objs[name]; u != nil {
		uid = string(u.GetUID())
	}
	if s.drop(name, rev, uid) {
		delete(s.objs, name)
	}
}

// watch follows the Volume objects from rv; an expired resourceVersion
// (410 Gone) or a broken stream re-lists and carries on.
func (s *Kube) watch(ctx context.Context, rv string) {
	defer close(s.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		w, err := s.api.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err == nil {
			rv, err = s.follow(ctx, w)
			w.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			continue // the server closed the stream (its timeout): go on from rv
		}
		s.log.Warn("Volume watch ended; listing again", "error", err)
		for ctx.Err() == nil {
			lctx, c := context.WithTimeout(ctx, s.timeout)
			r, lerr := s.relist(lctx)
			c()
			if lerr == nil {
				rv = r
				backoff = 100 * time.Millisecond
				break
			}
			s.log.Warn("listing Volume objects failed; retrying", "error", lerr, "in", backoff)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

// follow applies a watch's events until it ends; it returns the last
// resourceVersion seen, and an error when the stream must be given up
// (the caller lists again).
func (s *Kube) follow(ctx context.Context, w watch.Interface) (string, error) {
	var last string
	for {
		select {
		case <-ctx.Done():
			return last, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				if last == "" {
					return "", errors.New("the watch closed before its first event")
				}
				return last, nil
			}
			if ev.Type == watch.Error {
				return "", apierrors.FromObject(ev.Object)
			}
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				return "", fmt.Errorf("the watch sent a %T", ev.Object)
			}
			rv := u.GetResourceVersion()
			rev, err := revisionOf(rv)
			if err != nil {
				return "", err
			}
			last = rv
			s.mu.Lock()
			switch ev.Type {
			case watch.Bookmark:
			case watch.Deleted:
				s.remove(u.GetName(), rev)
			default:
				v, err := volumeFromObject(u)
				if err != nil {
					s.log.Error("a Volume object cannot be read; it is not managed until it is fixed", "volume", u.GetName(), "error", err)
				} else {
					s.apply(u, v)
				}
			}
			s.advance(rev)
			s.unlockAndSend()
		}
	}
}

// CatchUp lists every Volume afresh (a quorum read) into the cache: a new
// leader does so before reconciling, to act on everything its predecessor
// wrote.
func (s *Kube) CatchUp(ctx context.Context) error {
	_, err := s.relist(ctx)
	return err
}

// object returns the cached object of name (nil when there is none).
func (s *Kube) object(name string) *unstructured.Unstructured {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.objs[name]
}

// mark sets or clears name in one of the in-flight sets.
func (s *Kube) mark(set map[string]bool, name string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		set[name] = true
	} else {
		delete(set, name)
	}
}

// Held reports whether the volume's object carries our finalizer.
func (s *Kube) Held(name string) bool {
	u := s.object(name)
	return u != nil && hasFinalizer(u)
}

// wrote puts the result of our own write in the cache at once, so that
// this replica reads back what it wrote.
func (s *Kube) wrote(u *unstructured.Unstructured) (*volume.Volume, error) {
	v, err := volumeFromObject(u)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.apply(u, v)
	s.unlockAndSend()
	return v, nil
}
