package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/filecopy"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Snapshots: a point-in-time copy of a sparse volume's backing file, kept
// by the node under snapshots/<volume uuid>/ as an image and a record of
// its own: never a volume, never attached, never offered as storage.

// Snapshot phases.
const (
	// SnapshotTaking is recorded before a freeze, so that a listing shows
	// the snapshot a freeze record beside it (<name>.freeze) belongs to;
	// a partial image needs no record (every name under snapshots/ is
	// ours).
	SnapshotTaking = "taking"
	SnapshotTaken  = "taken"
)

// Snapshot is a snapshot's record, and what the binary prints for one.
type Snapshot struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	// Volume is the volume's name and UUID when the snapshot was taken.
	Volume     string `json:"volume"`
	VolumeUUID string `json:"volumeUUID"`
	Phase      string `json:"phase"`
	// Method: reflink (no space, no time) or sparse-copy (the data
	// extents, holes kept).
	Method filecopy.Method `json:"method,omitempty"`
	// Frozen: the volume's filesystem was mounted and frozen (FIFREEZE)
	// for the step that makes the copy one instant's: the reflink, or the
	// last pass of a copy made unfrozen; FrozenFor says how long writes
	// waited. Else the copy is crash-consistent as of its start.
	Frozen    bool   `json:"frozen"`
	FrozenFor string `json:"frozenFor,omitempty"`
	// StaleFreeze names the mountpoint a stale freeze of this snapshot's
	// holds (the run and its watchdog gone): set when listed.
	StaleFreeze string `json:"staleFreeze,omitempty"`
	// Size is the image's size, Allocated the space it really uses
	// (shared extents of a reflink count here too: du's view).
	Size      int64     `json:"size"`
	Allocated int64     `json:"allocated"`
	Mode      string    `json:"mode"`
	FSType    string    `json:"fsType,omitempty"`
	TakenAt   time.Time `json:"takenAt"`
	Image     string    `json:"image"`
	Took      string    `json:"took,omitempty"`
	// Freezing was written by salt-volume-exec 0.3 before it froze, so it
	// may name a freeze that never was ours: read only to report it (a
	// freeze of ours is in the freeze record, see snapshot_freeze.go).
	Freezing string `json:"freezing,omitempty"`
	// Owner is who took the snapshot when that was the control plane: its
	// snapshot record's id (--owner), the same on every retry. Empty: taken
	// through Salt (a state, a schedule, salt-call) or recorded by a
	// salt-volume-exec older than owners; either way not the control
	// plane's, which never takes such a snapshot over (checkOwner).
	Owner string `json:"owner,omitempty"`

	// An LVM snapshot (methods lvm-thick, lvm-thin) is an LV of its own,
	// vg/name in LV, selected by LVUUID once taken; a thick one has
	// COWSize bytes of copy-on-write space (Allocated too).
	LV      string `json:"lv,omitempty"`
	LVUUID  string `json:"lvUUID,omitempty"`
	COWSize int64  `json:"cowSize,omitempty"`
	// DataPercent is read from LVM whenever the snapshot is listed: a
	// thick snapshot's copy-on-write space used, or a thin one's pool's
	// data; Warning says when it is close to overflowing or has.
	DataPercent *float64 `json:"dataPercent,omitempty"`
	// MetadataPercent: a thin snapshot's pool's metadata, read with it.
	MetadataPercent *float64 `json:"metadataPercent,omitempty"`
	Warning         string   `json:"warning,omitempty"`
	// Lost: the snapshot's data is gone (a thick snapshot that overflowed,
	// an LV someone removed): only deleting it is left.
	Lost bool `json:"lost,omitempty"`
}

// validSnapshotName: lower-case letters, digits, '-' and '.', at most 63,
// starting and ending with a letter or digit. Checked by hand: the
// equivalent regexp, compiled at every start of the binary, cost a
// quarter of a millisecond of each snapshot's time.
func validSnapshotName(n string) bool {
	if len(n) == 0 || len(n) > 63 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '.') && i > 0 && i < len(n)-1:
		default:
			return false
		}
	}
	return true
}

func (e *Engine) snapshotDir(u string) string { return filepath.Join(e.State.Root, "snapshots", u) }

