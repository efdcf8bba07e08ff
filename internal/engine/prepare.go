package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/devlinks"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/mkfs"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// Prepare makes the volume exist on this node. Running it again, or after a
// crash at any step, converges on the same prepared volume.
func (e *Engine) Prepare(ctx context.Context, s *spec.Spec) (*Result, error) {
	res := baseResult(s)
	o := &op{e: e, s: s}
	if s.SparseLoopDevice != nil {
		warn, err := e.checkCapacity(s)
		if err != nil {
			return nil, err
		}
		if warn != "" {
			res.Warnings = append(res.Warnings, warn)
		}
	}
	var raw *rawDevice
	if s.RawBlockDevice != nil {
		var err error
		if raw, err = resolveRaw(s.RawBlockDevice.DevicePath); err != nil {
			return nil, err
		}
	}

	lock, err := e.lockVolume(s.UUID)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	if raw != nil {
		// Every refusal must come before the first write, state included.
		if err := e.checkRaw(s, raw); err != nil {
			return nil, err
		}
	}
	rec, err := e.record(o, raw)
	if err != nil {
		return nil, err
	}
	if s.SparseLoopDevice != nil {
		err = e.prepareSparse(ctx, o, rec, res)
	} else {
		err = e.prepareRaw(ctx, o, rec, raw, res)
	}
	if err != nil {
		return nil, err
	}
	if rec.Phase != nodestate.PhasePrepared {
		rec.Phase = nodestate.PhasePrepared
		if err := e.State.Save(rec); err != nil {
			return nil, failed("state", err, "saving state of %s", s.Name)
		}
		o.changed = true
	}
	o.step("prepared")
	res.State = StatePrepared
	res.Changed = o.changed
	if _, err := e.usage(res.DeviceName, res); err != nil {
		return nil, err
	}
	return res, nil
}

// checkCapacity refuses sizes no file on this filesystem could ever have,
// and warns about overcommitting free space (sparse files are thin).
func (e *Engine) checkCapacity(s *spec.Spec) (string, error) {
	dir := e.State.Root
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", failed("statfs", err, "reading the size of the filesystem holding %s", e.State.Root)
	}
	total := int64(st.Blocks) * st.Bsize
	free := int64(st.Bavail) * st.Bsize
	if s.SizeBytes > total {
		return "", invalid("size_too_large", "sparseLoopDevice.size: %s is larger than the whole filesystem holding %s (%s): use a smaller size",
			spec.FormatSize(s.SizeBytes), e.State.Root, spec.FormatSize(total))
	}
	if s.SizeBytes > free {
		return fmt.Sprintf("sparseLoopDevice.size %s is more than the free space under %s (%s): the sparse file is thin, but writes will fail once the filesystem is full",
			spec.FormatSize(s.SizeBytes), e.State.Root, spec.FormatSize(free)), nil
	}
	return "", nil
}

// record loads or creates the volume's node state, refusing specs that
// clash with what this node already holds. The global lock makes the name
// and device checks atomic with the write.
func (e *Engine) record(o *op, raw *rawDevice) (*nodestate.Record, error) {
	s := o.s
	g, err := e.State.Lock("global")
	if err != nil {
		return nil, failed("lock", err, "taking the state lock")
	}
	defer g.Unlock()
	all, errs := e.State.All()
	if len(errs) > 0 {
		return nil, failed("state", errors.Join(errs...), "reading node state")
	}
	var rec *nodestate.Record
	for _, r := range all {
		switch {
		case r.Spec.UUID == s.UUID:
			rec = r
		case r.Spec.Name == s.Name:
			return nil, refused("name_conflict", "name: volume %q already exists on this node with uuid %s: choose another name or delete that volume first", s.Name, r.Spec.UUID)
		case raw != nil && r.Spec.RawBlockDevice != nil && r.DeviceNum == raw.dev.String():
			return nil, refused("device_conflict", "rawBlockDevice.devicePath: %s is already used by volume %q (%s)", s.RawBlockDevice.DevicePath, r.Spec.Name, r.Spec.UUID)
		}
	}
	if rec != nil {
		if same, why := s.SameVolume(rec.Spec); !same {
			return nil, refused("conflict", "volume %s is already on this node with a different spec (%s): delete it first, or use a new uuid", s.UUID, why)
		}
		return rec, nil
	}
	rec = &nodestate.Record{Spec: s, Phase: nodestate.PhasePreparing}
	if raw != nil {
		rec.Device, rec.DeviceNum = raw.name, raw.dev.String()
	}
	if err := e.State.Save(rec); err != nil {
		return nil, failed("state", err, "saving state of %s", s.Name)
	}
	o.changed = true
	o.step("recorded")
	return rec, nil
}

