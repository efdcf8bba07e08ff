// Package loopdev attaches and detaches loop devices with the kernel's
// ioctls, finds the loop device of a backing file, and makes sure partition
// nodes exist (BLKPG) on kernels whose partition scan does not create them.
package loopdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"golang.org/x/sys/unix"
)

// Device is an attached loop device.
type Device struct {
	Name string // loop3
	Path string // /dev/loop3
	// backing is the file the device was bound to when it was attached or
	// found (st_dev, st_ino); zero for a Device made from a name alone.
	// Loop devices are the machine's: once ours is detached, its number
	// is anyone's, and a detach by number alone would take theirs.
	backing [2]uint64
}

// fileID is a backing file's identity as LOOP_GET_STATUS64 reports it.
func fileID(st *unix.Stat_t) [2]uint64 { return [2]uint64{st.Dev, st.Ino} }

// boundTo reports whether the device open at fd is bound to the file d
// was found or attached with. A device made from a name alone is taken at
// its word. It returns the status it read, nil when nothing is bound.
func (d Device) boundTo(fd int) (*unix.LoopInfo64, bool, error) {
	info, err := unix.IoctlLoopGetStatus64(fd)
	if errors.Is(err, unix.ENXIO) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("LOOP_GET_STATUS64 %s: %w", d.Path, err)
	}
	return info, d.backing == [2]uint64{} || d.backing == statusID(info), nil
}

// statusID is the identity of the file a loop device's status names.
func statusID(info *unix.LoopInfo64) [2]uint64 { return [2]uint64{info.Device, info.Inode} }

func byNumber(n int) Device {
	name := "loop" + strconv.Itoa(n)
	return Device{Name: name, Path: "/dev/" + name}
}

// Attach binds backing to a free loop device with PARTSCAN set, so that the
// kernel (where it can) scans partitions and always drops stale ones on
// detach. AUTOCLEAR stays off: the device must outlive this process.
func Attach(ctx context.Context, backing string) (Device, error) {
	d, _, err := attach(ctx, backing, false)
	return d, err
}

// Held is a loop device attached while this process holds an exclusive
// lock (flock) on it. udev takes a shared lock on a block device before it
// handles the device's event, and puts the event back while it cannot:
// until Release it neither probes the device nor links it by what it
// carries (a copy of a filesystem with its origin's UUID).
type Held struct {
	Device
	f *os.File
}

// AttachHeld is Attach for a device udev is kept away from (Held). The
// device detaches itself when its last user closes it (autoclear): a
// process killed while holding it leaves nothing attached once nothing
// else (a mount) has it open.
func AttachHeld(ctx context.Context, backing string) (*Held, error) {
	d, f, err := attach(ctx, backing, true)
	if err != nil {
		return nil, err
	}
	return &Held{Device: d, f: f}, nil
}

// Release detaches the device and drops the lock. The kernel puts a
// detach off until the device's last user closes it, which the held
// descriptor is once nothing is mounted on it: closing it detaches, right
// after the lock goes (udev puts a refused event back for 200 ms).
func (h *Held) Release(ctx context.Context, wait time.Duration) error {
	err := unix.IoctlSetInt(int(h.f.Fd()), unix.LOOP_CLR_FD, 0)
	h.f.Close()
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", h.Path, err)
	}
	if err := waitDetached(ctx, h.Device, wait); err != nil {
		return fmt.Errorf("%w (it detaches when the last user closes it: umount what is mounted from it)", err)
	}
	return nil
}