func (e *Engine) snapshotPaths(u, name string) (record, image string) {
	d := e.snapshotDir(u)
	return filepath.Join(d, name+".json"), filepath.Join(d, name+".img")
}

// SnapshotOptions: COWSize is a thick LVM snapshot's copy-on-write space
// (0: a quarter of the LV); FreezeLimit bounds how long a sparse volume's
// mounted filesystem may be frozen (0: DefaultFreezeLimit; see
// CheckFreezeLimit).
type SnapshotOptions struct {
	COWSize     int64
	FreezeLimit time.Duration
	// Owner (--owner): the control plane's id for this snapshot. A
	// snapshot of that name already on the node is answered only if it is
	// that owner's; empty (Salt's own callers): answered whoever took it.
	Owner string
}

// validOwner: an owner id is at most 128 of letters, digits, '-', '_', '.'
// and ':'.
func validOwner(o string) bool {
	if len(o) > 128 {
		return false
	}
	for i := 0; i < len(o); i++ {
		c := o[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// checkOwner refuses to answer (or take over, or delete) snapshot old for
// owner when owner is set and old is not that owner's: a snapshot of that
// name that Salt took, or another control plane record's, stays what it
// is. Nothing is changed.
func checkOwner(old *Snapshot, owner, volume string) error {
	if owner == "" || old == nil || old.Owner == owner {
		return nil
	}
	who := "through Salt (a state, a schedule or salt-call) or by an older salt-volumes"
	if old.Owner != "" {
		who = "for another control-plane snapshot (owner " + old.Owner + ")"
	}
	when := ""
	if !old.TakenAt.IsZero() {
		when = " at " + old.TakenAt.UTC().Format(time.RFC3339)
	} else if old.Phase != SnapshotTaken {
		when = " (still being taken)"
	}
	return refused("name_taken", "snapshot %s of %s is on this node already, taken %s%s, not by this request: it is not taken over and nothing was changed: take this snapshot under another name", old.Name, volume, who, when)
}

// TakeSnapshot copies the sparse volume s's backing file as snapshot name;
// a mounted filesystem is frozen only around the step that makes the copy
// one instant's, and never longer than opts.FreezeLimit (copyFrozen).
// Taking it again answers the snapshot taken; a crash in the middle is
// finished by the next run, which thaws nothing but a freeze of its own
// that was left and starts the copy over.
func (e *Engine) TakeSnapshot(ctx context.Context, s *spec.Spec, name string, opts SnapshotOptions) (*Snapshot, error) {
	if !validSnapshotName(name) {
		return nil, invalid("invalid_snapshot_name", "snapshot name %q: lower-case letters, digits, '-' and '.', at most 63, starting and ending with a letter or digit", name)
	}
	if !validOwner(opts.Owner) {
		return nil, invalid("invalid_owner", "owner %q: at most 128 letters, digits, '-', '_', '.' and ':'", opts.Owner)
	}
	limit, err := freezeLimit(opts.FreezeLimit)
	if err != nil {
		return nil, err
	}
	l, rec, err := e.lockPrepared(s, "snapshot")
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	if encrypted(rec.Spec) {
		return nil, refused("not_supported", "volume %s is encrypted: snapshots of encrypted volumes are not in this release", rec.Spec.Name)
	}
	if rec.Spec.SparseLoopDevice == nil {
		// LVM takes no snapshot of an origin a snapshot merges into, and
		// one of the LV between the restore's steps would be of neither.
		if err := e.refuseLVMRestorePending(rec.Spec, "", "taking snapshot "+name); err != nil {
			return nil, err
		}
		return e.takeLVMSnapshot(ctx, rec, name, opts)
	}
	o := opFor(e, rec.Spec)
	if err := e.settleFreezes(o, s.UUID, name, false); err != nil {
		return nil, err
	}
	recPath, img := e.snapshotPaths(s.UUID, name)
	old, err := readSnapshot(recPath)
	if err == nil {
		if err := checkOwner(old, opts.Owner, s.Name); err != nil {
			return nil, err
		}
	}
	if err == nil && old.Freezing != "" {
		e.reportOldFreezing(o, old.Freezing)
	}
	if err == nil && old.Phase == SnapshotTaken {
		if _, err := os.Stat(img); err == nil {
			return old, nil
		}
		return nil, failed("snapshot_missing", os.ErrNotExist, "snapshot %s of %s: its record is here, its image %s is gone: delete the snapshot and take it again", name, s.Name, img)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, failed("state", err, "reading snapshot %s of %s", name, s.Name)
	}
	if _, err := e.State.SnapshotDir(s.UUID); err != nil {
		return nil, failed("state", err, "the snapshots of %s", s.Name)
	}
	snap := &Snapshot{Version: 1, Name: name, Volume: rec.Spec.Name, VolumeUUID: s.UUID, Phase: SnapshotTaking,
		Mode: rec.Spec.Mode, FSType: rec.Spec.FSType, Image: img, Owner: opts.Owner}
	part := img + ".part"
	os.Remove(part)
	file := e.State.SparseFile(s.UUID)
	reflink, err := e.reserveSnapshot(snap, file, recPath)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	q, err := e.quiesce(rec.Spec, file, reflink)
	if err != nil {
		e.abandonSnapshot(s.UUID, name, part)
		return nil, err
	}
	var method filecopy.Method
	if q.mount == nil {
		method, err = e.copyUnmounted(ctx, o, snap, q, file, part)
	} else {
		method, err = e.copyFrozen(ctx, o, snap, q.mount, file, part, limit)
		q.mount.root.Close()
	}
	if err != nil {
		e.abandonSnapshot(s.UUID, name, part)
		return nil, err
	}
	if err := os.Rename(part, img); err != nil {
		return nil, failed("snapshot_copy", err, "naming snapshot image %s", img)
	}
	snap.Took = time.Since(start).Round(time.Millisecond).String()
	st, err := os.Stat(img)
	if err != nil {
		return nil, failed("snapshot_copy", err, "reading %s", img)
	}
	snap.Size = st.Size()
	snap.Allocated, _ = filecopy.Allocated(img)
	snap.Method, snap.Phase, snap.TakenAt = method, SnapshotTaken, start.UTC()
	if err := writeSnapshot(recPath, snap); err != nil {
		return nil, failed("state", err, "recording snapshot %s", name)
	}
	o.step("snapshot-taken", "snapshot", name, "method", string(method))
	return snap, nil
}

// lockPrepared locks volume s and reads its record, refusing a volume
// not prepared on this node (nothing to what); the caller unlocks.
func (e *Engine) lockPrepared(s *spec.Spec, what string) (*nodestate.Lock, *nodestate.Record, error) {
	l, err := e.lockVolume(s.UUID)
	if err != nil {
		return nil, nil, err
	}
	rec, err := e.State.Load(s.UUID)
	if err != nil {
		l.Unlock()
		return nil, nil, failed("state", err, "reading the record of volume %s", s.Name)
	}
	if rec == nil || rec.Phase != nodestate.PhasePrepared {
		l.Unlock()
		return nil, nil, refused("not_prepared", "volume %s (%s) is not prepared on this node: nothing to %s", s.Name, s.UUID, what)
	}
	return l, rec, nil
}

// reserveSnapshot checks that the node has room for snapshot snap of the
// sparse volume whose file is file, and records it (phase taking, with
// the data it will pin) before anything is copied: a run killed from here
// on leaves a record that lists the snapshot, counts its room and lets a
// delete remove whatever was copied. Under the global lock, so that two
// snapshots cannot both take the last room.
func (e *Engine) reserveSnapshot(snap *Snapshot, file, recPath string) (reflink bool, err error) {
	g, err := e.State.Lock("global")
	if err != nil {
		return false, failed("lock", err, "locking the node's state")
	}
	defer g.Unlock()
	data, err := filecopy.Allocated(file)
	if err != nil {
		return false, failed("snapshot_copy", err, "reading %s", file)
	}
	// A retry of this snapshot's own reservation is not counted twice.
	var counted int64
	if old, err := readSnapshot(recPath); err == nil && old.Phase == SnapshotTaking {
		counted = old.Allocated
	}
	reflink = filecopy.CanReflink(file, snap.Image+".part.probe")
	if err := e.checkCopyRoom(fmt.Sprintf("snapshot %s of %s", snap.Name, snap.Volume), data, data, reflink, counted); err != nil {
		// Refused: nothing of this snapshot is kept, not even what a
		// killed earlier try copied (never taken, it is nobody's).
		for _, p := range []string{snap.Image + ".part", snap.Image, recPath} {
			_ = os.Remove(p)
		}
		return false, err
	}
	snap.Allocated = data
	// Ordered: the copy's own records and fsyncs come after it on the
	// same filesystem, so no image can outlast a crash without it.
	b, err := json.MarshalIndent(snap, "", "  ")
	if err == nil {
		err = nodestate.WriteFileAtomicOrdered(recPath, append(b, '\n'), 0o600)
	}
	if err != nil {
		return false, failed("state", err, "recording snapshot %s", snap.Name)
	}
	return reflink, nil
}

// quiesced is what quiesce found: a mount to freeze through, or the loop
// devices, flushed, and who else holds them.
type quiesced struct {
	mount *volumeMount
	devs  []loopdev.Device
	inUse string
}

// quiesce finds a mount of a Filesystem volume's filesystem, in any mount
// namespace (findMount), for copyFrozen to freeze. Otherwise it finds who
// else holds the loop devices (a copy made while somebody may write them
// is torn unless made in one instant: copyUnmounted) and flushes their
// writes to the file.
//
// An unmounted Filesystem volume whose copy will be a reflink (one
// instant, whoever writes) is not searched for holders: the search reads
// every process's open files, 10 ms of a 27 ms snapshot with 76
// processes here (more on a busy node), to name users nobody expects of
// a filesystem no one mounted. A Block volume's holders are still named
// (its users write the device, not a filesystem), and should the reflink
// fail after all, copyUnmounted looks for holders before keeping a copy.
func (e *Engine) quiesce(s *spec.Spec, file string, reflink bool) (*quiesced, error) {
	devs, err := loopdev.Find(file)
	if err != nil {
		return nil, failed("loop", err, "looking for the loop device of %s", file)
	}
	var who []string
	for _, d := range devs {
		bd, err := blockdev.Stat(d.Path)
		if err != nil {
			return nil, failed("loop", err, "reading %s", d.Path)
		}
		h := ""
		if s.Mode == spec.ModeFilesystem {
			m, unusable, err := findMount(d.Path, bd)
			if err != nil {
				return nil, failed("mounts", err, "looking for the mounts of %s", d.Path)
			}
			if m != nil {
				// One mount's freeze holds the whole filesystem.
				return &quiesced{mount: m}, nil
			}
			if len(unusable) > 0 {
				h = "mounted where it cannot be frozen safely (" + strings.Join(unusable, "; ") + ")"
			}
		}
		if h == "" && !(reflink && s.Mode == spec.ModeFilesystem) {
			if h, err = holdersOf(d, bd, file); err != nil {
				return nil, failed("loop", err, "looking for the users of %s", d.Path)
			}
		}
		if h != "" {
			who = append(who, d.Path+" is "+h)
		}
		f, err := os.OpenFile(d.Path, os.O_RDONLY, 0)
		if err != nil {
			return nil, failed("loop", err, "opening %s", d.Path)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return nil, failed("loop", err, "flushing %s", d.Path)
		}
	}
	return &quiesced{devs: devs, inUse: strings.Join(who, "; ")}, nil
}

// opFor is an op for steps outside prepare and unprepare.
func opFor(e *Engine, s *spec.Spec) *op { return &op{e: e, s: s} }

// DeleteSnapshot removes snapshot name of volume uuid: image first, then
// the record (a crash between leaves a record whose image is gone, which
// the next delete finishes). Deleting a snapshot that is not there is done.
func (e *Engine) DeleteSnapshot(ctx context.Context, s *spec.Spec, name string) error {
	return e.DeleteSnapshotThawing(ctx, s, name, false)
}

// DeleteSnapshotThawing is DeleteSnapshot; thawStale (an operator's
// --thaw-stale) first thaws any stale freeze an earlier run of a
// snapshot of s left, however old, after the device and mount checks
// (settleFreezes).
func (e *Engine) DeleteSnapshotThawing(ctx context.Context, s *spec.Spec, name string, thawStale bool) error {
	return e.DeleteSnapshotOwned(ctx, s, name, thawStale, "")
}

// DeleteSnapshotOwned is DeleteSnapshotThawing for owner (--owner, the
// control plane's id of the snapshot): a snapshot of that name that is
// not owner's is refused (name_taken) and kept; "" deletes whoever's.
// Any delete is refused while a restore of the volume from this snapshot
// is unfinished (its leftover copy would outlive the snapshot it is of).
func (e *Engine) DeleteSnapshotOwned(ctx context.Context, s *spec.Spec, name string, thawStale bool, owner string) error {
	if !validSnapshotName(name) {
		return invalid("invalid_snapshot_name", "snapshot name %q: lower-case letters, digits, '-' and '.'", name)
	}
	if !validOwner(owner) {
		return invalid("invalid_owner", "owner %q: at most 128 letters, digits, '-', '_', '.' and ':'", owner)
	}
	l, err := e.lockVolume(s.UUID)
	if err != nil {
		return err
	}
	defer l.Unlock()
	recPath, img := e.snapshotPaths(s.UUID, name)
	old, err := readSnapshot(recPath)
	if err == nil {
		if err := checkOwner(old, owner, s.Name); err != nil {
			return err
		}
	}
	if err := e.refuseRestorePending(s, name, "deleting snapshot "+name); err != nil {
		return err
	}
	if err := e.settleFreezes(opFor(e, s), s.UUID, name, thawStale); err != nil {
		return err
	}
	old, err = readSnapshot(recPath)
	if err == nil && old.LV != "" {
		return e.deleteLVMSnapshot(ctx, s, old, recPath)
	}
	if errors.Is(err, os.ErrNotExist) {
		// No record: at most an interrupted run's copy (every name
		// under snapshots/ is ours), which a run of 0.3 could leave
		// named before its record was written.
		for _, p := range []string{img + ".part", img + ".part.probe", img} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return failed("snapshot_delete", err, "removing %s", p)
			}
		}
		return nil
	}
	for _, p := range []string{img + ".part", img + ".part.probe", img, recPath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return failed("snapshot_delete", err, "removing %s", p)
		}
	}
	_ = os.Remove(e.snapshotDir(s.UUID)) // only when it is empty
	return nil
}

