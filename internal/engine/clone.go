package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/devlinks"
	"github.com/salt-volumes/salt-volumes/internal/filecopy"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// Clones: a new sparse volume whose backing file starts as a copy of a
// snapshot's image, with an identity of its own written before anything
// can attach it (the filesystem's UUID, or the GPT's partition GUID), so
// that the clone and its origin can be used at once and their by-uuid
// links stay distinct.

// cloneSparse makes the volume's backing file from its source snapshot
// unless the file exists already. It works on <file>.clone and renames it
// last: a crash leaves either no file (the next run starts over, removing
// the partial copy, which the preparing record says is ours) or the whole
// clone. grown says the clone is larger than the snapshot (its table is
// laid out to the end here; its filesystem grows once it is attached).
func (e *Engine) cloneSparse(ctx context.Context, o *op) (grown bool, err error) {
	s := o.s
	file := e.State.SparseFile(s.UUID)
	if _, err := os.Stat(file); err == nil {
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, failed("file", err, "reading %s", file)
	}
	src := s.Source
	_, img := e.snapshotPaths(src.VolumeUUID, src.Snapshot)
	snap, err := e.sourceSnapshot(s, "sparseLoopDevice.size")
	if err != nil {
		return false, err
	}
	if snap.LV != "" {
		return false, invalid("source_mismatch", "source: snapshot %s is an LVM snapshot (%s): its clone is an lvmLogicalVolume volume in the same volume group", src.Snapshot, snap.LV)
	}
	part := file + ".clone"
	// An interrupted run's copy is ours (the preparing record says so),
	// and so is a loop device it left on it while replaying a log, and
	// that device's mount on a .clone- dir of ours.
	if devs, err := loopdev.Find(part); err == nil {
		for _, d := range devs {
			if err := e.dropReplayMounts(d); err != nil {
				return false, err
			}
			if err := loopdev.Detach(ctx, d, e.DetachWait); err != nil {
				return false, failed("detach", err, "detaching %s, which an interrupted run left on the copy %s: look at what holds it (lsblk, fuser -vm %s)", d.Path, part, d.Path)
			}
		}
	}
	os.Remove(part)
	if err := os.MkdirAll(e.State.Sparse(), 0o700); err != nil {
		return false, failed("file", err, "creating %s", e.State.Sparse())
	}
	if err := e.imageRoom(fmt.Sprintf("clone %s of snapshot %s", s.Name, snap.Name), "clone_copy", img, part); err != nil {
		return false, err
	}
	method, err := filecopy.CopyProgress(ctx, img, part, o.progress("copying", "snapshot", src.Snapshot))
	if err != nil {
		return false, failed("clone_copy", err, "copying snapshot %s", src.Snapshot)
	}
	o.changed = true
	o.step("cloned", "snapshot", src.Snapshot, "method", string(method))
	fail := func(err error) (bool, error) {
		os.Remove(part)
		return false, err
	}
	grown = snap.Size < s.SizeBytes
	if grown {
		if err := os.Truncate(part, s.SizeBytes); err != nil {
			return fail(failed("file", err, "sizing %s", part))
		}
	}
	if err := e.newIdentity(ctx, o, part, snap); err != nil {
		return fail(err)
	}
	if err := os.Rename(part, file); err != nil {
		return fail(failed("file", err, "naming %s", file))
	}
	return grown, nil
}

// sourceSnapshot reads the snapshot clone s is made from and checks what
// every clone shares with its source: its mode, its filesystem, and at
// least its size (sizeField names the spec's size).
func (e *Engine) sourceSnapshot(s *spec.Spec, sizeField string) (*Snapshot, error) {
	src := s.Source
	recPath, _ := e.snapshotPaths(src.VolumeUUID, src.Snapshot)
	snap, err := readSnapshot(recPath)
	if errors.Is(err, os.ErrNotExist) || (err == nil && snap.Phase != SnapshotTaken) {
		return nil, invalid("snapshot_not_found", "source: snapshot %s of volume %s is not on this node (salt-volume-exec snapshots lists them)", src.Snapshot, src.VolumeUUID)
	}
	if err != nil {
		return nil, failed("state", err, "reading snapshot %s", src.Snapshot)
	}
	switch {
	case snap.Mode != s.Mode:
		return nil, invalid("source_mismatch", "source: snapshot %s is of a %s volume: the clone must be mode %s too", src.Snapshot, snap.Mode, snap.Mode)
	case snap.FSType != s.FSType:
		return nil, invalid("source_mismatch", "source: snapshot %s holds %s: the clone's fsType must be %s", src.Snapshot, snap.FSType, snap.FSType)
	case snap.Size > s.SizeBytes:
		return nil, invalid("source_mismatch", "%s: %s is smaller than snapshot %s (%s): a clone is at least as large as its source", sizeField, spec.FormatSize(s.SizeBytes), src.Snapshot, spec.FormatSize(snap.Size))
	}
	return snap, nil
}

