package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/filecopy"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// Restore in place: a sparse volume's backing file is put back to one of
// its snapshots under the same path, the same UUID and (where the kernel
// lets us) the same loop number, only while nothing uses the volume. The
// image is copied (reflink, else a sparse copy) to a file beside the
// volume's, which replaces it with a rename while no loop device is bound
// to it: at every moment the volume's path holds one whole file, the old
// or the restored, and the loop device shows only that.

// Restore phases, in the restore record.
const (
	// restoreCopying: the copy may be partial. A run that finds it
	// removes the copy and the record: the volume is as before.
	restoreCopying = "copying"
	// restoreSwapping: the copy is whole and synced. A run that finds it
	// finishes the swap: the volume ends as the snapshot.
	restoreSwapping = "swapping"
)

// restoreRecord is kept beside the volume's file while a restore runs.
type restoreRecord struct {
	Version    int    `json:"version"`
	Snapshot   string `json:"snapshot"`
	VolumeUUID string `json:"volumeUUID"`
	Phase      string `json:"phase"`
	// Device is the loop device the volume had when the restore began,
	// which it gets back if nobody took it meanwhile.
	Device    string          `json:"device,omitempty"`
	Method    filecopy.Method `json:"method,omitempty"`
	StartedAt time.Time       `json:"startedAt"`
	// SnapshotTakenAt and SnapshotImage (the image's inode) say which
	// snapshot of that name the copy is of: a leftover copy of a snapshot
	// deleted and taken again since is not put back (a record of an older
	// version, without them, is not trusted either).
	SnapshotTakenAt time.Time `json:"snapshotTakenAt,omitempty"`
	SnapshotImage   uint64    `json:"snapshotImage,omitempty"`

	// An LVM volume's restore (restores/<uuid>.json, lvmrestore.go): its
	// phases are lvmRestore*, Method lvm-thick or lvm-thin, Device the
	// volume's device-mapper device when it began. The snapshot's LV by
	// name and LVM UUID, and its size (the origin's when it was taken);
	// the volume's LV by LVM UUID; the thin device ids of both (a thin
	// merge gives the volume's LV the snapshot's); KeepLV, a thin
	// snapshot of the snapshot that takes its name once it merged, by
	// LVM UUID once made.
	SnapshotLV     string `json:"snapshotLV,omitempty"`
	SnapshotLVUUID string `json:"snapshotLVUUID,omitempty"`
	SnapshotSize   int64  `json:"snapshotSize,omitempty"`
	// SnapshotUsed: a thick snapshot's changed blocks (bytes) before its
	// merge, what the merge's progress counts to (0: not known).
	SnapshotUsed   int64  `json:"snapshotUsed,omitempty"`
	OriginLVUUID   string `json:"originLVUUID,omitempty"`
	OriginThinID   string `json:"originThinID,omitempty"`
	SnapshotThinID string `json:"snapshotThinID,omitempty"`
	KeepLV         string `json:"keepLV,omitempty"`
	KeepLVUUID     string `json:"keepLVUUID,omitempty"`
	// Warnings the checks found, for the answer of the run that finishes.
	Warnings []string `json:"warnings,omitempty"`
}

// imageIno is the inode of a snapshot's image (0 if it cannot be read).
func imageIno(img string) uint64 {
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		return 0
	}
	return st.Ino
}

// refuseRestorePending refuses what (a growth, a snapshot's deletion) of
// volume s while a restore of s has not finished (its record is there);
// snapshot, when set, limits that to a restore from that snapshot.
func (e *Engine) refuseRestorePending(s *spec.Spec, snapshot, what string) error {
	if err := e.refuseLVMRestorePending(s, snapshot, what); err != nil {
		return err
	}
	recPath, temp := e.restorePaths(s.UUID)
	rr, err := readRestore(recPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return failed("state", err, "reading %s", recPath)
	}
	if snapshot != "" && rr.Snapshot != snapshot {
		return nil
	}
	return refused("restore_pending", "volume %s: a restore from snapshot %s (started %s) did not finish, so %s is refused: finish it by running the restore again (salt-volume-exec snapshot-restore --name %s, or the API's or Salt's restore), or, while %s is still there (the volume was not swapped yet), roll it back by removing %s and %s; then try again",
		s.Name, rr.Snapshot, rr.StartedAt.Format(time.RFC3339), what, rr.Snapshot, temp, recPath, temp)
}