func (e *Engine) prepareSparse(ctx context.Context, o *op, rec *nodestate.Record, res *Result) error {
	s := o.s
	file := e.State.SparseFile(s.UUID)
	res.BackingFile = file

	created, err := ensureSparseFile(file, s.SizeBytes)
	if err != nil {
		return err
	}
	if created {
		o.changed = true
		o.step("file-created", "path", file)
	}

	// Format (or partition) the file before attaching it, so that udev, where
	// it runs, sees the final signature on the loop device's first event.
	r, _, _, err := openProbe(file)
	if err != nil {
		return failed("probe", err, "reading %s", file)
	}
	if !ours(s, r) {
		if !r.Empty() && rec.Phase == nodestate.PhasePrepared {
			return refused("foreign_data", "%s holds %s, not this volume's signature; refusing to overwrite a prepared volume", file, r)
		}
		// The file is ours (state says we were preparing it); whatever a
		// crashed run left in it is not anyone's data.
		if s.Mode == spec.ModeFilesystem {
			if err := mkfs.Format(ctx, s.FSType, s.UUID, s.MkfsOptions, file); err != nil {
				return failed("mkfs", err, "formatting %s", file)
			}
			o.changed = true
			o.step("formatted", "fsType", s.FSType)
		} else {
			if err := writeGPT(file, s); err != nil {
				return err
			}
			o.changed = true
			o.step("partitioned")
		}
	}

	devs, err := loopdev.Find(file)
	if err != nil {
		return failed("loop", err, "looking for the loop device of %s", file)
	}
	var dev loopdev.Device
	if len(devs) > 0 {
		dev = devs[0]
	} else {
		if dev, err = loopdev.Attach(ctx, file); err != nil {
			return failed("attach", err, "attaching %s", file)
		}
		o.changed = true
		o.step("attached", "device", dev.Path)
	}
	res.DeviceName, res.DevicePath = dev.Name, dev.Path
	return e.finishDevice(ctx, o, dev.Name, res)
}

// finishDevice makes the partition node (Block mode) and the persistent link
// exist and fills in the device fields.
func (e *Engine) finishDevice(ctx context.Context, o *op, disk string, res *Result) error {
	s := o.s
	name := disk
	if s.Mode == spec.ModeBlock {
		size, err := blockdev.SizeOf(disk)
		if err != nil {
			return failed("sysfs", err, "reading the size of %s", disk)
		}
		start, length, err := gpt.Extent(size, sectorSize(disk))
		if err != nil {
			return failed("gpt", err, "computing the partition of %s", disk)
		}
		p, ok, _ := partitionAt(disk, 1)
		if !ok || p.Start != start || p.Size != length {
			_ = loopdev.Reread(disk)
			if name, err = loopdev.EnsurePartition(disk, 1, start, length); err != nil {
				return failed("partition", err, "making partition 1 of %s known to the kernel", disk)
			}
			o.changed = true
			o.step("partition-added", "device", name)
		} else {
			name = p.name
		}
	}
	return e.linkDevice(ctx, o, name, res)
}

// linkDevice makes /dev/<name> and the persistent link exist, and fills in
// the device fields of res.
func (e *Engine) linkDevice(ctx context.Context, o *op, name string, res *Result) error {
	path, err := blockdev.EnsureNode(name)
	if err != nil {
		return failed("node", err, "making /dev/%s", name)
	}
	size, err := blockdev.SizeOf(name)
	if err != nil {
		return failed("sysfs", err, "reading the size of %s", name)
	}
	res.DeviceName, res.DevicePath, res.Size = name, path, size

	link := o.s.PersistentPath()
	if devlinks.Resolve(link) != name {
		if err := devlinks.Ensure(ctx, link, name, e.UdevWait); err != nil {
			return failed("link", err, "creating %s", link)
		}
		o.changed = true
		o.step("linked", "link", link, "device", name)
	}
	return nil
}

type namedPartition struct {
	blockdev.PartitionInfo
	name string
}

