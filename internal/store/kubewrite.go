package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Writes to Volume objects: each is guarded by the resourceVersion read,
// and fenced on the leader's Lease when a writer says so.

// Create makes the object, then writes its status. A uuid given is
// checked against the volumes this replica knows.
func (s *Kube) Create(ctx context.Context, v *volume.Volume) error { return s.create(ctx, v, nil) }

// Update writes v's status (and our finalizer, if the object lacks it)
// if the object is still at v.Revision.
func (s *Kube) Update(ctx context.Context, v *volume.Volume) error { return s.update(ctx, v, nil) }

// Delete lets the object go (our finalizer removed, then deleted if no
// one had) if it is still at v.Revision.
func (s *Kube) Delete(ctx context.Context, v *volume.Volume) error { return s.delete(ctx, v, nil) }

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

func (w kubeFenced) Create(ctx context.Context, v *volume.Volume) error {
	return w.s.create(ctx, v, w.still)
}
func (w kubeFenced) Update(ctx context.Context, v *volume.Volume) error {
	return w.s.update(ctx, v, w.still)
}
func (w kubeFenced) Delete(ctx context.Context, v *volume.Volume) error {
	return w.s.delete(ctx, v, w.still)
}

// Still says whether the term this writer is fenced on still holds.
func (w kubeFenced) Still() error { return w.still() }

// FenceRecords returns r with every write asking still() first (ErrFenced
// once it fails): the leader's records beside Volume objects, fenced on
// its view of its Lease as its volume writes are.
func FenceRecords(r Records, still func() error) Records { return fencedRecords{r, still} }

type fencedRecords struct {
	Records
	still func() error
}

func (f fencedRecords) PutRecord(ctx context.Context, kind, key string, data []byte) error {
	if err := fence(f.still, "writing a "+kind+" record"); err != nil {
		return err
	}
	return f.Records.PutRecord(ctx, kind, key, data)
}

func (f fencedRecords) DeleteRecord(ctx context.Context, kind, key string) error {
	if err := fence(f.still, "deleting a "+kind+" record"); err != nil {
		return err
	}
	return f.Records.DeleteRecord(ctx, kind, key)
}

// ctx bounds one write (the caller's context, within the request timeout).
func (s *Kube) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
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

func (s *Kube) create(ctx context.Context, v *volume.Volume, still func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
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
	ctx, cancel := s.ctx(ctx)
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

func (s *Kube) update(ctx context.Context, v *volume.Volume, still func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name := v.Spec.Name
	if err := fence(still, "updating volume "+name); err != nil {
		return err
	}
	cur := s.object(name)
	if cur == nil {
		return s.conflict(ctx, name)
	}
	ctx, cancel := s.ctx(ctx)
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
			return s.writeError(ctx, name, "updating", err)
		}
		u = nu
	}
	su, err := s.api.UpdateStatus(ctx, withStatus(u, v, time.Now()), metav1.UpdateOptions{})
	if err != nil {
		return s.writeError(ctx, name, "writing the status of", err)
	}
	got, err := s.wrote(su)
	if err != nil {
		return err
	}
	v.Revision = got.Revision
	return nil
}

func (s *Kube) delete(ctx context.Context, v *volume.Volume, still func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name := v.Spec.Name
	if err := fence(still, "deleting volume "+name); err != nil {
		return err
	}
	cur := s.object(name)
	if cur == nil {
		return s.conflict(ctx, name)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	u := cur.DeepCopy()
	rv := fmt.Sprint(v.Revision)
	u.SetResourceVersion(rv)
	s.mark(s.deleting, name, true)
	err := s.letGo(ctx, u, &rv)
	s.mark(s.deleting, name, false)
	if err != nil {
		return s.writeError(ctx, name, "deleting", err)
	}
	// Gone: whatever revision the API server answered with (an object
	// deleted by its last finalizer's removal may answer with its last
	// one), nothing older may bring it back.
	rev, _ := revisionOf(rv)
	s.mu.Lock()
	if cur := s.vols[name]; cur != nil {
		rev = max(rev, cur.Revision+1)
	}
	s.tomb(name, rev)
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
func (s *Kube) writeError(ctx context.Context, name, what string, err error) error {
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return s.conflict(ctx, name)
	case apierrors.IsInvalid(err):
		return fmt.Errorf("%s volume %q: the API server refused it: %w", what, name, err)
	}
	return kubeUnavailable(fmt.Sprintf("%s volume %q", what, name), err)
}

// conflict reads the volume as the API server holds it now, for the
// caller to decide again.
func (s *Kube) conflict(ctx context.Context, name string) error {
	ctx, cancel := s.ctx(ctx)
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