// waitDetached waits until the kernel has let go of d (its loop directory
// gone from sysfs, or the number bound to another file already), up to
// wait.
func waitDetached(ctx context.Context, d Device, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		if _, err := os.Stat(filepath.Join("/sys/block", d.Name, "loop")); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if d.backing != [2]uint64{} {
			if info, err := status(d.Path); errors.Is(err, unix.ENXIO) || err == nil && statusID(info) != d.backing {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is still attached %s after detach: something still holds it open", d.Path, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func attach(ctx context.Context, backing string, held bool) (Device, *os.File, error) {
	abs, err := filepath.Abs(backing)
	if err != nil {
		return Device{}, nil, err
	}
	back, err := os.OpenFile(abs, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return Device{}, nil, err
	}
	defer back.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(back.Fd()), &st); err != nil {
		return Device{}, nil, fmt.Errorf("reading %s: %w", abs, err)
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, nil, fmt.Errorf("opening /dev/loop-control: %w", err)
	}
	defer ctl.Close()

	// GET_FREE hands the same device to concurrent callers; the loser gets
	// EBUSY from CONFIGURE and must ask again.
	for attempt := 0; attempt < 200; attempt++ {
		if err := ctx.Err(); err != nil {
			return Device{}, nil, err
		}
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return Device{}, nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		d := byNumber(n)
		d.backing = fileID(&st)
		if _, err := blockdev.EnsureNode(d.Name); err != nil {
			return Device{}, nil, err
		}
		f, err := configure(d.Path, back, abs, held)
		if errors.Is(err, unix.EBUSY) {
			time.Sleep(time.Duration(attempt%10+1) * time.Millisecond)
			continue
		}
		if err != nil {
			return Device{}, nil, err
		}
		return d, f, nil
	}
	return Device{}, nil, errors.New("no free loop device after 200 attempts")
}

// configure binds back to the loop device dev; with held, under an
// exclusive lock taken before, and autoclear: the open, locked device is
// returned.
func configure(dev string, back *os.File, name string, held bool) (_ *os.File, err error) {
	lf, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil || !held {
			lf.Close()
		}
	}()
	var info unix.LoopInfo64
	info.Flags = unix.LO_FLAGS_PARTSCAN
	if held {
		if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
			return nil, fmt.Errorf("locking %s: %w", dev, err)
		}
		info.Flags |= unix.LO_FLAGS_AUTOCLEAR
	}
	copy(info.File_name[:unix.LO_NAME_SIZE-1], name)
	cfg := unix.LoopConfig{Fd: uint32(back.Fd()), Info: info}
	err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		if err != nil {
			return nil, fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
		}
		return lf, nil
	}
	// Kernels before 5.8 have no LOOP_CONFIGURE.
	if err := unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_SET_FD, int(back.Fd())); err != nil {
		return nil, fmt.Errorf("LOOP_SET_FD %s: %w", dev, err)
	}
	if err := unix.IoctlLoopSetStatus64(int(lf.Fd()), &info); err != nil {
		_ = unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_CLR_FD, 0)
		return nil, fmt.Errorf("LOOP_SET_STATUS64 %s: %w", dev, err)
	}
	return lf, nil
}

// Find returns the loop devices currently backed by the file at path,
// matched by device and inode (names are truncated and do not follow
// renames).
func Find(path string) ([]Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, err
	}
	bound, err := Bound()
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, d := range bound {
		info, err := status(d.Path)
		if err != nil {
			continue // detached meanwhile
		}
		if info.Device == st.Dev && info.Inode == st.Ino {
			d.backing = fileID(&st)
			out = append(out, d)
		}
	}
	return out, nil
}

// Index maps backing files (by device and inode) to the loop devices bound
// to them, read once: for callers that look up many files.
type Index map[[2]uint64][]Device

// NewIndex reads every bound loop device's backing file.
func NewIndex() (Index, error) {
	bound, err := Bound()
	if err != nil {
		return nil, err
	}
	idx := Index{}
	for _, d := range bound {
		info, err := status(d.Path)
		if err != nil {
			continue // detached meanwhile
		}
		k := statusID(info)
		d.backing = k
		idx[k] = append(idx[k], d)
	}
	return idx, nil
}

// Find returns the loop devices bound to the file at path.
func (idx Index) Find(path string) []Device {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil
	}
	return idx[[2]uint64{st.Dev, st.Ino}]
}

// Bound lists loop devices that have a backing file.
func Bound() ([]Device, error) {
	var out []Device
	for _, n := range blockdev.BoundLoops() {
		num, _ := strconv.Atoi(strings.TrimPrefix(n, "loop"))
		out = append(out, byNumber(num))
	}
	return out, nil
}

