// Package nodestate keeps one JSON file per volume under the state dir,
// written atomically, and serialises work on one volume with a file lock.
package nodestate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// Phase of a volume's node state.
const (
	// PhasePreparing is recorded before the first change to the machine, so
	// that a crash leaves a trace that says the leftovers are ours.
	PhasePreparing = "preparing"
	PhasePrepared  = "prepared"
)

// Record is what the node remembers about a volume.
type Record struct {
	Version int        `json:"version"`
	Spec    *spec.Spec `json:"spec"`
	// SizeBytes is kept because Spec.SizeBytes is not serialised.
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	Phase     string `json:"phase"`
	// Device is the raw device's kernel name and number when prepared, to
	// notice a path that now points elsewhere.
	Device    string    `json:"device,omitempty"`
	DeviceNum string    `json:"deviceNum,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Dir is a state directory.
type Dir struct{ Root string }

func (d Dir) volumes() string            { return filepath.Join(d.Root, "volumes") }
func (d Dir) locks() string              { return filepath.Join(d.Root, "locks") }
func (d Dir) Sparse() string             { return filepath.Join(d.Root, "sparse") }
func (d Dir) SparseFile(u string) string { return filepath.Join(d.Sparse(), u) }
func (d Dir) path(u string) string       { return filepath.Join(d.volumes(), u+".json") }

// Init creates the layout, root-only: the state names devices and files
// that root processes act on.
func (d Dir) Init() error {
	for _, p := range []string{d.Root, d.volumes(), d.locks(), d.Sparse()} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return fmt.Errorf("creating state dir: %w", err)
		}
	}
	return nil
}

// Load returns the record of a volume, or nil if there is none.
func (d Dir) Load(u string) (*Record, error) {
	b, err := os.ReadFile(d.path(u))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("state file %s is corrupt: %w", d.path(u), err)
	}
	if r.Spec == nil {
		return nil, fmt.Errorf("state file %s has no spec", d.path(u))
	}
	r.Spec.SizeBytes = r.SizeBytes
	return &r, nil
}

// Save writes a record atomically: temp file, fsync, rename, fsync dir.
func (d Dir) Save(r *Record) error {
	r.Version = 1
	r.SizeBytes = r.Spec.SizeBytes
	r.UpdatedAt = time.Now().UTC()
	if r.CreatedAt.IsZero() {
		r.CreatedAt = r.UpdatedAt
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(d.path(r.Spec.UUID), append(b, '\n'), 0o600)
}

// Remove deletes a record (missing is fine).
func (d Dir) Remove(u string) error {
	if err := os.Remove(d.path(u)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(d.volumes())
}

// All returns every record, sorted by name; unreadable files are returned
// as errors alongside the good records.
func (d Dir) All() ([]*Record, []error) {
	ents, err := os.ReadDir(d.volumes())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{err}
	}
	var out []*Record
	var errs []error
	for _, e := range ents {
		u, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		r, err := d.Load(u)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r != nil {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.Name < out[j].Spec.Name })
	return out, errs
}

// WriteFileAtomic replaces path so that readers and crashes see either the
// old or the new content, never a mix.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return syncDir(dir)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Lock is a held flock; the kernel drops it if the process dies.
type Lock struct{ f *os.File }

// Lock takes the exclusive lock named key (a volume UUID, or "global").
func (d Dir) Lock(key string) (*Lock, error) {
	f, err := os.OpenFile(filepath.Join(d.locks(), key+".lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", key, err)
	}
	return &Lock{f}, nil
}

// Unlock releases the lock.
func (l *Lock) Unlock() {
	if l != nil && l.f != nil {
		l.f.Close()
	}
}
