// Package requests records what users ask of volumes (create, provision
// for a claim, delete, forget, drain a node, grow) in the store, checked
// against the deletion criteria and limits.volumes, before the caller hears
// "accepted". It writes only requests; the reconciler, on whichever replica
// leads, learns of them from the store's watch and owns every status.
package requests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Service takes users' requests.
type Service struct {
	store store.Store
	max   int // limits.volumes (0: none)
	// Refused counts volumes refused over limits.volumes.
	Refused LimitRefusals
}

// New takes requests on st; maxVolumes bounds the volumes it holds,
// however they come (0: no bound).
func New(st store.Store, maxVolumes int) *Service {
	return &Service{store: st, max: maxVolumes}
}

// Get reads one volume from the store.
func (s *Service) Get(name string) (*volume.Volume, error) { return s.store.Get(name) }

// requester is who asks, as the audit names them ("" for the control
// plane's own doings: claims, adoption).
func requester(ctx context.Context) string {
	if p := access.From(ctx); p != nil {
		return p.User
	}
	return ""
}

// Create stores a new volume (phase Unknown); the store's watch queues it
// on the replica that reconciles.
func (s *Service) Create(ctx context.Context, sp *spec.Spec) (*volume.Volume, error) {
	if err := s.RoomFor("api"); err != nil {
		return nil, err
	}
	return s.insert(ctx, sp, nil)
}

// Provision is Create for a volume made for a PersistentVolumeClaim.
func (s *Service) Provision(ctx context.Context, sp *spec.Spec, claim *saltvolumes.Claim) (*volume.Volume, error) {
	if err := s.RoomFor("claim"); err != nil {
		return nil, err
	}
	return s.insert(ctx, sp, claim)
}

func (s *Service) insert(ctx context.Context, sp *spec.Spec, claim *saltvolumes.Claim) (*volume.Volume, error) {
	now := time.Now().UTC()
	v := &volume.Volume{Spec: *sp, CreatedAt: now, Claim: claim, Status: volume.Status{Status: saltvolumes.Status{UpdatedAt: now}}, RequestedBy: requester(ctx)}
	if err := s.store.Create(ctx, v); err != nil {
		return nil, err
	}
	return v, nil
}

// DeleteError is a deletion the criteria forbid.
type DeleteError struct{ Reason string }

func (e *DeleteError) Error() string { return "cannot delete: " + e.Reason }

// Delete asks for a volume's deletion. The criteria are checked now, so the
// caller gets a clear refusal, and again by the worker that carries it out.
func (s *Service) Delete(ctx context.Context, name string, wipe bool) (*volume.Volume, error) {
	// Persisted before the caller hears "accepted": a crash right after
	// still deletes, and the replica that reconciles sees it in the store
	// (its watch queues the volume; a worker saving an older copy at the
	// same moment merges it).
	return s.request(ctx, name, func(v *volume.Volume) error {
		if ok, why := volume.CanDelete(v); !ok {
			return &DeleteError{Reason: why}
		}
		v.DeleteRequested, v.Wipe = true, wipe
		v.RequestedBy = requester(ctx)
		return nil
	})
}

// request records a user's request on a volume: check and change it as
// read, write it guarded by its revision, and on a conflict check again on
// what the store holds now. Only requests (deletion, forget) are written
// this way; the reconciler owns the status.
func (s *Service) request(ctx context.Context, name string, change func(v *volume.Volume) error) (*volume.Volume, error) {
	const tries = 5
	v, err := s.store.Get(name)
	if err != nil {
		return nil, err
	}
	for range tries {
		if err := change(v); err != nil {
			return v, err
		}
		err = s.store.Update(ctx, v)
		var ce *store.ConflictError
		if !errors.As(err, &ce) {
			break
		}
		if ce.Current == nil {
			return nil, fmt.Errorf("recording the request on %s: %w: %q", name, store.ErrNotFound, name)
		}
		v = ce.Current
	}
	if err != nil {
		// A conflict on the last try too: nothing was written, and the
		// caller must hear so (ask again), never "accepted".
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("recording the request on %s: the volume kept changing (%d writes in a row met newer ones); nothing was recorded, ask again: %w", name, tries, err)
		}
		return nil, fmt.Errorf("recording the request on %s: %w", name, err)
	}
	return v, nil
}

// Forget drops a Failed volume from the store without running anything on
// its node: the way out for a volume whose node is gone for good, where the
// unprepare state can never run. Whatever is on the node stays; a later
// salt_volumes run there reports it and it is adopted again.
func (s *Service) Forget(ctx context.Context, name string) (*volume.Volume, error) {
	return s.request(ctx, name, func(v *volume.Volume) error {
		if v.Status.Phase != volume.Failed {
			return &DeleteError{Reason: "only a Failed volume can be forgotten (it is " + v.Status.Phase.String() + "); delete it normally"}
		}
		v.ForgetRequested = true
		return nil
	})
}