// BackingFile reads the backing file the kernel recorded for a bound device.
func BackingFile(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func status(dev string) (*unix.LoopInfo64, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return unix.IoctlLoopGetStatus64(fd)
}

// Detach unbinds the device and waits until the kernel has really let go of
// it: a detach of a busy device only sets AUTOCLEAR and returns success.
// A device no longer bound to the file it was attached or found with is
// detached already: whoever bound its number since is left alone.
func Detach(ctx context.Context, d Device, wait time.Duration) error {
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, ours, err := d.boundTo(fd)
	if err != nil || !ours {
		unix.Close(fd)
		return err
	}
	parts := partitionNodes(d.Name)
	err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	unix.Close(fd)
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", d.Path, err)
	}
	if err := waitDetached(ctx, d, wait); err != nil {
		return keepAttached(d, err)
	}
	partitionsGone(parts, time.Second)
	dropStaleNodes(parts)
	return nil
}

// partitionNodes reads the device numbers of disk's partitions.
func partitionNodes(disk string) map[string]blockdev.Dev {
	out := map[string]blockdev.Dev{}
	kids, _ := blockdev.Children(disk)
	for _, k := range kids {
		if n, err := blockdev.DevOf(k); err == nil {
			out[k] = n
		}
	}
	return out
}

// dropStaleNodes removes the /dev nodes of partitions that are gone and
// that devtmpfs left because it did not make them (see delPartition). A
// partition of the same name added in between (a loop number freed by a
// detach is the next attach's) most likely has the same numbers, and
// devtmpfs made no node for it while ours was there: its node is put back.
func dropStaleNodes(was map[string]blockdev.Dev) {
	for name, n := range was {
		if _, err := blockdev.DevOf(name); err == nil {
			continue // still there (a detach put off)
		}
		if got, err := blockdev.Stat("/dev/" + name); err != nil || got != n {
			continue
		}
		_ = os.Remove("/dev/" + name)
		if _, err := blockdev.DevOf(name); err == nil {
			_, _ = blockdev.EnsureNode(name)
		}
	}
}