// SnapshotRestore is what snapshot-restore prints.
type SnapshotRestore struct {
	Snapshot string          `json:"snapshot"`
	Volume   *Result         `json:"volume"`
	Method   filecopy.Method `json:"method,omitempty"`
	// SameDevice: the volume is on the loop device it had before.
	SameDevice bool   `json:"sameDevice"`
	Took       string `json:"took"`
	// Finished names a restore an earlier, interrupted run had left
	// half done, which this run rolled back or finished first.
	Finished string   `json:"finished,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// SnapshotConsumed: the restore used the snapshot up (a thick LVM
	// snapshot merges into its volume and is gone, its record with it).
	SnapshotConsumed bool `json:"snapshotConsumed"`
}

// Names outside the UUID-named files that list and capacity count.
func (e *Engine) restorePaths(u string) (record, temp string) {
	f := e.State.SparseFile(u)
	return f + ".restore.json", f + ".restore"
}

// RestoreSnapshot puts the sparse volume s back to its snapshot name. A
// run killed after any step is rolled back (before the copy is whole) or
// finished (after) by the next run of the same restore.
func (e *Engine) RestoreSnapshot(ctx context.Context, s *spec.Spec, name string) (*SnapshotRestore, error) {
	if !validSnapshotName(name) {
		return nil, invalid("invalid_snapshot_name", "snapshot name %q: lower-case letters, digits, '-' and '.'", name)
	}
	start := time.Now()
	l, rec, err := e.lockPrepared(s, "restore")
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	if same, why := s.SameVolume(rec.Spec); !same {
		return nil, refused("conflict", "volume %s on this node has a different spec (%s): pass the spec it was prepared with", s.UUID, why)
	}
	s = rec.Spec
	if s.LVMLogicalVolume != nil {
		return e.restoreFromLVMSnapshot(ctx, rec, name, start)
	}
	if s.SparseLoopDevice == nil {
		if rec.DMUUID != "" {
			return nil, refused("restore_unsupported", "volume %s is a raw volume on an operator's LV: salt-volumes does not restore it in place (that would deactivate the operator's LV and merge into it); an operator can merge the snapshot by hand while the LV is unmounted and unused (lvconvert --merge VG/SNAPSHOT-LV, the LV salt-volume-exec snapshots shows; a thick snapshot is gone afterwards), or clone it (a new LVM volume with source.snapshot): nothing was changed", s.Name)
		}
		return nil, refused("restore_unsupported", "volume %s is a raw volume: it has no snapshots of its own to restore: nothing was changed", s.Name)
	}
	o := opFor(e, s)
	// A freeze an earlier snapshot run of this volume left: thawed while
	// it can only be ours, else reported (settleFreezes).
	if err := e.settleFreezes(o, s.UUID, "", false); err != nil {
		return nil, err
	}
	out := &SnapshotRestore{Snapshot: name}
	recPath, temp := e.restorePaths(s.UUID)
	if rr, err := readRestore(recPath); err == nil {
		if rr.Phase == restoreSwapping {
			if rr.Snapshot != name {
				return nil, refused("restore_pending", "volume %s: a restore from snapshot %s did not finish: run snapshot-restore --name %s again first (the copy is whole, the next run finishes it)", s.Name, rr.Snapshot, rr.Snapshot)
			}
			if keep, err := e.restoreCopyCurrent(rr, temp); err != nil {
				return nil, err
			} else if keep {
				out.Finished = rr.Snapshot
				return e.finishRestore(ctx, o, rr, out, start)
			}
			// The copy left is of another snapshot of that name (deleted
			// and taken again since) or cannot be told: it is dropped
			// below, and the restore starts over from the snapshot as
			// it is now.
			o.step("restore-stale-copy-dropped", "snapshot", rr.Snapshot)
		}
		// Nothing of the volume was touched yet: forget the copy.
		if err := e.dropRestore(s.UUID); err != nil {
			return nil, err
		}
		out.Finished = rr.Snapshot
		o.step("restore-rolled-back", "snapshot", rr.Snapshot)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, failed("state", err, "reading %s", recPath)
	}

	snapPath, img := e.snapshotPaths(s.UUID, name)
	snap, err := readSnapshot(snapPath)
	if errors.Is(err, os.ErrNotExist) || (err == nil && snap.Phase != SnapshotTaken) {
		return nil, invalid("snapshot_not_found", "snapshot %s of volume %s is not on this node (salt-volume-exec snapshots lists them): nothing was changed", name, s.Name)
	}
	if err != nil {
		return nil, failed("state", err, "reading snapshot %s", name)
	}
	switch {
	case snap.VolumeUUID != s.UUID:
		return nil, refused("snapshot_mismatch", "snapshot %s is of volume %s, not of %s (%s): nothing was changed", name, snap.VolumeUUID, s.Name, s.UUID)
	case snap.LV != "":
		return nil, refused("snapshot_mismatch", "snapshot %s is an LVM snapshot (%s), and volume %s is a sparse volume: nothing was changed", name, snap.LV, s.Name)
	case snap.Mode != s.Mode || snap.FSType != s.FSType:
		return nil, refused("snapshot_mismatch", "snapshot %s holds a %s %s volume, and %s is %s %s: nothing was changed", name, snap.Mode, snap.FSType, s.Name, s.Mode, s.FSType)
	case snap.Size > s.SizeBytes:
		return nil, refused("snapshot_mismatch", "snapshot %s (%s) is larger than volume %s (%s): nothing was changed", name, spec.FormatSize(snap.Size), s.Name, spec.FormatSize(s.SizeBytes))
	}
	if _, err := os.Stat(img); err != nil {
		return nil, failed("snapshot_missing", err, "snapshot %s of %s: its image %s cannot be read: nothing was changed", name, s.Name, img)
	}

	file := e.State.SparseFile(s.UUID)
	if f, err := e.State.OpenSparse(s.UUID, os.O_RDONLY); err != nil {
		return nil, refused("sparse_file", "%v", err)
	} else {
		f.Close()
	}
	devs, err := refuseRestoreInUse(s, file)
	if err != nil {
		return nil, err
	}
	rr := &restoreRecord{Version: 1, Snapshot: name, VolumeUUID: s.UUID, Phase: restoreCopying, StartedAt: start.UTC(),
		SnapshotTakenAt: snap.TakenAt, SnapshotImage: imageIno(img)}
	if len(devs) > 0 {
		rr.Device = devs[0].Name
	}
	os.Remove(temp) // no record speaks for it: nobody's, and not counted
	if err := e.imageRoom(fmt.Sprintf("restoring %s to snapshot %s", s.Name, name), "restore_copy", img, temp); err != nil {
		return nil, err
	}
	if err := writeRecord(recPath, rr); err != nil {
		return nil, failed("state", err, "recording the restore of %s", s.Name)
	}
	o.step("restore-recorded", "snapshot", name)

	method, err := filecopy.CopyProgress(ctx, img, temp, o.progress("copying", "snapshot", name))
	if err != nil {
		_ = e.dropRestore(s.UUID)
		return nil, failed("restore_copy", err, "copying snapshot %s: nothing was changed", name)
	}
	if err := e.readyRestore(o, temp); err != nil {
		_ = e.dropRestore(s.UUID)
		return nil, err
	}
	o.step("restore-copied", "snapshot", name, "method", string(method))
	rr.Phase, rr.Method = restoreSwapping, method
	if err := writeRecord(recPath, rr); err != nil {
		_ = e.dropRestore(s.UUID)
		return nil, failed("state", err, "recording the restore of %s", s.Name)
	}
	o.step("restore-ready", "snapshot", name)
	return e.finishRestore(ctx, o, rr, out, start)
}

// readyRestore sizes the copy as the volume is now: a volume grown since
// the snapshot keeps its size (a Block volume's table laid out to the end
// again, as a growth does), and syncs it before any record says it is whole.
func (e *Engine) readyRestore(o *op, temp string) error {
	s := o.s
	f, err := os.OpenFile(temp, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return failed("restore_copy", err, "opening %s", temp)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return failed("restore_copy", err, "reading %s", temp)
	}
	if st.Size() > s.SizeBytes {
		return refused("snapshot_mismatch", "the restored copy %s (%s) is larger than volume %s (%s): not put in place", temp, spec.FormatSize(st.Size()), s.Name, spec.FormatSize(s.SizeBytes))
	}
	if st.Size() < s.SizeBytes {
		if err := f.Truncate(s.SizeBytes); err != nil {
			return failed("restore_copy", err, "sizing %s", temp)
		}
		if s.Mode == spec.ModeBlock {
			if err := e.growTable(o, f, s.SizeBytes, 512); err != nil {
				return err
			}
		}
	}
	if err := f.Sync(); err != nil {
		return failed("restore_copy", err, "syncing %s", temp)
	}
	return nil
}

// finishRestore swaps the whole copy in and binds the volume's loop
// device to it again. Every step looks at what is there (the copy still
// beside the file: not swapped yet), so a run killed anywhere in here is
// finished by the next.
func (e *Engine) finishRestore(ctx context.Context, o *op, rr *restoreRecord, out *SnapshotRestore, start time.Time) (*SnapshotRestore, error) {
	s := o.s
	file := e.State.SparseFile(s.UUID)
	recPath, temp := e.restorePaths(s.UUID)
	res := baseResult(s)
	res.BackingFile = file
	if _, err := os.Lstat(temp); err == nil {
		// Sized again to the volume as it is now: a run that left the
		// copy whole may be long before a growth.
		if err := e.readyRestore(o, temp); err != nil {
			return nil, err
		}
		// Checked again right before the detach: a rerun may come long
		// after the run that checked first.
		devs, err := refuseRestoreInUse(s, file)
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			if s.Mode == spec.ModeBlock {
				_ = loopdev.RemovePartition(d.Name, 1)
			}
			if err := loopdev.Detach(ctx, d, e.DetachWait); err != nil {
				return nil, failed("detach", err, "detaching %s", d.Path)
			}
			o.step("restore-detached", "device", d.Path)
		}
		if err := os.Rename(temp, file); err != nil {
			return nil, failed("restore_swap", err, "putting the restored copy in place of %s", file)
		}
		if err := syncDirOf(filepath.Dir(file)); err != nil {
			return nil, failed("restore_swap", err, "syncing %s", filepath.Dir(file))
		}
		o.changed = true
		o.step("restore-swapped", "path", file)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, failed("restore_swap", err, "reading %s", temp)
	}
	devs, err := loopdev.Find(file)
	if err != nil {
		return nil, failed("loop", err, "looking for the loop device of %s", file)
	}
	var dev loopdev.Device
	if len(devs) > 0 {
		dev = devs[0] // a restore at boot bound it after an interrupted run
		out.SameDevice = dev.Name == rr.Device
	} else {
		want := loopdev.Device{}
		if rr.Device != "" {
			want = loopdev.Device{Name: rr.Device, Path: "/dev/" + rr.Device}
		}
		dev, out.SameDevice, err = loopdev.Reattach(ctx, want, file)
		if err != nil {
			return nil, failed("attach", err, "attaching %s", file)
		}
		o.changed = true
		o.step("restore-attached", "device", dev.Path, "same", out.SameDevice)
	}
	if rr.Device != "" && !out.SameDevice {
		out.Warnings = append(out.Warnings, fmt.Sprintf("the volume was on /dev/%s, which another program took while it was detached: it is on %s now (its persistent path %s follows)", rr.Device, dev.Path, s.PersistentPath()))
	}
	res.DeviceName, res.DevicePath = dev.Name, dev.Path
	if err := e.finishDevice(ctx, o, dev.Name, res); err != nil {
		return nil, err
	}
	// A volume grown since the snapshot keeps its size, and its
	// filesystem, the snapshot's, is grown to it as a growth does (offline:
	// nothing uses the volume during a restore). Before the record goes,
	// so that a run killed meanwhile grows it again; growing one already
	// grown changes nothing.
	if s.Mode == spec.ModeFilesystem {
		snap, err := readSnapshot(filepath.Join(e.snapshotDir(s.UUID), rr.Snapshot+".json"))
		if err != nil || snap.Size < s.SizeBytes {
			if err := e.growFS(ctx, o, dev.Name); err != nil {
				return nil, err
			}
		}
	}
	if err := os.Remove(recPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, failed("state", err, "removing %s", recPath)
	}
	_ = syncDirOf(filepath.Dir(recPath))
	o.step("restored", "snapshot", rr.Snapshot)
	if st, err := os.Stat(file); err == nil {
		res.Allocated = allocated(st)
	}
	res.State, res.Changed = StatePrepared, true
	out.Volume, out.Method = res, rr.Method
	out.Took = time.Since(start).Round(time.Millisecond).String()
	return out, nil
}

// dropRestore forgets a restore that swapped nothing in: the record first,
// so that a crash between leaves at most a copy no record speaks for,
// which the next restore replaces.
func (e *Engine) dropRestore(u string) error {
	recPath, temp := e.restorePaths(u)
	for _, p := range []string{recPath, temp} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return failed("state", err, "removing %s", p)
		}
	}
	return nil
}

// refuseRestoreInUse finds the loop devices of the volume's file and
// refuses the restore while anything uses one of them (or a partition of
// it) or the file: a mount in any mount namespace, a stacked device, a
// process holding it open, swap. A detach of a device still open would
// only be deferred by the kernel, and a mounted filesystem would go on
// writing its cached view of the old data over the restored one.
func refuseRestoreInUse(s *spec.Spec, file string) ([]loopdev.Device, error) {
	devs, err := loopdev.Find(file)
	if err != nil {
		return nil, failed("loop", err, "looking for the loop device of %s", file)
	}
	for _, d := range devs {
		if err := refuseDeviceInUse(s, d, file); err != nil {
			return nil, err
		}
	}
	return devs, nil
}

// refuseDeviceInUse refuses a restore of volume s while anything uses
// block device d (a loop device, or an LV's device-mapper device), its
// partitions or file, the file behind it ("": none): a mount in any mount
// namespace, a stacked device, a process holding it open, swap, an
// exclusive open that fails.
func refuseDeviceInUse(s *spec.Spec, d loopdev.Device, file string) error {
	why, err := whoUses(d, file)
	if err != nil {
		return failed("usage", err, "checking whether %s is in use", d.Path)
	}
	if len(why) > 10 {
		why = append(why[:10], fmt.Sprintf("and %d more", len(why)-10))
	}
	if len(why) > 0 {
		return refused("in_use", "volume %s: %s is in use: %s: unmount it and stop what holds it, then restore again; nothing was changed", s.Name, d.Path, strings.Join(why, "; "))
	}
	return nil
}

// whoUses names what uses the device d (a loop device, or a device-mapper
// device), its partitions or the file behind it ("": none) (usersOf, with
// the mounts of every mount namespace), each mount with the namespace's
// lowest process.
func whoUses(d loopdev.Device, file string) ([]string, error) {
	dev, err := blockdev.Stat(d.Path)
	if err != nil {
		return nil, err
	}
	u, err := usersOf(d, dev, file, true)
	if err != nil {
		return nil, err
	}
	var why []string
	for _, m := range u.usage.Mountpoints {
		if strings.HasSuffix(m, "[SWAP]") {
			why = append(why, "used as swap")
		}
	}
	if len(u.usage.Holders) > 0 {
		why = append(why, "held by "+strings.Join(u.usage.Holders, ", ")+" (sysfs holders)")
	}
	if len(u.usage.LoopBacked) > 0 {
		why = append(why, "the backing file of "+strings.Join(u.usage.LoopBacked, ", "))
	}
	for _, m := range u.mounts {
		why = append(why, fmt.Sprintf("/dev/%s mounted on %s (in the mount namespace of pid %d, %s)", m.name, m.mountpoint, m.pid, procComm(m.pid)))
	}
	for _, o := range u.opens {
		why = append(why, fmt.Sprintf("%s open by pid %d (%s)", o.what, o.pid, o.comm))
	}
	if len(why) == 0 && u.claim != nil {
		why = append(why, u.claim.Error())
	}
	return why, nil
}

// restoreCopyCurrent tells whether the whole copy a swapping restore left
// is of snapshot rr.Snapshot as it is now (its takenAt and image inode).
// A copy already swapped in (temp gone) is finished whatever it was of:
// the volume's file is that copy now.
func (e *Engine) restoreCopyCurrent(rr *restoreRecord, temp string) (bool, error) {
	if _, err := os.Lstat(temp); errors.Is(err, os.ErrNotExist) {
		return true, nil
	} else if err != nil {
		return false, failed("restore_swap", err, "reading %s", temp)
	}
	snapPath, img := e.snapshotPaths(rr.VolumeUUID, rr.Snapshot)
	snap, err := readSnapshot(snapPath)
	if err != nil || snap.Phase != SnapshotTaken || rr.SnapshotImage == 0 {
		return false, nil
	}
	return snap.TakenAt.Equal(rr.SnapshotTakenAt) && imageIno(img) == rr.SnapshotImage, nil
}

func readRestore(p string) (*restoreRecord, error) {
	var r restoreRecord
	if err := readRecord(p, &r); err != nil {
		return nil, err
	}
	if !validSnapshotName(r.Snapshot) || !strings.HasPrefix(filepath.Base(p), r.VolumeUUID) {
		return nil, fmt.Errorf("%s: names snapshot %q of %s", p, r.Snapshot, r.VolumeUUID)
	}
	return &r, nil
}

func syncDirOf(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