func partitionAt(disk string, pno int) (namedPartition, bool, error) {
	kids, err := blockdev.Children(disk)
	if err != nil {
		return namedPartition{}, false, err
	}
	for _, k := range kids {
		p, ok, err := blockdev.Partition(k)
		if err == nil && ok && p.Number == pno {
			return namedPartition{p, k}, true, nil
		}
	}
	return namedPartition{}, false, nil
}

func sectorSize(name string) int {
	b, err := os.ReadFile(filepath.Join(blockdev.SysBlock, name, "queue", "logical_block_size"))
	if err != nil {
		return 512
	}
	var n int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &n); err != nil || n == 0 {
		return 512
	}
	return n
}

// ensureSparseFile creates the file at its exact size. A zero-length file is
// what a crash between create and truncate leaves behind.
func ensureSparseFile(file string, size int64) (bool, error) {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, failed("file", err, "creating %s", file)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, failed("file", err, "reading %s", file)
	}
	switch st.Size() {
	case size:
		return false, nil
	case 0:
		if err := f.Truncate(size); err != nil {
			return false, failed("file", err, "sizing %s", file)
		}
		if err := f.Sync(); err != nil {
			return false, failed("file", err, "syncing %s", file)
		}
		return true, nil
	}
	return false, refused("size_mismatch", "%s is %d bytes, but the volume is %d bytes; resizing is not supported", file, st.Size(), size)
}

func writeGPT(path string, s *spec.Spec) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return failed("gpt", err, "opening %s", path)
	}
	defer f.Close()
	size, ss, err := geometry(f)
	if err != nil {
		return failed("gpt", err, "reading the size of %s", path)
	}
	if _, _, err := gpt.Create(f, size, ss, s.UUID, s.Name); err != nil {
		return failed("gpt", err, "writing the GPT of %s", path)
	}
	return nil
}

// rawDevice is a resolved rawBlockDevice.devicePath.
type rawDevice struct {
	path string // as given
	real string // symlinks resolved
	name string // kernel name
	dev  blockdev.Dev
	// held is set by checkRaw: the device already carries this volume.
	held bool
}

