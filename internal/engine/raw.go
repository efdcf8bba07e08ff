package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/mkfs"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// rawDevice is a resolved rawBlockDevice.devicePath.
type rawDevice struct {
	path string // as given
	real string // symlinks resolved
	name string // kernel name
	dev  blockdev.Dev
}

func resolveRaw(p string) (*rawDevice, error) {
	real, err := filepath.EvalSymlinks(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, invalid("device_not_found", "%s: %s does not exist on this node: check the path (ls -l /dev/disk/by-id) and the node", devicePathField, p)
	}
	if err != nil {
		return nil, failed("device", err, "resolving %s", p)
	}
	if !strings.HasPrefix(real, "/dev/") {
		return nil, refused("symlink_escape", "%s: %s resolves to %s, outside /dev: refusing to treat it as a device", devicePathField, p, real)
	}
	d, err := blockdev.Stat(real)
	if errors.Is(err, blockdev.ErrNotBlock) {
		return nil, refused("not_block_device", "%s: %s is not a block device", devicePathField, p)
	}
	if err != nil {
		return nil, failed("device", err, "reading %s", p)
	}
	name, err := blockdev.Name(d)
	if err != nil {
		return nil, failed("device", err, "finding the kernel name of %s", p)
	}
	return &rawDevice{path: p, real: real, name: name, dev: d}, nil
}

// checkPartitionTable: Block mode on a partition changes its GUID in the
// disk's GPT, so that table must be a sound GPT that matches the kernel.
func checkPartitionTable(s *spec.Spec, raw *rawDevice) error {
	part, isPart, err := blockdev.Partition(raw.name)
	if err != nil {
		return failed("sysfs", err, "reading %s", raw.name)
	}
	if s.Mode != spec.ModeBlock || !isPart {
		return nil
	}
	parentPath, err := blockdev.EnsureNode(part.Parent)
	if err != nil {
		return failed("node", err, "making /dev/%s", part.Parent)
	}
	pr, _, ss, err := openProbe(parentPath)
	if err != nil {
		return failed("probe", err, "reading %s", parentPath)
	}
	if pr.Kind != "gpt" || pr.GPT == nil {
		return invalid("not_gpt", "%s: %s is a partition of %s, which has a %s, not a GPT: Block mode needs a GPT partition (or give the whole disk)", devicePathField, raw.path, parentPath, pr)
	}
	if pr.GPT.FromBackup {
		return refused("gpt_damaged", "%s: the primary GPT of %s is damaged: repair it (sgdisk -e / gdisk) first", devicePathField, parentPath)
	}
	entry, ok := pr.GPT.Partition(part.Number)
	if !ok || entry.Start(ss) != part.Start || entry.Size(ss) != part.Size {
		return refused("table_mismatch", "%s: the GPT of %s does not match the kernel's view of partition %d (%s): re-read the partition table first", devicePathField, parentPath, part.Number, raw.name)
	}
	return nil
}

// partitionSettle is how long a raw device's partition may be away while
// its disk's table is read again (another volume's GPT write on the same
// disk, then udev's re-read: seen on a booted guest's NVMe disk).
const partitionSettle = 10 * time.Second

// describeRaw fills in the record what identifies the raw device before
// anything is written to it.
func describeRaw(rec *nodestate.Record, raw *rawDevice) error {
	rec.Device, rec.DeviceNum = raw.name, raw.dev.String()
	size, err := blockdev.SizeOfSettled(raw.name, partitionSettle)
	if err != nil {
		return failed("sysfs", err, "reading the size of %s", raw.name)
	}
	rec.DeviceSize = size
	part, isPart, err := blockdev.Partition(raw.name)
	if err != nil || !isPart {
		return nil
	}
	// A partition is known by its disk and index too (see deviceOf).
	rec.Parent, rec.PartNumber = part.Parent, part.Number
	if d, err := blockdev.DevOf(part.Parent); err == nil {
		rec.ParentNum = d.String()
	}
	if rec.Spec.Mode != spec.ModeBlock {
		return nil
	}
	if r, _, _, err := openProbe("/dev/" + part.Parent); err == nil && r.GPT != nil {
		if ent, ok := r.GPT.Partition(part.Number); ok {
			rec.OldGUID = ent.GUID
		}
	}
	return nil
}

