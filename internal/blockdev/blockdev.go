// Package blockdev answers questions about block devices from the kernel
// itself (stat, sysfs, mountinfo, ioctls), without udev or external tools.
package blockdev

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SysBlock is where the kernel lists block devices by name.
const SysBlock = "/sys/class/block"

// Dev is a device number.
type Dev struct{ Major, Minor uint32 }

func (d Dev) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// ErrNotBlock is returned for paths that exist but are not block devices.
var ErrNotBlock = errors.New("not a block device")

// Stat follows symlinks and returns the device number of a block device.
func Stat(path string) (Dev, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Dev{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return Dev{}, fmt.Errorf("%s: %w", path, ErrNotBlock)
	}
	return Dev{unix.Major(st.Rdev), unix.Minor(st.Rdev)}, nil
}

// Name returns the kernel name (sda, nvme0n1p3, loop3p1) of a device number.
func Name(d Dev) (string, error) {
	l, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%s", d))
	if err != nil {
		return "", fmt.Errorf("device %s is not known to sysfs: %w", d, err)
	}
	return filepath.Base(l), nil
}

// DevOf reads a kernel name's device number from sysfs.
func DevOf(name string) (Dev, error) {
	b, err := os.ReadFile(filepath.Join(SysBlock, name, "dev"))
	if err != nil {
		return Dev{}, err
	}
	var d Dev
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &d.Major, &d.Minor); err != nil {
		return Dev{}, fmt.Errorf("parsing %s/dev: %w", name, err)
	}
	return d, nil
}

// PartitionInfo is set for partitions: their number and their parent disk.
type PartitionInfo struct {
	Number int
	Parent string
	// Start and Size in bytes, as the kernel knows them.
	Start, Size int64
}

// Partition returns the partition info of name, or ok=false for whole disks.
// The parent comes from the sysfs hierarchy (the partition's directory lives
// inside its disk's), never from trimming digits off the name.
func Partition(name string) (PartitionInfo, bool, error) {
	dir := filepath.Join(SysBlock, name)
	b, err := os.ReadFile(filepath.Join(dir, "partition"))
	if errors.Is(err, os.ErrNotExist) {
		return PartitionInfo{}, false, nil
	}
	if err != nil {
		return PartitionInfo{}, false, err
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return PartitionInfo{}, false, err
	}
	p := PartitionInfo{Parent: filepath.Base(filepath.Dir(real))}
	if p.Number, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return p, true, fmt.Errorf("parsing %s/partition: %w", name, err)
	}
	start, err1 := readInt(filepath.Join(dir, "start"))
	size, err2 := readInt(filepath.Join(dir, "size"))
	if err := errors.Join(err1, err2); err != nil {
		return p, true, err
	}
	p.Start, p.Size = start*512, size*512
	return p, true, nil
}