// NodeForgetError names volumes a node drain was asked to forget that are
// not on that node (gone, or on another node): nothing was forgotten.
type NodeForgetError struct {
	Node    string
	Missing []string
}

func (e *NodeForgetError) Error() string {
	return fmt.Sprintf("not volumes of node %s: %s", e.Node, strings.Join(e.Missing, ", "))
}

// ForgetNode drains a node that is gone for good: the named volumes, all
// on node, are forgotten whatever their phase (and their PVs released)
// without running anything anywhere. The caller names them, as listed to
// and confirmed by the user, so a volume created meanwhile is not dropped
// unseen. Names that are not node's volumes refuse the whole request.
func (s *Service) ForgetNode(ctx context.Context, node string, names []string) ([]*volume.Volume, error) {
	var missing []string
	for _, n := range names {
		if v, err := s.store.Get(n); err != nil || v.Spec.Node != node {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, &NodeForgetError{Node: node, Missing: missing}
	}
	var out []*volume.Volume
	for _, n := range names {
		v, err := s.request(ctx, n, func(v *volume.Volume) error {
			v.ForgetRequested, v.NodeForgotten = true, true
			return nil
		})
		if err != nil {
			return out, err
		}
		out = append(out, v)
	}
	return out, nil
}

// ResizeError refuses a resize, naming the field and the fix.
type ResizeError struct {
	Field  string
	Reason string
	// Conflict: the volume cannot grow now (its phase), as opposed to a
	// request that is wrong whenever it is made.
	Conflict bool
}

func (e *ResizeError) Error() string { return e.Field + ": " + e.Reason }

// Resize asks a volume to grow. A sparse volume grows to the quantity q:
// its spec takes the new size and the prepare state runs with it, as for a
// creation; the node grows the file, the loop device and the filesystem or
// partition. A raw volume (q empty) grows to what its device has become:
// the prepare state runs, and the node grows the filesystem, or our GPT on
// a whole disk, to the device. Asking again for the size it has is
// accepted and changes nothing. A growth that failed may be asked for
// again, from the size the volume had. In Kubernetes mode its
// PersistentVolume's capacity (and its claim's) follow once the node is
// done.
func (s *Service) Resize(ctx context.Context, name, q string) (*volume.Volume, error) {
	var n int64
	if q != "" {
		var err error
		if n, err = spec.ParseSize(q); err != nil {
			return nil, &ResizeError{Field: "size", Reason: err.Error()}
		}
	}
	return s.request(ctx, name, func(v *volume.Volume) error {
		retry := v.Status.Phase == volume.Failed && v.Status.Reason == volume.ReasonResizeFailed
		switch {
		case v.Spec.RawBlockDevice != nil && q != "":
			return &ResizeError{Field: "size", Reason: "a raw volume is the size of its device: grow the device (or its partition), then ask without a size (salt-volumes resize NAME --to-device; {\"toDevice\": true})"}
		case v.Spec.RawBlockDevice == nil && q == "":
			return &ResizeError{Field: "size", Reason: "missing: the size the volume grows to, e.g. 20Gi"}
		case v.DeleteRequested:
			return &ResizeError{Field: "size", Reason: "the volume is being deleted", Conflict: true}
		}
		if v.Spec.RawBlockDevice != nil {
			if v.Status.Phase != volume.Available && !retry {
				return &ResizeError{Field: "size", Reason: "only an Available volume grows (it is " + v.Status.Phase.String() + "): wait until it is, then ask again", Conflict: true}
			}
			volume.StartGrowth(v, "growing to what its device has become")
			v.RequestedBy = requester(ctx)
			return nil
		}
		cur := v.Spec.Bytes()
		if retry && v.Status.PreparedSize > 0 {
			// The growth failed: any size from the one last prepared.
			cur = v.Status.PreparedSize
		}
		switch {
		case n == cur && !retry:
			return nil
		case n < cur:
			return &ResizeError{Field: "size", Reason: fmt.Sprintf("%s is smaller than the volume (%s): shrinking is refused", spec.FormatSize(n), spec.FormatSize(cur))}
		case v.Status.Phase != volume.Available && !retry:
			return &ResizeError{Field: "size", Reason: "only an Available volume grows (it is " + v.Status.Phase.String() + "): wait until it is, then ask again", Conflict: true}
		}
		grown := v.Spec
		if l := v.Spec.LVMLogicalVolume; l != nil {
			c := *l
			c.Size = spec.Size(q)
			grown.LVMLogicalVolume = &c
		} else {
			grown.SparseLoopDevice = &spec.SparseLoopDevice{Size: spec.Size(q)}
		}
		if err := grown.Validate(); err != nil {
			return &ResizeError{Field: "size", Reason: err.Error()}
		}
		v.Spec = grown
		volume.StartGrowth(v, "growing to "+spec.FormatSize(n))
		v.RequestedBy = requester(ctx)
		return nil
	})
}