// newIdentity gives the copy (a file, or an LV's device) the volume's
// UUID: tune2fs -U (after the forced check it asks for) or xfs_admin -U
// for a filesystem, a table laid out again with the volume's partition
// GUID and a new disk GUID for a sparse Block volume.
func (e *Engine) newIdentity(ctx context.Context, o *op, part string, snap *Snapshot) error {
	s := o.s
	run := func(name string, args ...string) error {
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	switch {
	case s.Mode == spec.ModeBlock:
		f, err := os.OpenFile(part, os.O_RDWR, 0)
		if err != nil {
			return failed("file", err, "opening %s", part)
		}
		defer f.Close()
		if _, _, err := gpt.Relay(f, s.SizeBytes, 512, s.UUID, s.Name, ""); err != nil {
			return failed("gpt", err, "giving the clone's partition its GUID")
		}
	case s.FSType == "xfs":
		// A snapshot of a mounted xfs (frozen or not) carries a log to
		// replay, and xfs_admin refuses a dirty log (exiting 0 all the
		// same): mount the copy once, beside its origin (nouuid), so that
		// the kernel replays it.
		if err := e.replayXFSLog(ctx, o, part); err != nil {
			return err
		}
		if err := run("xfs_admin", "-U", s.UUID, part); err != nil {
			return failed("clone_uuid", err, "giving the clone's xfs its UUID")
		}
	default:
		// e2fsck exits 1 when it corrected something (a snapshot of a
		// mounted ext4 is as after a crash): that is fine here.
		cmd := exec.CommandContext(ctx, "e2fsck", "-f", "-p", part)
		if out, err := cmd.CombinedOutput(); err != nil {
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() > 1 {
				return failed("clone_fsck", fmt.Errorf("e2fsck: %v: %s", err, strings.TrimSpace(string(out))), "checking the clone's ext4")
			}
		}
		if err := run("tune2fs", "-U", s.UUID, part); err != nil {
			return failed("clone_uuid", err, "giving the clone's ext4 its UUID")
		}
	}
	// Never trust a tool's exit code alone here: a copy that does not
	// carry the volume's own signature now would be taken for a file to
	// format by the rest of prepare.
	f, err := os.Open(part)
	if err != nil {
		return failed("file", err, "opening %s", part)
	}
	r, err := probe.Device(f, s.SizeBytes, 512)
	f.Close()
	if err != nil {
		return failed("probe", err, "reading %s", part)
	}
	if !ours(s, r) {
		return failed("clone_uuid", fmt.Errorf("it carries %s", r), "giving the clone of snapshot %s the volume's UUID %s", snap.Name, s.UUID)
	}
	o.step("clone-identity", "uuid", s.UUID)
	return nil
}

// dropReplayMounts unmounts what a killed log replay left mounted of the
// loop device d: only mounts on a .clone- dir in the state dir (ours).
func (e *Engine) dropReplayMounts(d loopdev.Device) error {
	dev, err := blockdev.DevOf(d.Name)
	if err != nil {
		return nil // no such device any more
	}
	mps, err := blockdev.Mountpoints(dev)
	if err != nil {
		return failed("mounts", err, "reading the mount table")
	}
	prefix := filepath.Join(e.State.Root, ".clone-")
	for _, mp := range mps {
		if !strings.HasPrefix(mp, prefix) {
			continue
		}
		if err := unix.Unmount(mp, 0); err != nil {
			return failed("clone_log", err, "unmounting %s, where an interrupted run replayed the log of a clone's copy (umount %s)", mp, mp)
		}
		os.Remove(mp)
	}
	return nil
}

// replayXFSLog mounts the copy of an xfs (a file through a loop device,
// or a device) once and unmounts it, which replays its log.
func (e *Engine) replayXFSLog(ctx context.Context, o *op, part string) error {
	path := part
	var held *loopdev.Held
	if !strings.HasPrefix(part, "/dev/") {
		// The copy carries its origin's UUID: udev must never link the
		// loop device (it would move the origin's by-uuid link to the
		// copy). Its rule for copies skips it, a run killed with the copy
		// mounted included; the lock keeps udev off it meanwhile too.
		if _, err := devlinks.EnsureHideRule(ctx); err != nil {
			return failed("udev", err, "keeping udev from linking the copy of the snapshot during its log replay")
		}
		var err error
		if held, err = loopdev.AttachHeld(ctx, part); err != nil {
			return failed("attach", err, "attaching %s to replay its log", part)
		}
		defer func() {
			if held != nil {
				_ = held.Release(context.Background(), e.DetachWait)
			}
		}()
		path = held.Path
	}
	dir, err := os.MkdirTemp(e.State.Root, ".clone-")
	if err != nil {
		return failed("file", err, "making a mount point")
	}
	defer os.Remove(dir)
	if err := unix.Mount(path, dir, "xfs", unix.MS_NOATIME, "nouuid"); err != nil {
		return failed("clone_log", err, "mounting the copy of the snapshot to replay its xfs log")
	}
	o.step("clone-log-mounted", "mountpoint", dir)
	if err := unix.Unmount(dir, 0); err != nil {
		// Still mounted: the lock stays with this process until it ends;
		// the next run unmounts and detaches it (dropReplayMounts).
		held = nil
		return failed("clone_log", err, "unmounting the copy of the snapshot from %s", dir)
	}
	if held != nil {
		err := held.Release(ctx, e.DetachWait)
		held = nil
		if err != nil {
			return failed("detach", err, "detaching the copy of the snapshot after its log replay")
		}
	}
	o.step("clone-log-replayed")
	return nil
}

// imageRoom refuses a copy of the image img to a file beside part (what
// names the copy in the refusal, code is the failure code of an unreadable
// image) that the free space of the sparse files' filesystem cannot take;
// a reflink takes none at first. A clone's or a restore's size is counted
// against the overcommit ratio already (a new volume's, the same volume's),
// so only the free space is checked here, under the global lock.
func (e *Engine) imageRoom(what, code, img, part string) error {
	g, err := e.State.Lock("global")
	if err != nil {
		return failed("lock", err, "locking the node's state")
	}
	defer g.Unlock()
	data, err := filecopy.Allocated(img)
	if err != nil {
		return failed(code, err, "reading %s", img)
	}
	return e.checkCopyRoom(what, 0, data, filecopy.CanReflink(img, part+".probe"), 0)
}