// recordMatches tells whether device name is the raw volume the record
// describes: it carries the volume's signature, and what we recorded about
// it (size, the disk GUID of a table we wrote, the partition's index)
// still holds. A UUID alone proves nothing: a caller chooses it.
func (e *Engine) recordMatches(rec *nodestate.Record, name string) bool {
	s := rec.Spec
	if rec.DMUUID != "" {
		// An LV in Block mode carries nothing of ours: LVM's own UUID,
		// recorded when it became the volume, is what identifies it.
		return lvmUUIDOf(name) == rec.DMUUID
	}
	if rec.DeviceSize > 0 {
		// A device that grew (a virtual disk enlarged, a partition's end
		// moved) is still the volume when it is the recorded device
		// itself; a copy of the volume elsewhere must have its size.
		size, err := blockdev.SizeOf(name)
		if err != nil || size < rec.DeviceSize || size > rec.DeviceSize && name != deviceOf(rec) {
			return false
		}
	}
	part, isPart, _ := blockdev.Partition(name)
	if s.Mode == spec.ModeBlock && isPart {
		if rec.PartNumber != 0 && part.Number != rec.PartNumber {
			return false
		}
		return carries(s, name, false) != ""
	}
	r, _, _, err := openProbe("/dev/" + name)
	if err != nil || !ours(s, r) {
		return false
	}
	if s.Mode == spec.ModeBlock && rec.DiskGUID != "" && r.GPT.DiskGUID != rec.DiskGUID {
		return false
	}
	return true
}

// locateRaw finds the device that is the recorded raw volume (the partition
// in Block mode): the recorded device first, then the spec's path, then,
// for disks renamed across a reboot, any device that matches the record.
func (e *Engine) locateRaw(rec *nodestate.Record, fix bool) string {
	if rec.DMUUID != "" {
		return deviceOf(rec) // an LV: its UUID names it, no scan finds more
	}
	var candidates []string
	if n := deviceOf(rec); n != "" {
		candidates = append(candidates, n)
	}
	if raw, err := resolveRaw(rec.Spec.RawBlockDevice.DevicePath); err == nil {
		candidates = append(candidates, raw.name)
	}
	for _, n := range candidates {
		if e.recordMatches(rec, n) {
			return carries(rec.Spec, n, fix)
		}
	}
	for _, n := range scanDevices() {
		if e.recordMatches(rec, n) {
			if name := carries(rec.Spec, n, fix); name != "" {
				return name
			}
		}
	}
	return ""
}

func (e *Engine) prepareRaw(ctx context.Context, o *op, rec *nodestate.Record, raw *rawDevice, res *Result) error {
	s := o.s
	part, isPart, err := blockdev.Partition(raw.name)
	if err != nil {
		return failed("sysfs", err, "reading %s", raw.name)
	}
	if s.Mode == spec.ModeBlock && isPart {
		return e.preparePartitionGUID(ctx, o, rec, raw, part, res)
	}
	if dm := lvmUUIDOf(raw.name); s.Mode == spec.ModeBlock && dm != "" {
		return e.prepareRawLV(ctx, o, rec, raw, dm, res)
	}
	target := "/dev/" + raw.name
	var r probe.Result
	if o.probed != nil {
		r = *o.probed
	} else if r, _, _, err = openProbe(target); err != nil {
		return failed("probe", err, "reading %s", raw.path)
	}
	if err := e.writeIfBlank(ctx, o, rec, raw, r); err != nil {
		return err
	}
	if s.Mode == spec.ModeBlock && rec.DiskGUID == "" {
		if r, _, _, err := openProbe(target); err == nil && r.GPT != nil {
			rec.DiskGUID, o.unsaved = r.GPT.DiskGUID, true
		}
	}
	o.markWritten(rec, written(s, false))
	if err := e.rememberDevice(rec, raw); err != nil {
		return err
	}
	if err := e.growRaw(ctx, o, rec, raw.name); err != nil {
		return err
	}
	return e.finishDevice(ctx, o, raw.name, res)
}

// writeIfBlank writes the volume on a raw device that probed as r, unless
// it carries the volume already; a device we wrote that lost its signature
// is refused as damaged, and someone else's data as foreign.
func (e *Engine) writeIfBlank(ctx context.Context, o *op, rec *nodestate.Record, raw *rawDevice, r probe.Result) error {
	act, err := decideContent(o.s, contentFacts{Where: raw.path, Ours: ours(o.s, r), Found: r, Formatted: rec.Formatted()})
	if err != nil || act != writeContent {
		return err
	}
	return e.writeRaw(ctx, o, rec, raw)
}

