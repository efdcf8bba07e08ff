package engine

import (
	"context"
	"errors"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/devlinks"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// UnprepareOptions tune removal.
type UnprepareOptions struct {
	// Wipe erases the signatures we wrote on a raw device (its filesystem
	// superblock, its GPT, or its partition GUID).
	Wipe bool
}

// Unprepare removes the volume from this node. Sparse volumes lose their
// loop device and file; raw volumes keep their data unless Wipe is set.
// Only what the volume's record names is touched: without a record, a UUID
// in a spec proves nothing, and nothing is done.
func (e *Engine) Unprepare(ctx context.Context, s *spec.Spec, opts UnprepareOptions) (*Result, error) {
	res := baseResult(s)
	o := &op{e: e, s: s}
	lock, err := e.lockVolume(s.UUID)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	rec, err := e.State.Load(s.UUID)
	if err != nil {
		return nil, failed("state", err, "reading state of %s", s.Name)
	}
	res.State = StateAbsent
	if rec == nil {
		res.Warnings = append(res.Warnings, "no record of volume "+s.UUID+" on this node: nothing was touched (only what prepare recorded is ever removed)")
		return res, nil
	}
	if same, why := s.SameVolume(rec.Spec); !same {
		return nil, refused("conflict", "volume %s on this node has a different spec (%s): pass the spec it was prepared with", s.UUID, why)
	}
	// Its snapshots go first, by name: removing the volume never takes
	// them along unasked.
	if snaps, err := e.snapshotRecords(s.UUID); err != nil {
		return nil, err
	} else if len(snaps) > 0 {
		names := make([]string, 0, len(snaps))
		for _, sn := range snaps {
			names = append(names, sn.Name)
		}
		return nil, refused("has_snapshots", "volume %s has snapshots (%s): delete them first (salt-volume-exec snapshot-delete --name NAME); nothing was removed", s.Name, strings.Join(names, ", "))
	}
	switch {
	case s.SparseLoopDevice != nil:
		err = e.unprepareSparse(ctx, o, rec, opts, res)
	case s.LVMLogicalVolume != nil:
		// An unfinished merge may have left the LV inactive, or merging:
		// finished first, then the volume goes.
		if err := e.refuseLVMRestorePending(s, "", "deleting the volume"); err != nil {
			return nil, err
		}
		err = e.unprepareLVM(ctx, o, rec, opts, res)
	default:
		err = e.unprepareRaw(ctx, o, rec, opts, res)
	}
	if err != nil {
		return nil, err
	}
	if err := e.State.Remove(s.UUID); err != nil {
		return nil, failed("state", err, "removing state of %s", s.Name)
	}
	o.changed = true
	o.step("forgotten")
	res.Changed = o.changed
	return res, nil
}

// refuseInUse checks a device right before we detach or wipe it: mounts
// and holders we can see, loop devices stacked on it, and an exclusive
// open for what we cannot see (a mount in another mount namespace).
func (e *Engine) refuseInUse(s *spec.Spec, name string, res *Result) error {
	u, err := e.usage(name, res)
	if err != nil {
		return err
	}
	if u.InUse() {
		return refused("in_use", "volume %s: /dev/%s is %s: unmount it (and stop what holds it) before deleting the volume", s.Name, name, u)
	}
	if err := blockdev.CheckExclusive("/dev/" + name); err != nil {
		res.InUse = true
		return refused("in_use", "volume %s: /dev/%s is %v: unmount it (and stop what holds it) before deleting the volume", s.Name, name, err)
	}
	return nil
}

func (e *Engine) unprepareSparse(ctx context.Context, o *op, rec *nodestate.Record, opts UnprepareOptions, res *Result) error {
	s := o.s
	file := e.State.SparseFile(s.UUID)
	res.BackingFile = file
	var devs []loopdev.Device
	if _, err := os.Lstat(file); err == nil {
		f, err := e.State.OpenSparse(s.UUID, os.O_RDONLY)
		if err != nil {
			return refused("sparse_file", "%v", err)
		}
		f.Close()
		if devs, err = loopdev.Find(file); err != nil {
			return failed("loop", err, "looking for the loop device of %s", file)
		}
	}
	// Check every device before touching any, so a refusal changes
	// nothing. An encrypted volume's opened container is checked first and
	// closed only then: it holds the loop device, which nothing else may.
	if encrypted(s) {
		if err := e.checkContainerFree(o, devs, res); err != nil {
			return err
		}
		if err := e.closeContainer(ctx, o, devs, res); err != nil {
			return err
		}
	}
	for _, d := range devs {
		if err := e.refuseInUse(s, d.Name, res); err != nil {
			res.DeviceName, res.DevicePath = d.Name, d.Path
			return err
		}
	}
	// Detach before unlinking: the link goes only once the device is gone.
	for _, d := range devs {
		res.DeviceName, res.DevicePath = d.Name, d.Path
		if s.Mode == spec.ModeBlock {
			// Detach drops PARTSCAN partitions, but not ones added by BLKPG on
			// some kernels; drop ours explicitly.
			_ = loopdev.RemovePartition(d.Name, 1)
		}
		if err := loopdev.Detach(ctx, d, e.DetachWait); err != nil {
			return failed("detach", err, "detaching %s", d.Path)
		}
		o.changed = true
		o.step("detached", "device", d.Path)
	}
	if encrypted(s) && opts.Wipe {
		if err := e.eraseSparse(ctx, o, rec, file); err != nil {
			return err
		}
	}
	if err := e.removeLink(o, ""); err != nil {
		return err
	}
	if err := os.Remove(file); err == nil {
		o.changed = true
		o.step("file-removed", "path", file)
	} else if !errors.Is(err, os.ErrNotExist) {
		return failed("file", err, "removing %s", file)
	}
	if encrypted(s) {
		if err := e.removeKey(o, opts.Wipe); err != nil {
			return err
		}
	}
	// An interrupted snapshot-restore's copy goes with the volume.
	return e.dropRestore(s.UUID)
}

// removeLink deletes the persistent link if it is ours: it names our
// device, dangles, or names a device that does not carry the UUID.
func (e *Engine) removeLink(o *op, device string) error {
	link := o.persistentPath()
	if link == "" || encrypted(o.s) && o.s.Mode == spec.ModeBlock {
		// An encrypted Block volume's path is device-mapper's own node
		// of the opened container: it goes when the container closes.
		return nil
	}
	if _, err := os.Lstat(link); err != nil {
		return nil
	}
	if l := gatherLink(o.s, link); !linkIsOurs(l, device) {
		o.e.Log.Warn("leaving a link that names another device", "link", link, "device", l.Target)
		return nil
	}
	if err := devlinks.Remove(link); err != nil {
		return failed("link", err, "removing %s", link)
	}
	o.changed = true
	o.step("unlinked", "link", link)
	return nil
}

func (e *Engine) unprepareRaw(ctx context.Context, o *op, rec *nodestate.Record, opts UnprepareOptions, res *Result) error {
	s := o.s
	// With --wipe, a table whose partition the kernel lost (a reboot
	// without restore) must still be found and wiped.
	name := e.locateRaw(rec, opts.Wipe)
	if rec.DMUUID != "" {
		// An LV used as it is in Block mode: we wrote nothing on it and
		// its dm-uuid link is udev's; the record is all there is to drop.
		if name != "" {
			res.DeviceName, res.DevicePath = name, "/dev/"+name
			if err := e.refuseInUse(s, name, res); err != nil {
				return err
			}
		}
		if opts.Wipe && name != "" {
			// The LV stays (salt-volumes did not create it); what the
			// volume held on it goes.
			return e.zeroAndVerify(o, nil, name, res)
		}
		return nil
	}
	if name == "" && opts.Wipe {
		res.Warnings = append(res.Warnings, "no device on this node matches the record of volume "+s.UUID+": nothing to wipe")
	}
	if name != "" {
		res.DeviceName, res.DevicePath = name, "/dev/"+name
		if err := e.refuseInUse(s, name, res); err != nil {
			return err
		}
		if opts.Wipe {
			if err := e.wipe(o, rec, name, res); err != nil {
				return err
			}
		}
	}
	return e.removeLink(o, name)
}

// wipe zeroes the volume's whole device and proves it by reading back a
// sample, then erases what else carries the volume (a partition's GUID in
// its disk's table). What it acts on is re-checked right before: only a
// device that still carries what we wrote is ours to zero.
func (e *Engine) wipe(o *op, rec *nodestate.Record, name string, res *Result) error {
	s := o.s
	disk := name
	var part blockdev.PartitionInfo
	if s.Mode == spec.ModeBlock {
		p, isPart, err := blockdev.Partition(name)
		if err != nil || !isPart {
			return failed("wipe", err, "reading partition %s", name)
		}
		part, disk = p, p.Parent
	}
	if part.Parent != "" {
		dl, err := e.lockDisk(part.Parent)
		if err != nil {
			return err
		}
		defer dl.Unlock()
	}
	// A superblock is wiped through an exclusive open of the device; a
	// table through the disk (whose other partitions may be mounted).
	flags := os.O_RDWR | unix.O_CLOEXEC
	if s.Mode == spec.ModeFilesystem {
		flags |= os.O_EXCL
	}
	f, err := os.OpenFile("/dev/"+disk, flags, 0)
	if errors.Is(err, unix.EROFS) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return wipeUnverified(disk, err)
	}
	if err != nil {
		return refused("in_use", "opening /dev/%s to wipe it: %v", disk, err)
	}
	defer f.Close()
	size, ss, err := geometry(f)
	if err != nil {
		return failed("wipe", err, "reading /dev/%s", disk)
	}
	r, err := probe.Device(f, size, ss)
	if err != nil {
		return failed("wipe", err, "reading /dev/%s", disk)
	}
	w := wipeFacts{Written: recordedWrite(rec, s.Mode == spec.ModeBlock && part.Parent != "" && rec.PartNumber != 0)}
	if s.Mode == spec.ModeFilesystem {
		w.Ours = ours(s, r)
	} else if r.GPT != nil {
		ent, ok := r.GPT.Partition(part.Number)
		w.Ours = ok && ent.GUID == s.UUID
		start, length, _ := gpt.Extent(size, ss)
		w.OurLayout = len(r.GPT.Entries) == 1 && ok && ent.Start(ss) == start && ent.Size(ss) == length
		w.DiskGUID, w.RecordedDiskGUID = r.GPT.DiskGUID, rec.DiskGUID
	}
	act, err := decideWipe(s, "/dev/"+disk, w)
	if err != nil {
		return err
	}
	// The volume's device is the partition whose GUID we set, else the
	// whole device we formatted or partitioned: all of it was the volume's.
	switch act {
	case resetGUID:
		err = e.zeroAndVerify(o, nil, name, res)
	case wipeTable:
		// The kernel forgets our partition first: once the table is
		// zeroed nothing would find it again after a crash, while a table
		// still there is found (and its partition re-added) by a rerun.
		_ = loopdev.RemovePartition(disk, 1)
		err = e.zeroAndVerify(o, f, disk, res)
	default:
		err = e.zeroAndVerify(o, f, disk, res)
	}
	if err != nil {
		return err
	}
	switch act {
	case wipeSuperblock:
		// Zeroed with the rest.
		o.step("wiped", "device", name, "what", r.Kind)
	case wipeTable:
		// Both tables zeroed with the rest.
		o.step("wiped", "device", disk, "what", "gpt")
	case resetGUID:
		// The partition gets back the GUID it had before it became a volume;
		// the table and the other partitions stay as they are.
		guid := rec.OldGUID
		if guid == "" || guid == s.UUID {
			guid = uuid.NewString()
		}
		if err := gpt.SetPartitionGUID(f, size, ss, part.Number, guid); err != nil {
			return failed("wipe", err, "resetting the GUID of partition %d of /dev/%s", part.Number, disk)
		}
		o.step("wiped", "device", name, "what", "partition-guid")
	}
	o.changed = true
	return nil
}

// recordedWrite is what the record says we wrote. A record without it is
// from an older version, or from a prepare killed before saving it; either
// way the device was blank when recorded, so our signature on it is ours.
func recordedWrite(rec *nodestate.Record, partition bool) string {
	if rec.Written != "" {
		return rec.Written
	}
	return written(rec.Spec, partition)
}