func resolveRaw(p string) (*rawDevice, error) {
	const field = "rawBlockDevice.devicePath"
	real, err := filepath.EvalSymlinks(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, invalid("device_not_found", "%s: %s does not exist on this node: check the path (ls -l /dev/disk/by-id) and the node", field, p)
	}
	if err != nil {
		return nil, failed("device", err, "resolving %s", p)
	}
	if !strings.HasPrefix(real, "/dev/") {
		return nil, refused("symlink_escape", "%s: %s resolves to %s, outside /dev: refusing to treat it as a device", field, p, real)
	}
	d, err := blockdev.Stat(real)
	if errors.Is(err, blockdev.ErrNotBlock) {
		return nil, refused("not_block_device", "%s: %s is not a block device", field, p)
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

// checkRaw refuses, before anything is written, a raw device that is not
// already this volume and is not blank, unused and whole.
func (e *Engine) checkRaw(s *spec.Spec, raw *rawDevice) error {
	const field = "rawBlockDevice.devicePath"
	size, err := blockdev.SizeOf(raw.name)
	if err != nil {
		return failed("sysfs", err, "reading the size of %s", raw.name)
	}
	if err := s.CheckDeviceSize(size); err != nil {
		return err
	}
	if raw.held = holdsVolume(s, raw.name); raw.held {
		return nil // already this volume: prepare only re-links it
	}
	rec, err := e.State.Load(s.UUID)
	if err != nil {
		return failed("state", err, "reading state of %s", s.Name)
	}
	if rec != nil && rec.Phase == nodestate.PhasePrepared && rec.DeviceNum != "" && rec.DeviceNum != raw.dev.String() {
		return refused("device_changed", "%s: %s now points at %s, not the device %s this volume was prepared on, and %s does not carry the volume",
			field, raw.path, raw.name, rec.Device, raw.name)
	}
	part, isPart, err := blockdev.Partition(raw.name)
	if err != nil {
		return failed("sysfs", err, "reading %s", raw.name)
	}
	if s.Mode == spec.ModeBlock && isPart {
		parentPath, err := blockdev.EnsureNode(part.Parent)
		if err != nil {
			return failed("node", err, "making /dev/%s", part.Parent)
		}
		pr, _, ss, err := openProbe(parentPath)
		if err != nil {
			return failed("probe", err, "reading %s", parentPath)
		}
		if pr.Kind != "gpt" || pr.GPT == nil {
			return invalid("not_gpt", "%s: %s is a partition of %s, which has a %s, not a GPT: Block mode needs a GPT partition (or give the whole disk)", field, raw.path, parentPath, pr)
		}
		if pr.GPT.FromBackup {
			return refused("gpt_damaged", "%s: the primary GPT of %s is damaged: repair it (sgdisk -e / gdisk) first", field, parentPath)
		}
		entry, ok := pr.GPT.Partition(part.Number)
		if !ok || entry.Start(ss) != part.Start || entry.Size(ss) != part.Size {
			return refused("table_mismatch", "%s: the GPT of %s does not match the kernel's view of partition %d (%s): re-read the partition table first", field, parentPath, part.Number, raw.name)
		}
	}
	r, _, _, err := openProbe("/dev/" + raw.name)
	if err != nil {
		return failed("probe", err, "reading %s", raw.path)
	}
	return refuseUnsafe(raw, r)
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
	if !raw.held {
		target := "/dev/" + raw.name
		if s.Mode == spec.ModeFilesystem {
			if err := mkfs.Format(ctx, s.FSType, s.UUID, s.MkfsOptions, target); err != nil {
				return failed("mkfs", err, "formatting %s", raw.path)
			}
			o.changed = true
			o.step("formatted", "fsType", s.FSType, "device", target)
		} else {
			// O_EXCL fails if anything claimed the disk since checkRaw.
			f, err := os.OpenFile(target, os.O_RDWR|os.O_EXCL|unix.O_CLOEXEC, 0)
			if err != nil {
				return refused("device_busy", "opening %s exclusively: %v", raw.path, err)
			}
			sz, ss, err := geometry(f)
			if err == nil {
				_, _, err = gpt.Create(f, sz, ss, s.UUID, s.Name)
			}
			f.Close()
			if err != nil {
				return failed("gpt", err, "writing the GPT of %s", raw.path)
			}
			o.changed = true
			o.step("partitioned", "device", target)
		}
	}
	if err := e.rememberDevice(rec, raw); err != nil {
		return err
	}
	return e.finishDevice(ctx, o, raw.name, res)
}

// holdsVolume reads the device's own signature: a GPT we wrote counts even
// before the kernel knows its partition (a prepare killed right after
// writing it).
func holdsVolume(s *spec.Spec, name string) bool {
	if _, isPart, _ := blockdev.Partition(name); isPart && s.Mode == spec.ModeBlock {
		return carries(s, name, false) != ""
	}
	r, _, _, err := openProbe("/dev/" + name)
	return err == nil && ours(s, r)
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

// refuseUnsafe protects data: a raw device must be blank, unused and not
// carved up before we write anything.
func refuseUnsafe(raw *rawDevice, r probe.Result) error {
	const field = "rawBlockDevice.devicePath"
	u, err := blockdev.UsageOf(raw.name)
	if err != nil {
		return failed("usage", err, "checking whether %s is in use", raw.path)
	}
	if u.InUse() {
		return refused("in_use", "%s: %s is %s: refusing to touch it", field, raw.path, u)
	}
	if !r.Empty() {
		return refused("foreign_data", "%s: %s holds a %s that is not this volume's: refusing to overwrite it (wipe it yourself if it is really unused, e.g. wipefs -a %s)", field, raw.path, r, raw.path)
	}
	if kids, _ := blockdev.Children(raw.name); len(kids) > 0 {
		return refused("foreign_data", "%s: %s has partitions (%s): refusing to overwrite them", field, raw.path, strings.Join(kids, ", "))
	}
	return nil
}

// preparePartitionGUID stamps the volume UUID as the unique GUID of an
// existing GPT partition, changing nothing else on the disk.
func (e *Engine) preparePartitionGUID(ctx context.Context, o *op, rec *nodestate.Record, raw *rawDevice, part blockdev.PartitionInfo, res *Result) error {
	s := o.s
	if !raw.held {
		parentPath := "/dev/" + part.Parent
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
	if err := e.rememberDevice(rec, raw); err != nil {
		return err
	}
	return e.linkDevice(ctx, o, raw.name, res)
}
