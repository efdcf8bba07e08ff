package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/filecopy"
	"github.com/salt-volumes/salt-volumes/internal/freeze"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
)

// What a sparse volume's snapshot must know of its loop device before it
// copies: whether its filesystem is mounted anywhere, to freeze it, and
// whether anything else holds it, in which case only a copy made in one
// instant (a reflink) is of one instant.
//
// Mounts: FIFREEZE acts on the superblock, which every mount of the
// filesystem shares, so a freeze through any mount holds them all. This
// run's own mount table is read first; a mount claims its device
// exclusively, so a device nobody claims is mounted nowhere and the other
// mount namespaces (a container's, a pod's, unshare -m) are read only for
// one that is claimed: /proc/PID/mountinfo of one process of each
// namespace and root, matched by the device's major:minor.
//
// A mountpoint in another namespace is a path in that namespace, whose
// directories its users may be able to rename or replace by symlinks: it
// is walked one directory at a time from /proc/PID/root, never following
// a symlink or "..", and what it reaches is checked to be that very mount
// (its mount id) of the volume's device before anything is frozen.
//
// Users of the device (holdersOf): a process that has it open (a database
// on the raw device, a pod's block volume) is seen only in /proc/PID/fd:
// sysfs lists only stacked devices (device-mapper, md) and an O_EXCL open
// fails only against exclusive claimers, which a plain open is not. Those
// two are read as well: they see the kernel's users that no process
// holds (a mount in a namespace this run cannot see, a filesystem lazily
// unmounted but still busy, a stacked device), and sysfs the loop devices
// made on top of it (kubelet maps a block volume so), which hold it
// through the kernel alone.

// volumeMount is a mount of a volume's filesystem, its root open for the
// freeze.
type volumeMount struct {
	// root is the mount root, opened O_RDONLY|O_DIRECTORY (FIFREEZE
	// takes no O_PATH descriptor); the caller closes it.
	root *os.File
	// path is where this run can reach it: the mountpoint in its own
	// namespace, /proc/PID/root/<mountpoint> in another's (for messages
	// and the freeze record, whose later thaw checks device and mount id
	// before it acts).
	path string
	dev  blockdev.Dev
}

// nsKey tells mount tables apart: a process's mount namespace and its
// root (a chrooted process's mountinfo lists only the mounts under it).
type nsKey struct{ nsDev, nsIno, rootDev, rootIno uint64 }

// findMount finds a mount of the filesystem on dev (whose node is path)
// in any mount namespace and opens it. nil and no error: mounted nowhere
// it could be opened; unusable then lists the mounts seen that could not
// be opened safely, for the caller to say why it did not freeze.
func findMount(path string, dev blockdev.Dev) (m *volumeMount, unusable []string, err error) {
	seen := map[nsKey]bool{}
	if m, unusable, err = mountIn("self", dev, seen); m != nil || err != nil {
		return m, unusable, err
	}
	if err := blockdev.CheckExclusive(path); err == nil {
		return nil, unusable, nil
	} else if !errors.Is(err, blockdev.ErrBusy) {
		return nil, nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, fmt.Errorf("listing processes: %w", err)
	}
	// Lowest first: a namespace is named by its oldest process, usually
	// its first (a container's init, a pod's pause), which outlives the
	// others and so keeps the freeze record's path to the mount valid.
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	for _, pid := range pids {
		m, u, err := mountIn(strconv.Itoa(pid), dev, seen)
		unusable = append(unusable, u...)
		if m != nil || err != nil {
			return m, unusable, err
		}
	}
	return nil, unusable, nil
}

