package reconciler

import (
	"context"
	"errors"
	"reflect"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// One pass over one volume: read it, apply what was observed, act, save.

type effect int

const (
	unchanged effect = iota
	changed
	removed
)

// reconcile makes one pass over a volume: it applies what was observed
// about it, starts what it needs, saves it, and returns when it wants its
// next pass.
func (r *Reconciler) reconcile(ctx context.Context, name string) Result {
	var res Result
	// Counted once the pass is over: tests wait on it for "the pass after
	// this event ended".
	defer r.Metrics.Reconciles.Inc()
	r.mu.Lock()
	obs := r.inbox[name]
	delete(r.inbox, name)
	r.mu.Unlock()

	v, err := r.store.Get(name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		r.log.Error("reading volume", "volume", name, "error", err)
		return Result{Backoff: true}
	}
	obs = r.confirm(ctx, name, v, obs)
	if v == nil {
		r.adopt(ctx, name, obs, &res)
		return res
	}
	if v.ForgetRequested {
		obs = append(obs, observation{kind: obsForget})
	}
	base := v.Clone()
	dirty := false
	for _, o := range obs {
		switch r.apply(v, o, &res) {
		case changed:
			dirty = true
		case removed:
			r.remove(ctx, v, &res)
			return res
		}
	}
	if v.DeleteRequested && (v.Status.Reason == ReasonInvalidSpec || v.Status.Reason == ReasonLimit) && v.Status.JobID == "" {
		// Nothing ever ran for it: nothing to remove on its node.
		r.remove(ctx, v, &res)
		return res
	}
	if r.opt.Kube != nil && r.observeKube(ctx, v) {
		dirty = true
	}
	if r.act(ctx, v, &res) {
		dirty = true
	}
	if dirty {
		v.Status.UpdatedAt = time.Now().UTC()
		r.save(ctx, v, base, &res)
	}
	return res
}

// save writes what a worker made of base. A conflict means someone else
// wrote the volume since it was read: a user's request (deletion, forget)
// through this or another replica is merged and the write tried again;
// anything else (a cache behind a predecessor's writes) wins, and the
// volume is reconciled again from it.
func (r *Reconciler) save(ctx context.Context, v, base *volume.Volume, res *Result) {
	name := v.Spec.Name
	// A long step's bytes go with their step: any other step (queued,
	// published, settled, failed) drops them.
	if p := v.Status.Progress; p != nil && p.Step != v.Status.Step {
		v.Status.Progress = nil
	}
	for range 3 {
		err := r.writer().Update(ctx, v)
		var ce *store.ConflictError
		switch {
		case err == nil:
			return
		case errors.Is(err, store.ErrFenced):
			r.warn.Warn("not saving: this replica lost its leadership", "volume", name)
			return
		case ctx.Err() != nil:
			// The term ended: the next one starts from the store, and
			// node operations are idempotent.
			return
		case !errors.As(err, &ce):
			r.log.Error("saving volume", "volume", name, "error", err)
			res.after(r.opt.RetryDelay)
			return
		case ce.Current == nil || !onlyRequestsChanged(base, ce.Current):
			r.log.Warn("volume changed elsewhere while it was reconciled; reconciling it again", "volume", name)
			res.Requeue = true
			return
		}
		cur := ce.Current
		if cur.DeleteRequested && !base.DeleteRequested {
			v.DeleteRequested, v.Wipe = true, cur.Wipe
		}
		v.ForgetRequested = v.ForgetRequested || cur.ForgetRequested
		v.NodeForgotten = v.NodeForgotten || cur.NodeForgotten
		v.Revision, base = cur.Revision, cur
		res.Requeue = true // the request itself is acted on by the next pass
	}
	r.log.Error("saving volume: it keeps changing", "volume", name)
	res.after(r.opt.RetryDelay)
}

// onlyRequestsChanged tells whether cur differs from base only in what
// users write (the deletion and forget requests).
func onlyRequestsChanged(base, cur *volume.Volume) bool {
	a, b := base.Clone(), cur.Clone()
	for _, x := range []*volume.Volume{a, b} {
		x.DeleteRequested, x.Wipe, x.ForgetRequested, x.NodeForgotten, x.Revision = false, false, false, false, 0
	}
	return reflect.DeepEqual(a, b)
}

func (r *Reconciler) remove(ctx context.Context, v *volume.Volume, res *Result) {
	name := v.Spec.Name
	if r.opt.Kube != nil {
		// The storage is gone: the PV may go too. If this fails the
		// Kubernetes side drops the finalizer of a PV whose volume is gone.
		if err := r.opt.Kube.Release(ctx, v); err != nil {
			r.warn.Warn("could not release the PersistentVolume", "volume", name, "error", err)
		}
	}
	if err := r.writer().Delete(ctx, v); err != nil {
		switch {
		case errors.Is(err, store.ErrFenced):
			r.warn.Warn("not removing: this replica lost its leadership", "volume", name)
		case ctx.Err() != nil:
		case errors.Is(err, store.ErrConflict):
			r.log.Warn("volume changed elsewhere while it was removed; reconciling it again", "volume", name)
			res.Requeue = true
		default:
			r.log.Error("removing volume", "volume", name, "error", err)
			res.after(r.opt.RetryDelay)
		}
		return
	}
	res.Forget = true
	r.Nodes.Forget(v.Spec.UUID)
	r.jobLog.forget(name)
	r.log.Info("volume deleted", "volume", name, "node", v.Spec.Node)
}

// adopt creates the object for a volume someone else's state run prepared.
func (r *Reconciler) adopt(ctx context.Context, name string, obs []observation, res *Result) {
	for _, o := range obs {
		if o.kind != obsReturn || o.result == nil || o.result.Function != "prepared" || !o.result.OK || o.result.Device == nil {
			continue
		}
		s, err := volume.AdoptedSpec(o.node, *o.result)
		if err == nil {
			if err = o.result.Device.Check(s); err != nil {
				r.Metrics.Rejected.Device.Inc()
			}
		}
		if err != nil {
			r.log.Warn("not adopting volume", "volume", name, "job", o.jid, "node", o.node, "error", err)
			continue
		}
		if err := r.Requests.RoomFor("adoption"); err != nil {
			r.log.Warn("not adopting volume", "volume", name, "job", o.jid, "node", o.node, "error", err)
			return
		}
		now := time.Now().UTC()
		v := &volume.Volume{Spec: *s, CreatedAt: now, Origin: volume.OriginSalt,
			Status: volume.Status{Status: saltvolumes.Status{Phase: volume.Available, JobID: o.jid, UpdatedAt: now}}}
		v.Status.ApplyDevice(o.result.Device)
		v.Status.PreparedSize = s.Bytes()
		// In Kubernetes mode an adopted volume gets no PersistentVolume:
		// nobody asked for it to be offered to claims, and a PV without a
		// claimRef binds any claim that names it.
		if err := r.writer().Create(ctx, v); err != nil {
			r.log.Warn("not adopting volume", "volume", name, "error", err)
			res.Requeue = true
			return
		}
		r.Metrics.Adopted.Inc()
		r.log.Info("volume prepared outside the control plane adopted", "volume", name, "node", o.node, "job", o.jid)
		return
	}
}

func waiting(v *volume.Volume) bool {
	return v.Status.Phase == volume.Pending || v.Status.Phase == volume.Terminating
}