// Snapshots lists the snapshots of volume uuid ("" for every volume's),
// by volume then name, LVM snapshots with their fill level as of now.
func (e *Engine) Snapshots(uuid string) ([]*Snapshot, error) {
	out, err := e.snapshotRecords(uuid)
	if err == nil {
		e.lvmFill(out)
	}
	return out, err
}

// snapshotRecords is Snapshots as recorded, without asking LVM; a stale
// freeze beside a record (a local read) is reported with it.
func (e *Engine) snapshotRecords(uuid string) ([]*Snapshot, error) {
	root := filepath.Join(e.State.Root, "snapshots")
	pattern := filepath.Join(root, "*", "*.json")
	if uuid != "" {
		pattern = filepath.Join(root, uuid, "*.json")
	}
	paths, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	out := []*Snapshot{}
	for _, p := range paths {
		s, err := readSnapshot(p)
		if err != nil {
			return nil, failed("state", err, "reading %s", p)
		}
		if s.Phase == SnapshotTaking && s.LV == "" && e.dropAbandonedUnlocked(s.VolumeUUID, s.Name) {
			continue // a take abandoned, its freeze record gone since
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].VolumeUUID != out[j].VolumeUUID {
			return out[i].VolumeUUID < out[j].VolumeUUID
		}
		return out[i].Name < out[j].Name
	})
	e.staleFreezes(out)
	return out, nil
}

func readSnapshot(p string) (*Snapshot, error) {
	var s Snapshot
	if err := readRecord(p, &s); err != nil {
		return nil, err
	}
	if s.Name+".json" != filepath.Base(p) || !strings.Contains(p, s.VolumeUUID) {
		return nil, fmt.Errorf("%s: names snapshot %s of %s", p, s.Name, s.VolumeUUID)
	}
	return &s, nil
}

func writeSnapshot(p string, s *Snapshot) error { return writeRecord(p, s) }

// readRecord reads one of the node's JSON records (a snapshot's, a
// restore's) from p into v, refusing one of a version newer than 1.
func readRecord(p string, v any) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	var h struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(b, &h); err == nil && h.Version > 1 {
		return fmt.Errorf("%s: record version %d is newer than this salt-volume-exec reads (1)", p, h.Version)
	}
	return nil
}

// writeRecord writes record v to p, atomically.
func writeRecord(p string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return nodestate.WriteFileAtomic(p, append(b, '\n'), 0o600)
}