// mountIn looks for a mount of dev in the mount table of process pid
// ("self": this run), unless a process of the same namespace and root
// was read already. A process that ends meanwhile is skipped: its /proc
// directory, opened once, never turns into another process's.
func mountIn(pid string, dev blockdev.Dev, seen map[nsKey]bool) (*volumeMount, []string, error) {
	pdir, err := unix.Open("/proc/"+pid, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, nil
	}
	defer unix.Close(pdir)
	var ns, root unix.Stat_t
	if unix.Fstatat(pdir, "ns/mnt", &ns, 0) != nil || unix.Fstatat(pdir, "root", &root, 0) != nil {
		return nil, nil, nil // gone, or a zombie
	}
	k := nsKey{ns.Dev, ns.Ino, root.Dev, root.Ino}
	if seen[k] {
		return nil, nil, nil
	}
	seen[k] = true
	fd, err := unix.Openat(pdir, "mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if pid == "self" {
			return nil, nil, fmt.Errorf("reading the mount table: %w", err)
		}
		return nil, nil, nil
	}
	f := os.NewFile(uintptr(fd), "/proc/"+pid+"/mountinfo")
	mounts, err := blockdev.MountsOf(f, dev)
	f.Close()
	if err != nil {
		if pid == "self" {
			return nil, nil, fmt.Errorf("reading the mount table: %w", err)
		}
		return nil, nil, nil
	}
	var unusable []string
	for _, mi := range mounts {
		where := mi.Mountpoint
		if pid != "self" {
			where = "/proc/" + pid + "/root" + strings.TrimSuffix(mi.Mountpoint, "/")
		}
		m, err := openMount(pdir, mi, where)
		if err == nil {
			return m, nil, nil
		}
		unusable = append(unusable, fmt.Sprintf("%s: %v", where, err))
	}
	return nil, unusable, nil
}

// openMount opens the root of mount mi of the process whose /proc
// directory is pdir, walking its mountpoint one name at a time from the
// process's root, and checks that what it reached is that mount of that
// device.
func openMount(pdir int, mi blockdev.MountEntry, where string) (*volumeMount, error) {
	cur, err := unix.Openat(pdir, "root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the process's root: %w", err)
	}
	for _, name := range strings.Split(mi.Mountpoint, "/") {
		if name == "" {
			continue
		}
		if name == "." || name == ".." {
			// The kernel writes mountinfo paths resolved: a dot is
			// a name someone made to lead the walk elsewhere.
			unix.Close(cur)
			return nil, errors.New("not a resolved path")
		}
		// O_DIRECTORY with O_NOFOLLOW fails on a symlink (ENOTDIR):
		// nothing leads the walk out of the directories it names.
		next, err := unix.Openat(cur, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if err != nil {
			return nil, fmt.Errorf("opening %q on the way: %w", name, err)
		}
		cur = next
	}
	defer unix.Close(cur)
	var st unix.Stat_t
	if err := unix.Fstat(cur, &st); err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	if st.Dev != unix.Mkdev(mi.Dev.Major, mi.Dev.Minor) {
		return nil, fmt.Errorf("holds device %d:%d now, not the volume's %s", unix.Major(st.Dev), unix.Minor(st.Dev), mi.Dev)
	}
	// The descriptor's own /proc/self/fd link reaches the directory just
	// checked, not a path that could have changed since.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(cur), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("reopening: %w", err)
	}
	root := os.NewFile(uintptr(fd), where)
	id, err := freeze.Identify(root)
	switch {
	case err != nil:
		root.Close()
		return nil, err
	case id.Dev != mi.Dev.String() || id.MountID != mi.ID:
		// Another mount on top of it (over-mounted), or one made
		// there since the table was read.
		root.Close()
		return nil, fmt.Errorf("reached mount %d of device %s, not mount %d", id.MountID, id.Dev, mi.ID)
	}
	return &volumeMount{root: root, path: where, dev: mi.Dev}, nil
}

// holdersOf says who holds loop device d (on dev), its partitions
// included, besides this run: "" when nobody does.
func holdersOf(d loopdev.Device, dev blockdev.Dev) (string, error) {
	u, err := blockdev.UsageOf(d.Name)
	if err != nil {
		return "", fmt.Errorf("reading the users of %s: %w", d.Path, err)
	}
	var who []string
	if u.InUse() {
		who = append(who, u.String())
	}
	devs := map[uint64]bool{unix.Mkdev(dev.Major, dev.Minor): true}
	parts, _ := blockdev.Children(d.Name)
	for _, p := range parts {
		if pd, err := blockdev.DevOf(p); err == nil {
			devs[unix.Mkdev(pd.Major, pd.Minor)] = true
		}
	}
	if procs := openers(devs); len(procs) > 0 {
		who = append(who, "open by "+strings.Join(procs, ", "))
	}
	if len(who) > 0 {
		return strings.Join(who, " and "), nil
	}
	// Only when nothing above explains it: the probe is a claim of its
	// own for an instant, which a mount made at that very moment would
	// find busy.
	switch err := blockdev.CheckExclusive(d.Path); {
	case errors.Is(err, blockdev.ErrBusy):
		return "claimed by a user that no mount table or process this run can read shows (a mount held only by processes of another PID namespace, a filesystem unmounted lazily but still busy, or a kernel user such as an iSCSI target)", nil
	case err != nil:
		return "", err
	}
	return "", nil
}

