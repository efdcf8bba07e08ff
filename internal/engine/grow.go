package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// A sparse volume grows when prepare is given a larger size than its record
// holds. Each step looks at what is there and does only what is missing
// (file size, table, loop capacity, kernel partition, filesystem), and the
// record takes the new size last: a run killed at any step is finished by
// the next one.

// growing tells whether this prepare grows a volume already written.
func growing(s *spec.Spec, rec *nodestate.Record) bool {
	return s.SparseLoopDevice != nil && rec != nil && rec.Formatted() && rec.Spec.SizeBytes < s.SizeBytes
}

// checkGrowth applies the overcommit rule to what a growth adds.
func (e *Engine) checkGrowth(s *spec.Spec, rec *nodestate.Record, all []*nodestate.Record) error {
	// A restore's whole copy waiting to be swapped in has the old size:
	// finished or rolled back first, never renamed over a grown file.
	if err := e.refuseRestorePending(rec.Spec, "", "growing it to "+spec.FormatSize(s.SizeBytes)); err != nil {
		return err
	}
	more := *s
	more.SizeBytes = s.SizeBytes - rec.Spec.SizeBytes
	return e.checkOvercommit(&more, all)
}

// growTable lays our GPT out again over the grown file or disk f of size
// bytes: the same partition GUID and start, the partition to the new end,
// the backup table moved there, the disk GUID kept. The partition's data
// is not touched.
func (e *Engine) growTable(o *op, f *os.File, size int64, ss int) error {
	s := o.s
	t, err := gpt.Read(f, size, ss)
	if err != nil {
		return failed("gpt", err, "reading the GPT of %s", f.Name())
	}
	start, length, err := gpt.Extent(size, ss)
	if err != nil {
		return failed("gpt", err, "laying out %s", f.Name())
	}
	if p, ok := t.Partition(1); ok && !t.FromBackup && p.Start(ss) == start && p.Size(ss) == length {
		return nil
	}
	if p, ok := t.Partition(1); !ok || p.Start(ss) != start || p.GUID != s.UUID {
		return refused("damaged", "volume %s: the GPT of %s is not the one salt-volumes wrote (partition 1 at %d, GUID %s): not growing it", s.Name, f.Name(), start, s.UUID)
	}
	if _, _, err := gpt.Relay(f, size, ss, s.UUID, s.Name, t.DiskGUID); err != nil {
		return failed("gpt", err, "growing the GPT of %s", f.Name())
	}
	o.changed = true
	o.step("table-grown", "size", size)
	return nil
}

// growRaw grows a raw volume to what its device has become: the device is
// the recorded one (recordMatches took it larger only as itself), and all
// of it is the volume's. A whole disk in Block mode gets our GPT laid out to
// its new end (the kernel's partition follows in finishDevice); a
// filesystem grows to its device. The record takes the new size last.
func (e *Engine) growRaw(ctx context.Context, o *op, rec *nodestate.Record, name string) error {
	if !rec.Formatted() || rec.DeviceSize == 0 {
		return nil
	}
	// Right after a write to the disk's table (a partition's GUID set
	// here, or another volume's on the same disk), udev has the kernel
	// read the table again and the partition is away for a moment.
	size, err := blockdev.SizeOfSettled(name, partitionSettle)
	if err != nil {
		return failed("sysfs", err, "reading the size of %s", name)
	}
	if size <= rec.DeviceSize {
		return nil
	}
	s := o.s
	_, isPart, _ := blockdev.Partition(name)
	switch {
	case s.Mode == spec.ModeBlock && !isPart:
		path := "/dev/" + name
		// Not exclusive: the volume's partition may be open (a pod).
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return failed("gpt", err, "opening %s", path)
		}
		err = e.growTable(o, f, size, sectorSize(name))
		f.Close()
		if err != nil {
			return err
		}
	case s.Mode == spec.ModeFilesystem:
		if err := e.growFS(ctx, o, name); err != nil {
			return err
		}
	}
	rec.DeviceSize, o.unsaved = size, true
	o.changed = true
	o.step("grown", "device", name, "size", size)
	return nil
}

// growLoop tells the loop device its file grew.
func (e *Engine) growLoop(o *op, dev loopdev.Device) error {
	size, err := blockdev.SizeOf(dev.Name)
	if err != nil {
		return failed("sysfs", err, "reading the size of %s", dev.Name)
	}
	if size >= o.s.SizeBytes {
		return nil
	}
	if err := loopdev.SetCapacity(dev); err != nil {
		return failed("loop", err, "growing %s", dev.Path)
	}
	o.changed = true
	o.step("loop-grown", "device", dev.Path, "size", o.s.SizeBytes)
	return nil
}

// growFS grows the volume's filesystem to its device: online where it is
// mounted, else offline (ext4 after a forced check; xfs, which only grows
// mounted, on a private mount of our own).
func (e *Engine) growFS(ctx context.Context, o *op, name string) error {
	s := o.s
	dev := "/dev/" + name
	u, err := blockdev.UsageOf(name)
	if err != nil {
		return failed("usage", err, "checking whether %s is mounted", dev)
	}
	mounts := u.Mountpoints
	tmpDir := filepath.Join(e.State.Root, "grow-"+s.UUID)
	ours := ""
	for _, m := range mounts {
		if m == tmpDir {
			ours = m // a run killed while it held the volume mounted
		}
	}
	switch s.FSType {
	case spec.FSXFS:
		mp := ""
		if len(mounts) > 0 {
			mp = mounts[0]
		} else {
			if err := os.MkdirAll(tmpDir, 0o700); err != nil {
				return failed("grow", err, "making %s", tmpDir)
			}
			if err := unix.Mount(dev, tmpDir, "xfs", unix.MS_NOATIME, ""); err != nil {
				return failed("grow", err, "mounting %s to grow it", dev)
			}
			mp, ours = tmpDir, tmpDir
		}
		if err := runTool(ctx, "xfs_growfs", "-d", mp); err != nil {
			return failed("grow", err, "growing the xfs filesystem of %s", s.Name)
		}
	default:
		if len(mounts) == 0 {
			// resize2fs wants a checked filesystem to grow it offline.
			if err := runTool(ctx, "e2fsck", "-f", "-p", dev); err != nil {
				return failed("grow", err, "checking %s before growing it", dev)
			}
		}
		if err := runTool(ctx, "resize2fs", dev); err != nil {
			if len(mounts) > 0 && strings.Contains(err.Error(), "Permission denied to resize") {
				return failed("grow", err, "growing the mounted ext4 filesystem of %s online: the kernel refused (it needs CAP_SYS_RESOURCE, which this node's root lacks?); unmount it and run again to grow it offline", s.Name)
			}
			return failed("grow", err, "growing the ext4 filesystem of %s", s.Name)
		}
	}
	if ours != "" {
		if err := unix.Unmount(ours, 0); err != nil {
			return failed("grow", err, "unmounting %s", ours)
		}
		_ = os.Remove(ours)
	}
	o.changed = true
	o.step("fs-grown", "fsType", s.FSType, "online", len(mounts) > 0 && ours == "")
	return nil
}

// runTool runs a filesystem tool; its output goes into the error.
func runTool(ctx context.Context, prog string, args ...string) error {
	path, err := exec.LookPath(prog)
	if err != nil {
		return fmt.Errorf("%s not found (e2fsprogs / xfsprogs): %w", prog, err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var ee *exec.ExitError
	// e2fsck -p: 1 means it fixed something, which is fine before a resize.
	if prog == "e2fsck" && errors.As(err, &ee) && ee.ExitCode() == 1 {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