// writeRaw formats a blank raw device or writes our GPT on it. mkfs opens
// the device exclusively itself; the GPT is written through our own
// exclusive open, so a device claimed since the checks is not touched.
func (e *Engine) writeRaw(ctx context.Context, o *op, rec *nodestate.Record, raw *rawDevice) error {
	s := o.s
	target := "/dev/" + raw.name
	if s.Mode == spec.ModeFilesystem {
		// The record this run ends with, if mkfs and the read-back
		// succeed, is known now: stage it while mkfs runs.
		next := *rec
		next.Written, next.Phase = written(s, false), nodestate.PhasePrepared
		o.final = e.stage(next)
		if err := mkfs.Format(ctx, s.FSType, s.UUID, s.MkfsOptions, mkfs.Target{Path: target}, false); err != nil {
			return failed("mkfs", err, "formatting %s", raw.path)
		}
		f, err := os.Open(target)
		if err != nil {
			return failed("mkfs_check", err, "reading back %s", raw.path)
		}
		defer f.Close()
		size, ss, err := geometry(f)
		if err != nil {
			return failed("mkfs_check", err, "reading back %s", raw.path)
		}
		if err := verifyWritten(s, f, size, ss); err != nil {
			return err
		}
		o.changed, o.fresh = true, true
		o.step("formatted", "fsType", s.FSType, "device", target)
		return nil
	}
	f, err := os.OpenFile(target, os.O_RDWR|os.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return refused("in_use", "%s: opening %s exclusively: %v", devicePathField, raw.path, err)
	}
	defer f.Close()
	sz, ss, err := geometry(f)
	if err == nil {
		_, _, err = gpt.Create(f, sz, ss, s.UUID, s.Name)
	}
	if err != nil {
		return failed("gpt", err, "writing the GPT of %s", raw.path)
	}
	o.changed, o.fresh = true, true
	o.step("partitioned", "device", target)
	return nil
}

// lockDisk serialises writes to one disk's partition table.
func (e *Engine) lockDisk(name string) (*nodestate.Lock, error) {
	l, err := e.State.Lock("disk-" + name)
	if err != nil {
		return nil, failed("lock", err, "locking the partition table of %s", name)
	}
	return l, nil
}

// deviceOf is the kernel name of the raw device or LV a record names now.
// An LV is found by its device-mapper UUID (dm numbers are given at each
// activation). A partition is found by its disk and index: the kernel numbers the
// partitions of some disks (NVMe, and loop devices, on the extended major)
// anew whenever it reads their table again, which udev has it do once a
// table was written (a GUID set on a sibling partition, say), so a
// recorded device number may name a sibling by then.
func deviceOf(rec *nodestate.Record) string {
	if rec.DMUUID != "" {
		return dmByUUID(rec.DMUUID)
	}
	if rec.PartNumber != 0 && rec.Parent != "" {
		parent := rec.Parent
		if d, ok := parseDev(rec.ParentNum); ok {
			if n, err := blockdev.Name(d); err == nil {
				parent = n
			}
		}
		if p, ok, _ := partitionAt(parent, rec.PartNumber); ok {
			return p.name
		}
		return ""
	}
	if d, ok := parseDev(rec.DeviceNum); ok {
		if n, err := blockdev.Name(d); err == nil {
			return n
		}
	}
	return ""
}

// rememberDevice records which device the volume is on, to notice a path
// that later names another one.
func (e *Engine) rememberDevice(rec *nodestate.Record, raw *rawDevice) error {
	if rec.DeviceNum == raw.dev.String() && rec.Device == raw.name {
		return nil
	}
	rec.Device, rec.DeviceNum = raw.name, raw.dev.String()
	if err := e.State.Save(rec); err != nil {
		return failed("state", err, "saving state of %s", rec.Spec.Name)
	}
	return nil
}

// preparePartitionGUID stamps the volume UUID as the unique GUID of an
// existing GPT partition, changing nothing else on the disk.
func (e *Engine) preparePartitionGUID(ctx context.Context, o *op, rec *nodestate.Record, raw *rawDevice, part blockdev.PartitionInfo, res *Result) error {
	s := o.s
	if carries(s, raw.name, false) == "" {
		if rec.Formatted() {
			_, err := decideContent(s, contentFacts{Where: raw.path, Formatted: true})
			return err
		}
		parentPath := "/dev/" + part.Parent
		// Other partitions of this disk may be volumes whose GUIDs are set
		// in the same table: one read-modify-write of it at a time.
		dl, err := e.lockDisk(part.Parent)
		if err != nil {
			return err
		}
		defer dl.Unlock()
		// The disk is not opened exclusively: its other partitions may be
		// mounted. The partition itself was checked exclusively in admit.
		f, err := os.OpenFile(parentPath, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return failed("gpt", err, "opening %s", parentPath)
		}
		size, ss, err := geometry(f)
		if err == nil {
			err = gpt.SetPartitionGUID(f, size, ss, part.Number, s.UUID)
		}
		f.Close()
		if err != nil {
			return failed("gpt", err, "setting the GUID of partition %d of %s", part.Number, parentPath)
		}
		o.changed = true
		o.step("guid-set", "device", raw.name)
	}
	o.markWritten(rec, written(s, true))
	if err := e.rememberDevice(rec, raw); err != nil {
		return err
	}
	if err := e.growRaw(ctx, o, rec, raw.name); err != nil {
		return err
	}
	return e.linkDevice(ctx, o, raw.name, res)
}
