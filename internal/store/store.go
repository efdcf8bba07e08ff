// Package store is where volume objects live: one contract (Store) and its
// backends, an embedded bbolt file (Open, the default: one control plane),
// etcd (OpenEtcd: several replicas, one of them elected to reconcile) and
// Volume objects in a Kubernetes API server (OpenKube: kubectl-managed
// volumes). The Hub fans the store's watch out to the API's streams.
//
// Reads are served from an in-memory cache that the backend keeps current
// (after each of its own writes, and from etcd's or the API server's watch
// for everyone else's), so listing never waits on disk or on the network. Writes are guarded: a
// create checks name and uuid in one step, an update or delete names the
// revision it read, and loses to any write made since (ErrConflict).
package store

import (
	"context"
	"errors"
	"fmt"

	saltvolumes "github.com/salt-volumes/salt-volumes"

	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// ErrNotFound is returned for a volume the store does not hold.
var ErrNotFound = errors.New("volume not found")

// ErrExists is returned when creating a volume whose name is taken.
var ErrExists = errors.New("a volume with this name already exists")

// ErrConflict is returned by Update and Delete when the volume changed (or
// went) since the revision the caller read; ConflictError says what it is
// now.
var ErrConflict = errors.New("the volume changed since it was read")

// ErrFenced is returned by a fenced writer whose leadership ended: it must
// stop writing (another replica reconciles now).
var ErrFenced = errors.New("this replica is no longer the leader")

// ErrUnavailable wraps failures to reach the backend (etcd without quorum,
// a timeout): the write did not happen, or its outcome is unknown and a
// retry is safe.
var ErrUnavailable = errors.New("store unavailable")

// UUIDError is returned when creating a volume whose UUID another volume
// already has.
type UUIDError struct{ UUID, Owner string }

func (e *UUIDError) Error() string {
	return fmt.Sprintf("uuid %s already belongs to volume %q", e.UUID, e.Owner)
}

// ConflictError is ErrConflict with the volume as the store holds it now
// (nil: it was deleted).
type ConflictError struct {
	Name    string
	Current *volume.Volume
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("volume %q: %v", e.Name, ErrConflict)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// Event types: the API's watch stream's own.
const (
	Added    = saltvolumes.Added
	Modified = saltvolumes.Modified
	Deleted  = saltvolumes.Deleted
)

// Event is one change of one volume, in the order the backend made it.
type Event struct {
	Type string
	// Volume (and Prev) are the store's own copies, shared by every
	// receiver: keep them, never modify them.
	Volume *volume.Volume
	// Prev is the volume before the change (nil for Added or when the
	// cache did not hold it).
	Prev *volume.Volume
	// UID is the backend's own id of the volume's object, where it has
	// one (Kubernetes: the Volume object's metadata.uid).
	UID string
}

// Reader is the cached, read-only side.
type Reader interface {
	// Get returns a copy of the named volume, with its Revision.
	Get(name string) (*volume.Volume, error)
	// Names lists the volume names, sorted.
	Names() []string
	// List returns copies of all volumes, sorted by name.
	List() []*volume.Volume
	// OnNode returns copies of one node's volumes.
	OnNode(node string) []*volume.Volume
	// Len is the number of volumes.
	Len() int
}

// Writer changes volumes. Each method sets v.Revision to the revision it
// wrote.
type Writer interface {
	// Create adds v; the name and the uuid must both be free (ErrExists,
	// *UUIDError), checked and taken in one step.
	Create(ctx context.Context, v *volume.Volume) error
	// Update replaces the volume if it is still at v.Revision
	// (*ConflictError otherwise).
	Update(ctx context.Context, v *volume.Volume) error
	// Delete removes the volume if it is still at v.Revision.
	Delete(ctx context.Context, v *volume.Volume) error
}

// Holder is a store whose volumes others may also create and delete
// directly (Volume objects: kubectl). Held reports whether a deletion of
// the volume made there would now wait for the control plane; until it
// would, the reconciler writes the volume once before running anything.
type Holder interface {
	Held(name string) bool
}

// Store is the whole contract.
type Store interface {
	Reader
	Writer
	// Watch calls fn for every change from now on, in the order the
	// changes were made and never two calls at once; fn must not block or
	// call the store. The returned function stops it.
	Watch(fn func(Event)) (stop func())
	Close() error
}
