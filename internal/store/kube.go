package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/salt-volumes/salt-volumes/internal/spec"
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

	cached // objs, tombs, seen and moved are under its lock too
	// objs holds each volume's object as last read, for writes that send
	// the whole object (the status subresource's update).
	objs  map[string]*unstructured.Unstructured
	tombs map[string]int64
	// creating and deleting name the volumes this replica is writing in
	// two steps: the watch's view of the step between (an object without
	// its status, one without our finalizer) is not a change of the
	// volume and is kept from the cache and its watchers.
	creating, deleting map[string]bool
	seen               int64
	moved              chan struct{}
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
		cached: cached{vols: map[string]*volume.Volume{}}, objs: map[string]*unstructured.Unstructured{},
		tombs: map[string]int64{}, creating: map[string]bool{}, deleting: map[string]bool{},
		moved: make(chan struct{}), done: make(chan struct{})}
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
	for name := range s.vols {
		if _, ok := fresh[name]; !ok {
			s.remove(name, rev)
		}
	}
	for name, v := range fresh {
		s.apply(objs[name], v)
	}
	s.advance(rev)
	return list.GetResourceVersion(), nil
}

// apply takes an object unless the cache holds it at that revision or
// later (the caller holds mu).
func (s *Kube) apply(u *unstructured.Unstructured, v *volume.Volume) {
	name := v.Spec.Name
	cur := s.vols[name]
	if (cur != nil && cur.Revision >= v.Revision) || s.tombs[name] >= v.Revision ||
		s.deleting[name] || (s.creating[name] && !hasRecord(u)) {
		return
	}
	s.vols[name], s.objs[name] = v, u
	typ := Added
	if cur != nil {
		typ = Modified
	}
	s.queue(Event{Type: typ, Volume: v, Prev: cur, UID: string(u.GetUID())})
}

func (s *Kube) remove(name string, rev int64) {
	cur := s.vols[name]
	if cur == nil || cur.Revision >= rev {
		return
	}
	var uid string
	if u := s.objs[name]; u != nil {
		uid = string(u.GetUID())
	}
	delete(s.vols, name)
	delete(s.objs, name)
	gone := cur.Clone()
	gone.Revision = rev
	s.queue(Event{Type: Deleted, Volume: gone, Prev: cur, UID: uid})
}

