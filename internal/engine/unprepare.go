package engine

import (
	"context"
	"errors"
	"os"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/devlinks"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// UnprepareOptions tune removal.
type UnprepareOptions struct {
	// Wipe erases the signatures that carry this volume's UUID on a raw
	// device (its filesystem superblock, its GPT, or its partition GUID).
	Wipe bool
}

// Unprepare removes the volume from this node. Sparse volumes lose their
// loop device and file; raw volumes keep their data unless Wipe is set.
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
	if rec != nil {
		if same, why := s.SameVolume(rec.Spec); !same {
			return nil, refused("conflict", "volume %s on this node has a different spec (%s): pass the spec it was prepared with", s.UUID, why)
		}
	}
	if s.SparseLoopDevice != nil {
		err = e.unprepareSparse(ctx, o, res)
	} else {
		err = e.unprepareRaw(ctx, o, opts, res)
	}
	if err != nil {
		return nil, err
	}
	if rec != nil {
		if err := e.State.Remove(s.UUID); err != nil {
			return nil, failed("state", err, "removing state of %s", s.Name)
		}
		o.changed = true
		o.step("forgotten")
	}
	res.State = StateAbsent
	res.Changed = o.changed
	return res, nil
}

func (e *Engine) unprepareSparse(ctx context.Context, o *op, res *Result) error {
	s := o.s
	file := e.State.SparseFile(s.UUID)
	res.BackingFile = file
	var devs []loopdev.Device
	if _, err := os.Stat(file); err == nil {
		if devs, err = loopdev.Find(file); err != nil {
			return failed("loop", err, "looking for the loop device of %s", file)
		}
	}
	// Check every device before touching any, so a refusal changes nothing.
	for _, d := range devs {
		u, err := e.usage(d.Name, res)
		if err != nil {
			return err
		}
		if u.InUse() {
			res.DeviceName, res.DevicePath = d.Name, d.Path
			return refused("in_use", "volume %s: %s is %s: unmount it (and stop what holds it) before deleting the volume", s.Name, d.Path, u)
		}
	}
	if err := e.removeLink(o); err != nil {
		return err
	}
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
	if err := os.Remove(file); err == nil {
		o.changed = true
		o.step("file-removed", "path", file)
	} else if !errors.Is(err, os.ErrNotExist) {
		return failed("file", err, "removing %s", file)
	}
	return nil
}

func (e *Engine) removeLink(o *op) error {
	link := o.s.PersistentPath()
	if _, err := os.Lstat(link); err != nil {
		return nil
	}
	if err := devlinks.Remove(link); err != nil {
		return failed("link", err, "removing %s", link)
	}
	o.changed = true
	o.step("unlinked", "link", link)
	return nil
}

func (e *Engine) unprepareRaw(ctx context.Context, o *op, opts UnprepareOptions, res *Result) error {
	s := o.s
	// With --wipe, a table whose partition the kernel lost (a reboot
	// without restore) must still be found and wiped.
	name, err := e.findRaw(s, opts.Wipe)
	if err != nil {
		return failed("device", err, "looking for the device of %s", s.Name)
	}
	if name == "" && opts.Wipe {
		res.Warnings = append(res.Warnings, "no device on this node carries volume "+s.UUID+": nothing to wipe")
	}
	if name != "" {
		res.DeviceName, res.DevicePath = name, "/dev/"+name
		disk := name
		if s.Mode == spec.ModeBlock {
			if p, isPart, _ := blockdev.Partition(name); isPart {
				disk = p.Parent
			}
		}
		u, err := e.usage(name, res)
		if err != nil {
			return err
		}
		if u.InUse() {
			return refused("in_use", "volume %s: %s is %s: unmount it (and stop what holds it) before deleting the volume", s.Name, res.DevicePath, u)
		}
		if opts.Wipe {
			if err := e.wipe(o, name, disk); err != nil {
				return err
			}
		}
	}
	return e.removeLink(o)
}

// wipe erases only what carries this volume's UUID, re-checking it right
// before writing.
func (e *Engine) wipe(o *op, name, disk string) error {
	s := o.s
	if s.Mode == spec.ModeFilesystem {
		return e.wipeFilesystem(o, name)
	}
	p, isPart, err := blockdev.Partition(name)
	if err != nil || !isPart {
		return failed("wipe", err, "reading partition %s", name)
	}
	f, err := os.OpenFile("/dev/"+disk, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return failed("wipe", err, "opening /dev/%s", disk)
	}
	defer f.Close()
	size, ss, err := geometry(f)
	if err != nil {
		return failed("wipe", err, "reading /dev/%s", disk)
	}
	r, err := probe.Device(f, size, ss)
	if err != nil || r.GPT == nil {
		return failed("wipe", err, "reading the GPT of /dev/%s", disk)
	}
	ent, ok := r.GPT.Partition(p.Number)
	if !ok || ent.GUID != s.UUID {
		return refused("foreign_data", "partition %d of /dev/%s no longer carries volume %s: not wiping", p.Number, disk, s.UUID)
	}
	// A one-partition table laid out exactly as gpt.Create lays it out is
	// the one we wrote on a whole disk (the name may have changed since).
	start, length, _ := gpt.Extent(size, ss)
	if len(r.GPT.Entries) == 1 && ent.Start(ss) == start && ent.Size(ss) == length {
		// We wrote this whole table: take it away, and the kernel's partition.
		if err := gpt.Wipe(f, size, ss); err != nil {
			return failed("wipe", err, "erasing the GPT of /dev/%s", disk)
		}
		_ = loopdev.RemovePartition(disk, 1)
		o.changed = true
		o.step("wiped", "device", disk, "what", "gpt")
		return nil
	}
	// A partition of someone's disk: the other partitions stay; only the
	// GUID that names this volume goes.
	if err := gpt.SetPartitionGUID(f, size, ss, p.Number, uuid.NewString()); err != nil {
		return failed("wipe", err, "resetting the GUID of partition %d of /dev/%s", p.Number, disk)
	}
	o.changed = true
	o.step("wiped", "device", name, "what", "partition-guid")
	return nil
}

func (e *Engine) wipeFilesystem(o *op, name string) error {
	s := o.s
	f, err := os.OpenFile("/dev/"+name, os.O_RDWR|os.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return refused("device_busy", "opening /dev/%s exclusively to wipe it: %v", name, err)
	}
	defer f.Close()
	size, ss, err := geometry(f)
	if err != nil {
		return failed("wipe", err, "reading /dev/%s", name)
	}
	r, err := probe.Device(f, size, ss)
	if err != nil || !ours(s, r) {
		return refused("foreign_data", "/dev/%s no longer carries volume %s: not wiping", name, s.UUID)
	}
	// The primary superblock is all blkid and mkfs look at.
	off, n := int64(1024), 1024 // ext2/3/4
	if r.Kind == "xfs" {
		off, n = 0, 512
	}
	if _, err := f.WriteAt(make([]byte, n), off); err != nil {
		return failed("wipe", err, "erasing the superblock of /dev/%s", name)
	}
	if err := f.Sync(); err != nil {
		return failed("wipe", err, "syncing /dev/%s", name)
	}
	o.changed = true
	o.step("wiped", "device", name, "what", r.Kind)
	return nil
}