// Children lists the partitions of a disk, by kernel name.
func Children(name string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(SysBlock, name))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		// The kernel names a partition after its disk (sda1, loop3p1,
		// nvme0n1p2): only those entries are worth a stat.
		if !partitionName(name, e.Name()) {
			continue
		}
		if _, err := os.Stat(filepath.Join(SysBlock, name, e.Name(), "partition")); err == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func partitionName(disk, n string) bool {
	rest, ok := strings.CutPrefix(n, disk)
	if !ok {
		return false
	}
	rest = strings.TrimPrefix(rest, "p")
	if rest == "" {
		return false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Holders lists devices stacked on name (device-mapper, md, bcache...).
func Holders(name string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(SysBlock, name, "holders"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}

// SizeOf is the size in bytes of a device by kernel name.
func SizeOf(name string) (int64, error) {
	n, err := readInt(filepath.Join(SysBlock, name, "size"))
	return n * 512, err
}

// SizeOfSettled is SizeOf of a device that may be away for a moment: a
// partition vanishes while the kernel reads its disk's table again (udev
// has it do so after a write to the table, a moment after that write), and
// comes back under the same name; up to wait is given for that.
func SizeOfSettled(name string, wait time.Duration) (int64, error) {
	deadline := time.Now().Add(wait)
	for {
		n, err := SizeOf(name)
		if err == nil || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV)) || time.Now().After(deadline) {
			return n, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Mountpoints returns where a device is mounted, from the mount table of
// this process's namespace, and "[SWAP]" if it is an active swap device.
func Mountpoints(d Dev) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	want := d.String()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && fields[2] == want {
			out = append(out, unescape(fields[4]))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if swaps, err := os.ReadFile("/proc/swaps"); err == nil {
		for _, line := range strings.Split(string(swaps), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			if sd, err := Stat(unescape(fields[0])); err == nil && sd == d {
				out = append(out, "[SWAP]")
			}
		}
	}
	return out, nil
}

// unescape undoes the octal escapes mountinfo uses for spaces and the like.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Usage says whether a device, or any partition of it, is in use.
type Usage struct {
	Mountpoints []string `json:"mountpoints,omitempty"`
	Holders     []string `json:"holders,omitempty"`
	// LoopBacked lists loop devices whose backing file is this device: the
	// loop driver sets no holders link for them.
	LoopBacked []string `json:"loopBacked,omitempty"`
}

func (u Usage) InUse() bool {
	return len(u.Mountpoints) > 0 || len(u.Holders) > 0 || len(u.LoopBacked) > 0
}

func (u Usage) String() string {
	var parts []string
	if len(u.Mountpoints) > 0 {
		parts = append(parts, "mounted on "+strings.Join(u.Mountpoints, ", "))
	}
	if len(u.Holders) > 0 {
		parts = append(parts, "held by "+strings.Join(u.Holders, ", "))
	}
	if len(u.LoopBacked) > 0 {
		parts = append(parts, "the backing file of "+strings.Join(u.LoopBacked, ", "))
	}
	return strings.Join(parts, " and ")
}

// UsageOf collects mounts and holders of name and of its partitions.
func UsageOf(name string) (Usage, error) {
	var u Usage
	names := []string{name}
	kids, err := Children(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return u, err
	}
	names = append(names, kids...)
	for _, n := range names {
		d, err := DevOf(n)
		if err != nil {
			continue
		}
		mps, err := Mountpoints(d)
		if err != nil {
			return u, err
		}
		for _, m := range mps {
			if n != name {
				m = n + ":" + m
			}
			u.Mountpoints = append(u.Mountpoints, m)
		}
		hs, err := Holders(n)
		if err != nil {
			return u, err
		}
		u.Holders = append(u.Holders, hs...)
		u.LoopBacked = append(u.LoopBacked, loopsBackedBy(d)...)
	}
	return u, nil
}

// loopsBackedBy lists the loop devices whose backing file is the block
// device d.
func loopsBackedBy(d Dev) []string {
	var out []string
	for _, n := range BoundLoops() {
		if bd, ok := LoopBacking(n); ok && bd == d {
			out = append(out, n)
		}
	}
	return out
}

// Sized lists the block devices the kernel gives a size, partitions
// included, from /proc/partitions in one read, with their size in 1 KiB
// blocks. Unbound loop devices are not there, nor is a loop device bound
// with zero capacity: no byte of its backing file is reachable through it.
func Sized() ([]SizedDevice, error) {
	b, err := os.ReadFile("/proc/partitions")
	if err != nil {
		return nil, err
	}
	var out []SizedDevice
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[2] == "0" || f[2] == "#blocks" {
			continue
		}
		blocks, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, SizedDevice{Name: f[3], Blocks: blocks})
	}
	return out, nil
}

// SizedDevice is one line of /proc/partitions.
type SizedDevice struct {
	Name   string
	Blocks int64
}

// BoundLoops lists the loop devices bound to something: from
// /proc/partitions (one read), or where it cannot be read from a stat of
// every /sys/block/loopN/loop (one per loop device node, bound or not).
func BoundLoops() []string {
	var out []string
	if sized, err := Sized(); err == nil {
		for _, d := range sized {
			if isLoop(d.Name) {
				out = append(out, d.Name)
			}
		}
		return out
	}
	ents, _ := os.ReadDir(SysBlock)
	for _, e := range ents {
		if !isLoop(e.Name()) {
			continue
		}
		if _, err := os.Stat(filepath.Join(SysBlock, e.Name(), "loop")); err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// isLoop: loopN, not a partition of one (loopNpM).
func isLoop(n string) bool {
	rest, ok := strings.CutPrefix(n, "loop")
	if !ok || rest == "" {
		return false
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}

// LoopBacking returns the block device a loop device is backed by, from the
// path the loop driver records in sysfs; ok is false for file-backed or
// unbound loop devices and for anything else.
func LoopBacking(name string) (Dev, bool) {
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil {
		return Dev{}, false
	}
	back := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
	d, err := Stat(back)
	return d, err == nil
}

// ErrBusy means another user has the device open exclusively.
var ErrBusy = errors.New("open exclusively by another user (a mount, possibly in another mount namespace, or a device-mapper, md or bcache device)")

// CheckExclusive opens path with O_EXCL and closes it again. The kernel
// refuses it while a filesystem is mounted from the device in any mount
// namespace, or while a stacked device claims it, which /proc/self/mountinfo
// and sysfs holders cannot see. Only call it right before a write or a
// detach: the short claim could make a concurrent mount fail.
func CheckExclusive(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return ErrBusy
	}
	if err != nil {
		return fmt.Errorf("opening %s exclusively: %w", path, err)
	}
	return unix.Close(fd)
}

// Geometry reads size and logical sector size of an open block device.
func Geometry(fd int) (size int64, sectorSize int, err error) {
	var sz uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&sz))); e != 0 {
		return 0, 0, fmt.Errorf("BLKGETSIZE64: %w", e)
	}
	ss, err := unix.IoctlGetInt(fd, unix.BLKSSZGET)
	if err != nil {
		return 0, 0, fmt.Errorf("BLKSSZGET: %w", err)
	}
	return int64(sz), ss, nil
}

// AwaitNode is EnsureNode followed by the device's size, for a device that
// may be in the middle of a partition-table re-read (udev's, after a writer
// of its disk closed it): its partitions vanish for a moment and come back,
// perhaps under new numbers. A missing or stale partition is given up to
// wait to come back.
func AwaitNode(ctx context.Context, name string, wait time.Duration) (string, int64, error) {
	deadline := time.Now().Add(wait)
	for {
		path, err := EnsureNode(name)
		if err == nil {
			var size int64
			if size, err = SizeOf(name); err == nil {
				return path, size, nil
			}
			err = fmt.Errorf("reading the size of %s: %w", name, err)
		}
		vanishing := errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV)
		if !vanishing || time.Now().After(deadline) {
			return "", 0, err
		}
		select {
		case <-ctx.Done():
			return "", 0, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// EnsureNode makes /dev/<name> exist as the right block node. devtmpfs
// normally creates it; a container's /dev may not. A node of that name with
// other numbers is replaced: the kernel's name is what we were given, and a
// node devtmpfs did not create (ours, made while it was catching up) stays
// behind when a table re-read renumbers the partition.
func EnsureNode(name string) (string, error) {
	d, err := DevOf(name)
	if err != nil {
		return "", err
	}
	p := "/dev/" + name
	got, err := Stat(p)
	if err == nil && got == d {
		return p, nil
	}
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		// Stale, or not a block node at all: never write over a
		// directory or a regular file.
		if st, lerr := os.Lstat(p); lerr != nil || st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
			return "", fmt.Errorf("%s is not the block node of %s (%s): not replacing it", p, name, d)
		}
		tmp := fmt.Sprintf("/dev/.%s.%d", name, os.Getpid())
		_ = os.Remove(tmp)
		if err := unix.Mknod(tmp, unix.S_IFBLK|0o660, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
			return "", fmt.Errorf("creating %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, p); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("replacing stale %s: %w", p, err)
		}
		return p, nil
	}
	if err := unix.Mknod(p, unix.S_IFBLK|0o660, int(unix.Mkdev(d.Major, d.Minor))); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("creating %s: %w", p, err)
	}
	return p, nil
}