func (s *Kube) advance(rev int64) {
	if rev <= s.seen {
		return
	}
	s.seen = rev
	for name, r := range s.tombs {
		if r <= rev {
			delete(s.tombs, name)
		}
	}
	close(s.moved)
	s.moved = make(chan struct{})
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

// Create makes the object, then writes its status. A uuid given is
// checked against the volumes this replica knows.
func (s *Kube) Create(v *volume.Volume) error { return s.create(v, nil) }

// Update writes v's status (and our finalizer, if the object lacks it)
// if the object is still at v.Revision.
func (s *Kube) Update(v *volume.Volume) error { return s.update(v, nil) }

// Delete lets the object go (our finalizer removed, then deleted if no
// one had) if it is still at v.Revision.
func (s *Kube) Delete(v *volume.Volume) error { return s.delete(v, nil) }

// Fenced returns a writer that asks still() before every write: once it
// returns an error, the writer writes nothing more (ErrFenced). The
// API server has no transaction conditioned on a Lease, so this is the
// leader's own view of its term; every write is also conditioned on the
// revision it read, so a deposed leader's late write loses to the new
// leader's.
func (s *Kube) Fenced(still func() error) Writer { return kubeFenced{s, still} }

type kubeFenced struct {
	s     *Kube
	still func() error
}

func (w kubeFenced) Create(v *volume.Volume) error { return w.s.create(v, w.still) }
func (w kubeFenced) Update(v *volume.Volume) error { return w.s.update(v, w.still) }
func (w kubeFenced) Delete(v *volume.Volume) error { return w.s.delete(v, w.still) }

func (s *Kube) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

func fence(still func() error, what string) error {
	if still == nil {
		return nil
	}
	if err := still(); err != nil {
		return fmt.Errorf("%s: %w: %v", what, ErrFenced, err)
	}
	return nil
}

func (s *Kube) create(v *volume.Volume, still func() error) error {
	name := v.Spec.Name
	if err := fence(still, "creating volume "+name); err != nil {
		return err
	}
	s.createMu.Lock()
	defer s.createMu.Unlock()
	if _, err := s.Get(name); err == nil {
		return ErrExists
	}
	if v.Spec.UUID != "" {
		s.mu.RLock()
		var owner string
		for n, o := range s.vols {
			if o.Spec.UUID == v.Spec.UUID {
				owner = n
			}
		}
		s.mu.RUnlock()
		if owner != "" {
			return &UUIDError{UUID: v.Spec.UUID, Owner: owner}
		}
	}
	ctx, cancel := s.ctx()
	defer cancel()
	s.mark(s.creating, name, true)
	defer s.mark(s.creating, name, false)
	u, err := s.api.Create(ctx, newObject(v), metav1.CreateOptions{FieldValidation: "Strict"})
	switch {
	case apierrors.IsAlreadyExists(err):
		// Someone else's object: the watch may have brought it while it
		// was kept out; read it in.
		s.mark(s.creating, name, false)
		if cur, gerr := s.api.Get(ctx, name, metav1.GetOptions{}); gerr == nil {
			_, _ = s.wrote(cur)
		}
		return ErrExists
	case apierrors.IsInvalid(err):
		return fmt.Errorf("the API server refused volume %q: %w", name, err)
	case err != nil:
		return kubeUnavailable("creating volume "+name, err)
	}
	if v.Spec.UUID == "" {
		v.Spec.UUID = string(u.GetUID())
	}
	// A created object without its status reads as a volume accepted and
	// not started: only the status write says more (the claim, the
	// creation time). If it cannot be written the object goes again.
	su, err := s.api.UpdateStatus(ctx, withStatus(u, v, time.Now()), metav1.UpdateOptions{})
	if err != nil {
		rv := u.GetResourceVersion()
		if derr := s.letGo(ctx, u, &rv); derr != nil {
			s.log.Error("a Volume object was created but neither its status written nor the object deleted: it reads as a new volume", "volume", name, "error", derr)
			// The watch's view of it was kept from the cache while we
			// wrote (creating): take it in now, or it stays unseen until
			// it changes or a relist.
			s.mark(s.creating, name, false)
			if cur, gerr := s.api.Get(ctx, name, metav1.GetOptions{}); gerr == nil {
				_, _ = s.wrote(cur)
			} else {
				_, _ = s.wrote(u)
			}
		}
		return kubeUnavailable("writing the status of volume "+name, err)
	}
	got, err := s.wrote(su)
	if err != nil {
		return err
	}
	v.Revision = got.Revision
	return nil
}

func (s *Kube) update(v *volume.Volume, still func() error) error {
	name := v.Spec.Name
	if err := fence(still, "updating volume "+name); err != nil {
		return err
	}
	cur := s.object(name)
	if cur == nil {
		return s.conflict(name)
	}
	ctx, cancel := s.ctx()
	defer cancel()
	u := cur.DeepCopy()
	u.SetResourceVersion(fmt.Sprint(v.Revision))
	write := false
	if !hasFinalizer(u) && u.GetDeletionTimestamp() == nil {
		// Taken with the first write of ours, before anything runs for
		// the volume: from then on a kubectl delete waits for us.
		u.SetFinalizers(append(u.GetFinalizers(), Finalizer))
		write = true
	}
	// The one spec field the control plane writes: a growth asked through
	// its API (salt-volumes resize), which the object's schema lets only
	// grow.
	kind, size := "", spec.Size("")
	switch {
	case v.Spec.SparseLoopDevice != nil:
		kind, size = "sparseLoopDevice", v.Spec.SparseLoopDevice.Size
	case v.Spec.LVMLogicalVolume != nil:
		kind, size = "lvmLogicalVolume", v.Spec.LVMLogicalVolume.Size
	}
	if kind != "" {
		// Only ever larger: a copy of v older than the object (its size
		// edited with kubectl meanwhile) must not write the old size back.
		old, _, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", kind, "size")
		was, _ := spec.ParseSize(fmt.Sprint(old))
		if now, err := spec.ParseSize(string(size)); err == nil && now > was {
			if err := unstructured.SetNestedField(u.Object, string(size), "spec", kind, "size"); err != nil {
				return fmt.Errorf("volume %s: %w", name, err)
			}
			write = true
		}
	}
	if write {
		nu, err := s.api.Update(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			return s.writeError(name, "updating", err)
		}
		u = nu
	}
	su, err := s.api.UpdateStatus(ctx, withStatus(u, v, time.Now()), metav1.UpdateOptions{})
	if err != nil {
		return s.writeError(name, "writing the status of", err)
	}
	got, err := s.wrote(su)
	if err != nil {
		return err
	}
	v.Revision = got.Revision
	return nil
}

func (s *Kube) delete(v *volume.Volume, still func() error) error {
	name := v.Spec.Name
	if err := fence(still, "deleting volume "+name); err != nil {
		return err
	}
	cur := s.object(name)
	if cur == nil {
		return s.conflict(name)
	}
	ctx, cancel := s.ctx()
	defer cancel()
	u := cur.DeepCopy()
	rv := fmt.Sprint(v.Revision)
	u.SetResourceVersion(rv)
	s.mark(s.deleting, name, true)
	err := s.letGo(ctx, u, &rv)
	s.mark(s.deleting, name, false)
	if err != nil {
		return s.writeError(name, "deleting", err)
	}
	// Gone: whatever revision the API server answered with (an object
	// deleted by its last finalizer's removal may answer with its last
	// one), nothing older may bring it back.
	rev, _ := revisionOf(rv)
	s.mu.Lock()
	if cur := s.vols[name]; cur != nil {
		rev = max(rev, cur.Revision+1)
	}
	s.tombs[name] = rev
	s.remove(name, rev)
	s.unlockAndSend()
	return nil
}

// letGo removes our finalizer from u (at its resourceVersion) and, unless
// a kubectl delete already marked it, deletes it. rv is updated to the
// last resourceVersion written.
func (s *Kube) letGo(ctx context.Context, u *unstructured.Unstructured, rv *string) error {
	marked := u.GetDeletionTimestamp() != nil
	if hasFinalizer(u) {
		u = u.DeepCopy()
		u.SetFinalizers(slices.DeleteFunc(u.GetFinalizers(), func(f string) bool { return f == Finalizer }))
		nu, err := s.api.Update(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		// Marked and without finalizers left, the object is gone now;
		// the update answers with its last state.
		*rv = nu.GetResourceVersion()
		u = nu
	}
	if marked {
		return nil
	}
	err := s.api.Delete(ctx, u.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: rv}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// writeError maps an API server error for a write on name.
func (s *Kube) writeError(name, what string, err error) error {
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return s.conflict(name)
	case apierrors.IsInvalid(err):
		return fmt.Errorf("%s volume %q: the API server refused it: %w", what, name, err)
	}
	return kubeUnavailable(fmt.Sprintf("%s volume %q", what, name), err)
}

// conflict reads the volume as the API server holds it now, for the
// caller to decide again.
func (s *Kube) conflict(name string) error {
	ctx, cancel := s.ctx()
	defer cancel()
	u, err := s.api.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return &ConflictError{Name: name}
	case err != nil:
		return kubeUnavailable("reading volume "+name+" after a conflict", err)
	}
	v, err := s.wrote(u)
	if err != nil {
		return err
	}
	return &ConflictError{Name: name, Current: v.Clone()}
}