// partitionsGone waits, up to wait, until none of the partitions in was
// is in sysfs any more: a detach that another opener's close completes
// tears the device down before its partitions.
func partitionsGone(was map[string]blockdev.Dev, wait time.Duration) {
	deadline := time.Now().Add(wait)
	for name := range was {
		for {
			if _, err := blockdev.DevOf(name); err != nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// keepAttached undoes what a detach of a busy device did (LOOP_CLR_FD
// only set AUTOCLEAR), so that the device stays attached when its last
// user closes it instead of vanishing then; err is the detach's failure.
// A device the kernel let go of meanwhile is detached after all (nil).
func keepAttached(d Device, err error) error {
	cerr := ClearAutoclear(d)
	if _, serr := os.Stat(filepath.Join("/sys/block", d.Name, "loop")); errors.Is(serr, os.ErrNotExist) {
		return nil
	}
	if cerr != nil {
		return fmt.Errorf("%w; and its autoclear flag could not be cleared (%v): it detaches when its last user closes it", err, cerr)
	}
	return fmt.Errorf("%w (it stays attached)", err)
}

// ClearAutoclear clears LO_FLAGS_AUTOCLEAR of a bound loop device, the
// rest of its status kept (LOOP_SET_STATUS64 changes only the flags that
// differ from what LOOP_GET_STATUS64 read).
func ClearAutoclear(d Device) error {
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	info, ours, err := d.boundTo(fd)
	if err != nil || !ours {
		return err
	}
	if info.Flags&unix.LO_FLAGS_AUTOCLEAR == 0 {
		return nil
	}
	info.Flags &^= unix.LO_FLAGS_AUTOCLEAR
	if err := unix.IoctlLoopSetStatus64(fd, info); err != nil {
		return fmt.Errorf("LOOP_SET_STATUS64 %s: %w", d.Path, err)
	}
	return nil
}

// Autoclear tells whether the loop device d has LO_FLAGS_AUTOCLEAR set.
func Autoclear(d Device) (bool, error) {
	info, err := status(d.Path)
	if err != nil {
		return false, err
	}
	return info.Flags&unix.LO_FLAGS_AUTOCLEAR != 0, nil
}

// EnsurePartition makes partition pno of the loop device (or any disk)
// exist with the given extent in bytes. Kernels without the GPT parser
// accept PARTSCAN but create nothing, so add it ourselves with BLKPG.
func EnsurePartition(disk string, pno int, start, length int64) (string, error) {
	if name, ok := findPartition(disk, pno); ok {
		p, _, err := blockdev.Partition(name)
		if err == nil && p.Start == start && p.Size == length {
			return name, nil
		}
		if err == nil && p.Start == start {
			// A grown volume: the partition grows in place, open or
			// mounted as it may be (deleting it would need it unused).
			if err := blkpg(disk, unix.BLKPG_RESIZE_PARTITION, pno, start, length); err != nil {
				return "", err
			}
			return name, nil
		}
		if err := delPartition(disk, name, pno); err != nil {
			return "", err
		}
	}
	if err := blkpg(disk, unix.BLKPG_ADD_PARTITION, pno, start, length); err != nil {
		// A re-read of the table (udev's, after a writer closed the
		// disk) may have added the same partition meanwhile.
		if name, ok := findPartition(disk, pno); ok && errors.Is(err, unix.EBUSY) {
			if p, _, perr := blockdev.Partition(name); perr == nil && p.Start == start && p.Size == length {
				return name, nil
			}
		}
		return "", err
	}
	name, ok := findPartition(disk, pno)
	if !ok {
		return "", fmt.Errorf("partition %d of %s did not appear after BLKPG", pno, disk)
	}
	return name, nil
}

// SetCapacity makes the loop device take its backing file's new size
// (LOOP_SET_CAPACITY), while it stays attached and in use.
func SetCapacity(d Device) error {
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.LOOP_SET_CAPACITY, 0); e != 0 {
		return fmt.Errorf("LOOP_SET_CAPACITY on %s: %w", d.Path, e)
	}
	return nil
}

// RemovePartition drops a partition from the kernel's view (not the disk).
func RemovePartition(disk string, pno int) error {
	name, ok := findPartition(disk, pno)
	if !ok {
		return nil
	}
	return delPartition(disk, name, pno)
}

// delPartition deletes partition pno (kernel name name) of disk, and the
// /dev node of it that devtmpfs does not: devtmpfs removes only nodes it
// made, and one made by hand (blockdev.EnsureNode, while devtmpfs caught
// up) would stay behind with numbers the kernel hands to the next
// partition added anywhere, so that a later partition of that name
// reached through it would be another disk's.
func delPartition(disk, name string, pno int) error {
	was := partitionNodes(disk)
	if err := blkpg(disk, unix.BLKPG_DEL_PARTITION, pno, 0, 0); err != nil {
		return err
	}
	if n, ok := was[name]; ok {
		dropStaleNodes(map[string]blockdev.Dev{name: n})
	}
	return nil
}

func findPartition(disk string, pno int) (string, bool) {
	kids, err := blockdev.Children(disk)
	if err != nil {
		return "", false
	}
	for _, k := range kids {
		if p, ok, err := blockdev.Partition(k); err == nil && ok && p.Number == pno {
			return k, true
		}
	}
	return "", false
}

func blkpg(disk string, op int32, pno int, start, length int64) error {
	fd, err := unix.Open("/dev/"+disk, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	p := unix.BlkpgPartition{Start: start, Length: length, Pno: int32(pno)}
	a := unix.BlkpgIoctlArg{Op: op, Datalen: int32(unsafe.Sizeof(p)), Data: (*byte)(unsafe.Pointer(&p))}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKPG, uintptr(unsafe.Pointer(&a))); e != 0 {
		return fmt.Errorf("BLKPG op %d on /dev/%s partition %d: %w", op, disk, pno, e)
	}
	return nil
}

// Reread asks the kernel to rescan a disk's partition table; harmless where
// the kernel has no parser for it.
func Reread(disk string) error {
	fd, err := unix.Open("/dev/"+disk, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKRRPART, 0)
	if e != 0 {
		return e
	}
	return nil
}