// maxOpeners bounds how many processes a message names.
const maxOpeners = 5

// openers lists the processes other than this one that have one of devs
// (device numbers of block devices) open, as "pid N (comm)". Each open
// file's attributes are read from the kernel's cache (AT_STATX_DONT_SYNC),
// so that a file on a dead NFS server or FUSE daemon does not hang the
// scan.
func openers(devs map[uint64]bool) []string {
	self := strconv.Itoa(os.Getpid())
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []string
	more := 0
	for _, p := range procs {
		pid := p.Name()
		if _, err := strconv.Atoi(pid); err != nil || pid == self {
			continue
		}
		dir := "/proc/" + pid + "/fd/"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // gone, or a kernel thread
		}
		for _, fd := range fds {
			var stx unix.Statx_t
			if unix.Statx(unix.AT_FDCWD, dir+fd.Name(), unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE, &stx) != nil {
				continue
			}
			if stx.Mode&unix.S_IFMT != unix.S_IFBLK || !devs[unix.Mkdev(stx.Rdev_major, stx.Rdev_minor)] {
				continue
			}
			if len(out) == maxOpeners {
				more++
				break
			}
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			out = append(out, fmt.Sprintf("pid %s (%s)", pid, strings.TrimSpace(string(comm))))
			break
		}
	}
	if more > 0 {
		out = append(out, fmt.Sprintf("%d more", more))
	}
	return out
}

// copyUnmounted copies the file of a volume quiesce found no mount of to
// freeze. A device somebody else holds may be written during the copy,
// which would then be torn: it is copied only by reflink, which takes one
// instant, and otherwise refused before anything is copied. One nobody
// holds is copied as it can be, and its users are read again afterwards:
// one who came meanwhile, and still holds it, fails the copy instead of
// leaving a torn one called a snapshot.
func (e *Engine) copyUnmounted(ctx context.Context, o *op, snap *Snapshot, q *quiesced, file, part string) (filecopy.Method, error) {
	if q.inUse != "" {
		if !filecopy.CanReflink(file, part+".probe") {
			return "", inUseNotAtomic(snap, q.inUse, false)
		}
		o.step("snapshot-copying", "snapshot", snap.Name, "frozen", false, "inUse", q.inUse)
		if err := filecopy.Clone(file, part); err != nil {
			return "", failed("snapshot_copy", err, "copying %s for snapshot %s", file, snap.Name)
		}
		return filecopy.Reflink, nil
	}
	o.step("snapshot-copying", "snapshot", snap.Name, "frozen", false)
	method, err := filecopy.CopyContext(ctx, file, part)
	if err != nil {
		return "", failed("snapshot_copy", err, "copying %s for snapshot %s", file, snap.Name)
	}
	if method == filecopy.Reflink {
		return method, nil
	}
	var who []string
	for _, d := range q.devs {
		bd, err := blockdev.Stat(d.Path)
		if err != nil {
			return "", failed("loop", err, "reading %s", d.Path)
		}
		h, err := holdersOf(d, bd)
		if err != nil {
			return "", failed("loop", err, "looking for the users of %s", d.Path)
		}
		if h != "" {
			who = append(who, d.Path+" is "+h)
		}
	}
	if len(who) > 0 {
		return "", inUseNotAtomic(snap, strings.Join(who, "; "), true)
	}
	return method, nil
}

// inUseNotAtomic refuses a copy that would not be of one instant: the
// volume's device is held by someone (who) and the state dir cannot
// reflink; during: they came while it was copied.
func inUseNotAtomic(snap *Snapshot, who string, during bool) error {
	what := "it is in use"
	done := "Refused before anything was copied"
	if during {
		what = "it came into use while it was copied"
		done = "The copy was removed"
	}
	return refused("in_use_not_atomic", "snapshot %s of %s: %s (%s): a copy made while the device may be written is torn, not of one instant, "+
		"and this state dir's filesystem shares no extents with the volume's file, which would copy it in one instant. %s. "+
		"Stop its user (unmount it, stop the process or the pod) and take the snapshot again; or keep the state dir on a filesystem with reflink (xfs with reflink, btrfs); or use an LVM volume, whose snapshots are atomic",
		snap.Name, snap.Volume, what, who, done)
}
