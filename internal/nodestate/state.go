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
	"syscall"
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

// RecordVersion is the layout of the records this build writes.
const RecordVersion = 1

// Record is what the node remembers about a volume.
type Record struct {
	// Version is the record's layout (RecordVersion when written here); a
	// newer one is refused, never misread.
	Version int        `json:"version"`
	Spec    *spec.Spec `json:"spec"`
	// SizeBytes is kept because Spec.SizeBytes is not serialised.
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	Phase     string `json:"phase"`
	// Device is the raw device's kernel name and number when prepared, to
	// notice a path that now points elsewhere.
	Device    string `json:"device,omitempty"`
	DeviceNum string `json:"deviceNum,omitempty"`
	// DeviceSize is the raw device's size: with what we wrote, it tells our
	// device from another one that a caller gave the same UUID.
	DeviceSize int64 `json:"deviceSize,omitempty"`
	// Written says what we wrote once the write finished (ext4, xfs, gpt,
	// or guid for a partition whose GUID we set). A volume we wrote is
	// never written again: a damaged signature is reported, not replaced.
	Written string `json:"written,omitempty"`
	// DiskGUID is the disk GUID of a GPT we wrote on a whole raw disk.
	DiskGUID string `json:"diskGUID,omitempty"`
	// For a raw Block volume on an existing partition: its disk, its index
	// and the GUID it had, which --wipe puts back.
	Parent     string `json:"parent,omitempty"`
	ParentNum  string `json:"parentNum,omitempty"`
	PartNumber int    `json:"partNumber,omitempty"`
	OldGUID    string `json:"oldGUID,omitempty"`
	// For an lvmLogicalVolume: the LVM UUID of the LV we created and its
	// device-mapper UUID. With the LV's tag, they are what makes it ours.
	LVUUID    string    `json:"lvUUID,omitempty"`
	DMUUID    string    `json:"dmUUID,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Formatted tells whether we finished writing the volume's signature.
// Records from before Written existed say so by being prepared.
func (r *Record) Formatted() bool {
	return r.Written != "" || r.Phase == PhasePrepared
}

// Dir is a state directory.
type Dir struct{ Root string }

func (d Dir) volumes() string            { return filepath.Join(d.Root, "volumes") }
func (d Dir) locks() string              { return filepath.Join(d.Root, "locks") }
func (d Dir) Sparse() string             { return filepath.Join(d.Root, "sparse") }
func (d Dir) Snapshots() string          { return filepath.Join(d.Root, "snapshots") }
func (d Dir) RestoreReport() string      { return filepath.Join(d.Root, "restore-report.json") }
func (d Dir) Restores() string           { return filepath.Join(d.Root, "restores") }
func (d Dir) SparseFile(u string) string { return filepath.Join(d.Sparse(), u) }
func (d Dir) Keys() string               { return filepath.Join(d.Root, "keys") }
func (d Dir) KeyFile(u string) string    { return filepath.Join(d.Keys(), u+".key") }
func (d Dir) path(u string) string       { return filepath.Join(d.volumes(), u+".json") }

// Init creates the layout, root-only: the state names devices and files
// that root processes act on. Modes are tightened on every run, and the
// subdirectories must be real directories: a symlink planted there would
// send sparse files, records, locks or snapshot images elsewhere.
func (d Dir) Init() error {
	for _, p := range []string{d.Root, d.volumes(), d.locks(), d.Sparse(), d.Snapshots(), d.Keys()} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return fmt.Errorf("creating state dir: %w", err)
		}
		if p == d.Root {
			continue // the root may be a symlink to another disk
		}
		st, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("checking state dir: %w", err)
		}
		if !st.IsDir() {
			return fmt.Errorf("%s is not a directory (a symlink?): move it away and run again", p)
		}
		if st.Mode().Perm() != 0o700 {
			if err := os.Chmod(p, 0o700); err != nil {
				return fmt.Errorf("tightening %s: %w", p, err)
			}
		}
	}
	return nil
}

// SnapshotDir is the directory of one volume's snapshots, made if need
// be: a real directory, root-only, like the layout's own (a symlink there
// would send snapshot images and their records elsewhere).
func (d Dir) SnapshotDir(u string) (string, error) {
	if err := d.Init(); err != nil {
		return "", err
	}
	p := filepath.Join(d.Snapshots(), u)
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating %s: %w", p, err)
	}
	st, err := os.Lstat(p)
	if err != nil {
		return "", fmt.Errorf("checking %s: %w", p, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory (a symlink?): move it away and run again", p)
	}
	if st.Mode().Perm() != 0o700 {
		if err := os.Chmod(p, 0o700); err != nil {
			return "", fmt.Errorf("tightening %s: %w", p, err)
		}
	}
	return p, nil
}

// RestoresDir is the directory of the LVM volumes' restore records
// (restores/<uuid>.json), made if need be: a real directory, root-only,
// like SnapshotDir.
func (d Dir) RestoresDir() (string, error) {
	if err := d.Init(); err != nil {
		return "", err
	}
	p := d.Restores()
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating %s: %w", p, err)
	}
	st, err := os.Lstat(p)
	if err != nil {
		return "", fmt.Errorf("checking %s: %w", p, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory (a symlink?): move it away and run again", p)
	}
	if st.Mode().Perm() != 0o700 {
		if err := os.Chmod(p, 0o700); err != nil {
			return "", fmt.Errorf("tightening %s: %w", p, err)
		}
	}
	return p, nil
}

// OpenSparse opens a sparse file of the state dir without following a
// symlink, and refuses anything but a regular file with one link: a
// planted link would make mkfs or a loop device act on its target.
func (d Dir) OpenSparse(u string, flag int) (*os.File, error) {
	p := d.SparseFile(u)
	f, err := os.OpenFile(p, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symlink, not a sparse file of ours: refusing to follow it", p)
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file: refusing to use it", p)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
		f.Close()
		return nil, fmt.Errorf("%s has %d hard links: another path shares it, refusing to use it", p, sys.Nlink)
	}
	return f, nil
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
	if err := r.check(u); err != nil {
		return nil, fmt.Errorf("state file %s is not valid: %w", d.path(u), err)
	}
	r.Spec.SizeBytes = r.SizeBytes
	return &r, nil
}

// check validates a record as strictly as a spec from a user: its UUID
// names files under the state dir and its device path is acted on.
func (r *Record) check(u string) error {
	if r.Version > RecordVersion {
		// A downgraded node binary: every operation that reads this
		// record, and every prepare on the node (which reads them all),
		// fails until the newer binary is back; nothing is touched.
		return fmt.Errorf("record version %d was written by a newer salt-volume-exec (this one reads up to %d): install that version or a later one on this node again", r.Version, RecordVersion)
	}
	if r.Spec == nil {
		return errors.New("no spec")
	}
	// mkfsOptions are only used before the first write; an option that a
	// newer version no longer allows must not make the record unreadable.
	c := *r.Spec
	c.MkfsOptions = nil
	if err := c.Validate(); err != nil {
		return err
	}
	if c.UUID != u || r.Spec.UUID != u {
		return fmt.Errorf("it names uuid %q, not %q", r.Spec.UUID, u)
	}
	c.MkfsOptions = r.Spec.MkfsOptions
	*r.Spec = c // with the defaults Validate fills in
	switch r.Phase {
	case PhasePreparing, PhasePrepared:
	default:
		return fmt.Errorf("unknown phase %q", r.Phase)
	}
	return nil
}

// Save writes a record atomically: temp file, fsync, rename, fsync dir.
func (d Dir) Save(r *Record) error {
	b, err := encode(r, time.Now().UTC())
	if err != nil {
		return err
	}
	return WriteFileAtomic(d.path(r.Spec.UUID), b, 0o600)
}

// encode stamps r as saved at t and returns the bytes of its file.
func encode(r *Record, t time.Time) ([]byte, error) {
	r.Version = RecordVersion
	r.SizeBytes = r.Spec.SizeBytes
	r.UpdatedAt = t
	if r.CreatedAt.IsZero() {
		r.CreatedAt = t
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Staged is a record written and synced under a name that no reader looks
// at (.<uuid>.json.next): not a record yet, so a crash leaves nothing that
// speaks for the volume. Commit makes it the volume's record with a rename
// and a sync of the directory. Staging while a device is still being
// probed or written takes the write and the file's fsync off the critical
// path. Only the holder of the volume's lock stages, which is why one fixed
// name per volume suffices; the next stage or Remove replaces a leftover.
type Staged struct {
	d    Dir
	r    Record
	data []byte
	at   time.Time
}

func (d Dir) staged(u string) string { return filepath.Join(d.volumes(), "."+u+".json.next") }

// Stage writes what Save would write for r now, without making it the
// record. r is copied: the caller may go on changing it.
func (d Dir) Stage(r *Record) (*Staged, error) {
	st := &Staged{d: d, r: *r, at: time.Now().UTC()}
	b, err := encode(&st.r, st.at)
	if err != nil {
		return nil, err
	}
	st.data = b
	p := d.staged(r.Spec.UUID)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := writeSynced(f, b, 0o600); err != nil {
		os.Remove(p)
		return nil, err
	}
	return st, nil
}

// writeSynced writes data to f, sets its mode, syncs and closes it.
func writeSynced(f *os.File, data []byte, perm os.FileMode) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Holds tells whether committing st would write exactly what Save(r)
// would, the time of saving aside.
func (st *Staged) Holds(r *Record) bool {
	c := *r
	b, err := encode(&c, st.at)
	return err == nil && string(b) == string(st.data)
}

// Commit makes the staged record the volume's record and stamps r, which
// must hold the same (see Holds), as Save would have.
func (st *Staged) Commit(r *Record) error {
	u := st.r.Spec.UUID
	if err := os.Rename(st.d.staged(u), st.d.path(u)); err != nil {
		return err
	}
	r.Version, r.SizeBytes, r.CreatedAt, r.UpdatedAt = st.r.Version, st.r.SizeBytes, st.r.CreatedAt, st.r.UpdatedAt
	return syncDir(st.d.volumes())
}

// Discard removes the staged file.
func (st *Staged) Discard() { os.Remove(st.d.staged(st.r.Spec.UUID)) }

// Remove deletes a record (missing is fine), and a staged one left over.
func (d Dir) Remove(u string) error {
	if err := os.Remove(d.path(u)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	os.Remove(d.staged(u))
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
	return writeAtomic(path, data, perm, true)
}

// WriteFileAtomicOrdered is WriteFileAtomic for a record that only has
// to outlast what the caller does next on the same filesystem (an
// intent before a copy): on xfs, whose log reaches the disk in order,
// the rename is left for the caller's next fsync there to write out,
// and a crash before that loses the record only together with
// everything done after it. The content is synced before the rename
// all the same, so the name never holds less than the whole record.
// Elsewhere it is WriteFileAtomic.
func WriteFileAtomicOrdered(path string, data []byte, perm os.FileMode) error {
	var fs unix.Statfs_t
	ordered := unix.Statfs(filepath.Dir(path), &fs) == nil && fs.Type == unix.XFS_SUPER_MAGIC
	return writeAtomic(path, data, perm, !ordered)
}

// writeAtomic writes data beside path, synced, renames it over path, and
// syncs the directory when dirSync says so.
func writeAtomic(path string, data []byte, perm os.FileMode, dirSync bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := writeSynced(f, data, perm); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	if !dirSync {
		return nil
	}
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
