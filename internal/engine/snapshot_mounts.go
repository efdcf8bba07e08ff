package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/filecopy"
	"github.com/salt-volumes/salt-volumes/internal/freeze"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
)

// Who uses a sparse volume's loop device, for a snapshot (before it
// copies: whether its filesystem is mounted anywhere, to freeze it, and
// whether anything else holds it, in which case only a copy made in one
// instant, a reflink, is of one instant) and for a restore in place
// (refused while anything uses it, naming what does).
//
// Mounts (mountScan): FIFREEZE acts on the superblock, which every mount
// of the filesystem shares, so a freeze through any mount holds them all.
// This run's own mount table is read first; then /proc/PID/mountinfo of
// one process of each other mount namespace and root (a container's, a
// pod's, unshare -m), lowest pid first, matched by major:minor. A
// snapshot reads the others only for a device somebody claims (a mount
// claims its device exclusively, so a device nobody claims is mounted
// nowhere); a restore reads them all, to name every mount.
//
// A mountpoint in another namespace is a path in that namespace, whose
// directories its users may be able to rename or replace by symlinks: it
// is walked one directory at a time from /proc/PID/root, never following
// a symlink or "..", and what it reaches is checked to be that very mount
// (its mount id) of the volume's device before anything is frozen.
//
// Users (usersOf): a process that has the device, a partition of it or
// the volume's file open (a database on the raw device, a pod's block
// volume) is seen only in /proc/PID/fd: sysfs lists only stacked devices
// (device-mapper, md) and an O_EXCL open fails only against exclusive
// claimers, which a plain open is not. Those two are read as well: they
// see the kernel's users that no process holds (a mount in a namespace
// this run cannot see, a filesystem lazily unmounted but still busy, a
// stacked device), and sysfs the loop devices made on top of it (kubelet
// maps a block volume so), which hold it through the kernel alone.

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

// nsKey tells mount tables apart: a process's mount namespace (its
// ns/mnt link, "mnt:[INODE]", which this run may read even where a stat
// through it is denied) and its root (a chrooted process's mountinfo
// lists only the mounts under it; zero where it may not be read).
type nsKey struct {
	ns               string
	rootDev, rootIno uint64
}

// mountTable is one mount table a mountScan read.
type mountTable struct {
	// pid is the process whose mountinfo was read: "self" (this run) or
	// a pid; ns its mount namespace.
	pid, ns string
}

// mountScan finds the mounts of devs in the mount tables of every mount
// namespace and root, each read once.
type mountScan struct {
	devs []blockdev.Dev
	seen map[nsKey]bool
	// lowest is the lowest pid seen in each mount namespace, which names
	// it in messages.
	lowest map[string]int
}

func newMountScan(devs ...blockdev.Dev) *mountScan {
	return &mountScan{devs: devs, seen: map[nsKey]bool{}, lowest: map[string]int{}}
}

// namer is the lowest process seen in the mount namespace of t (this run
// where others was not read).
func (s *mountScan) namer(t *mountTable) int {
	if pid, ok := s.lowest[t.ns]; ok {
		return pid
	}
	return os.Getpid()
}

// mountFunc gets the mounts of a scan's devices in table t, read from
// /proc/PID/mountinfo while pdir, that process's /proc directory, is open;
// it answers true to end the scan.
type mountFunc func(t *mountTable, pdir int, mounts []blockdev.MountEntry) bool

// read reads the mount table of process pid ("self": this run), unless
// one of the same namespace and root was read already, and hands fn the
// mounts found there. A process that ends meanwhile is skipped: its /proc
// directory, opened once, never turns into another process's. One whose
// root this run may not stat is read all the same (a mount seen only
// there is not missed; opening it through that root fails). Only this
// run's own table unread is an error.
func (s *mountScan) read(pid string, fn mountFunc) (stop bool, err error) {
	pdir, err := unix.Open("/proc/"+pid, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, nil
	}
	defer unix.Close(pdir)
	var link [64]byte
	n, err := unix.Readlinkat(pdir, "ns/mnt", link[:])
	if err != nil {
		return false, nil // gone, or a zombie
	}
	ns := string(link[:n])
	if p, err := strconv.Atoi(pid); err == nil {
		if _, ok := s.lowest[ns]; !ok {
			s.lowest[ns] = p // others goes lowest first
		}
	}
	var root unix.Stat_t
	_ = unix.Fstatat(pdir, "root", &root, 0)
	k := nsKey{ns, root.Dev, root.Ino}
	if s.seen[k] {
		return false, nil
	}
	s.seen[k] = true
	t := &mountTable{pid: pid, ns: ns}
	mounts, err := func() ([]blockdev.MountEntry, error) {
		fd, err := unix.Openat(pdir, "mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(fd), "/proc/"+pid+"/mountinfo")
		defer f.Close()
		return blockdev.MountsOf(f, s.devs...)
	}()
	switch {
	case err != nil && pid == "self":
		return false, fmt.Errorf("reading the mount table: %w", err)
	case err != nil || len(mounts) == 0:
		return false, nil
	}
	return fn(t, pdir, mounts), nil
}

// others reads the mount table of every other process, lowest pid first:
// a namespace is named by its oldest process, usually its first (a
// container's init, a pod's pause), which outlives the others and so
// keeps the freeze record's path to the mount valid.
func (s *mountScan) others(fn mountFunc) error {
	pids, err := processes()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if stop, err := s.read(strconv.Itoa(pid), fn); stop || err != nil {
			return err
		}
	}
	return nil
}

// processes lists the pids in /proc, lowest first.
func processes() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids, nil
}

// findMount finds a mount of the filesystem on dev (whose node is path)
// in any mount namespace and opens it. nil and no error: mounted nowhere
// it could be opened; unusable then lists the mounts seen that could not
// be opened safely, for the caller to say why it did not freeze.
func findMount(path string, dev blockdev.Dev) (m *volumeMount, unusable []string, err error) {
	s := newMountScan(dev)
	open := func(t *mountTable, pdir int, mounts []blockdev.MountEntry) bool {
		var u []string
		for _, mi := range mounts {
			where := mi.Mountpoint
			if t.pid != "self" {
				where = "/proc/" + t.pid + "/root" + strings.TrimSuffix(mi.Mountpoint, "/")
			}
			var err error
			if m, err = openMount(pdir, mi, where); err == nil {
				return true
			}
			u = append(u, fmt.Sprintf("%s: %v", where, err))
		}
		unusable = append(unusable, u...)
		return false
	}
	if _, err := s.read("self", open); m != nil || err != nil {
		return m, unusable, err
	}
	if err := blockdev.CheckExclusive(path); err == nil {
		return nil, unusable, nil
	} else if !errors.Is(err, blockdev.ErrBusy) {
		return nil, nil, err
	}
	if err := s.others(open); err != nil {
		return nil, nil, err
	}
	return m, unusable, nil
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

// deviceUsers is who uses a loop device, its partitions or the volume's
// file, besides this run.
type deviceUsers struct {
	// usage is what sysfs and this run's mount table say of the device
	// and its partitions: mounts, swap, stacked devices, loop devices
	// backed by it.
	usage blockdev.Usage
	// mounts are the mounts of the device and its partitions in every
	// mount namespace, when usersOf was asked for them.
	mounts []deviceMount
	// opens are the processes that hold one of them open.
	opens []opener
	// claim is what an O_EXCL open of the device said, tried only when
	// nothing above was found (the probe is a claim of its own for an
	// instant, which a mount made at that very moment would find busy):
	// blockdev.ErrBusy for a user nothing this run can read shows.
	claim error
}

// deviceMount is a mount of the device name (the loop device or one of
// its partitions) at mountpoint, in mount table t.
type deviceMount struct {
	name, mountpoint string
	t                *mountTable
	// pid is the lowest process of the mount namespace it is in.
	pid int
}

// opener is process pid (comm) holding what open: /dev/NAME, or (file)
// "its file PATH", the volume's file.
type opener struct {
	pid        int
	comm, what string
	file       bool
}

// usersOf finds who uses loop device d (on dev), its partitions or file,
// the volume's file behind it ("": not looked for), besides this run;
// anywhere: the mounts of every mount namespace too, not only this run's.
func usersOf(d loopdev.Device, dev blockdev.Dev, file string, anywhere bool) (*deviceUsers, error) {
	u, err := blockdev.UsageOf(d.Name)
	if err != nil {
		return nil, fmt.Errorf("reading the users of %s: %w", d.Path, err)
	}
	users := &deviceUsers{usage: u}
	devs := map[blockdev.Dev]string{dev: d.Name}
	parts, _ := blockdev.Children(d.Name)
	for _, p := range parts {
		if pd, err := blockdev.DevOf(p); err == nil {
			devs[pd] = p
		}
	}
	if anywhere {
		var list []blockdev.Dev
		for dv := range devs {
			list = append(list, dv)
		}
		s := newMountScan(list...)
		seen := map[uint64]bool{} // a mount seen again from another root
		collect := func(t *mountTable, _ int, mounts []blockdev.MountEntry) bool {
			for _, mi := range mounts {
				if !seen[mi.ID] {
					seen[mi.ID] = true
					users.mounts = append(users.mounts, deviceMount{name: devs[mi.Dev], mountpoint: mi.Mountpoint, t: t})
				}
			}
			return false
		}
		if _, err := s.read("self", collect); err != nil {
			return nil, err
		}
		if err := s.others(collect); err != nil {
			return nil, err
		}
		for i := range users.mounts {
			users.mounts[i].pid = s.namer(users.mounts[i].t)
		}
	}
	if users.opens, err = openers(devs, file); err != nil {
		return nil, err
	}
	// LVM's and udev's scans open every block device for an instant
	// (pvscan when a device appears, lvs from a report): not a user, but
	// wait until they have let go rather than refuse for them.
	for wait := 0; len(users.opens) > 0 && onlyScanners(users.opens) && wait < 20; wait++ {
		time.Sleep(100 * time.Millisecond)
		if users.opens, err = openers(devs, file); err != nil {
			return nil, err
		}
	}
	if !u.InUse() && len(users.mounts) == 0 && len(users.opens) == 0 {
		users.claim = blockdev.CheckExclusive(d.Path)
	}
	return users, nil
}

// scanners are the commands that open block devices only to read what is
// on them, for an instant.
var scanners = map[string]bool{"lvm": true, "lvs": true, "vgs": true, "pvs": true, "pvscan": true, "vgscan": true,
	"blkid": true, "lsblk": true, "udevadm": true, "systemd-udevd": true, "(udev-worker)": true}

func onlyScanners(opens []opener) bool {
	for _, o := range opens {
		if !scanners[o.comm] {
			return false
		}
	}
	return true
}

// openers lists the processes other than this one that have one of devs
// (block devices by number, with their kernel names) or file open, once
// for each. Each open file's attributes are read from the kernel's cache
// (AT_STATX_DONT_SYNC), so that a file on a dead NFS server or FUSE
// daemon does not hang the scan.
func openers(devs map[blockdev.Dev]string, file string) ([]opener, error) {
	var fst unix.Statx_t
	if file != "" {
		if err := unix.Statx(unix.AT_FDCWD, file, 0, unix.STATX_INO, &fst); err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
	}
	pids, err := processes()
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []opener
	for _, pid := range pids {
		if pid == self {
			continue
		}
		dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // gone, or a kernel thread
		}
		held := map[string]bool{}
		for _, fd := range fds {
			var stx unix.Statx_t
			if unix.Statx(unix.AT_FDCWD, dir+fd.Name(), unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE|unix.STATX_INO, &stx) != nil {
				continue
			}
			o := opener{pid: pid}
			if stx.Mode&unix.S_IFMT == unix.S_IFBLK {
				if n, ok := devs[blockdev.Dev{Major: stx.Rdev_major, Minor: stx.Rdev_minor}]; ok {
					o.what = "/dev/" + n
				}
			} else if file != "" && stx.Ino == fst.Ino && stx.Dev_major == fst.Dev_major && stx.Dev_minor == fst.Dev_minor {
				o.what, o.file = "its file "+file, true
			}
			if o.what != "" && !held[o.what] {
				held[o.what] = true
				o.comm = procComm(pid)
				out = append(out, o)
			}
		}
	}
	return out, nil
}

func procComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// maxOpeners bounds how many processes a snapshot's message names.
const maxOpeners = 5

// holdersOf says who holds loop device d (on dev), its partitions
// included, or file, besides this run: "" when nobody does.
func holdersOf(d loopdev.Device, dev blockdev.Dev, file string) (string, error) {
	u, err := usersOf(d, dev, file, false)
	if err != nil {
		return "", err
	}
	var who []string
	if u.usage.InUse() {
		who = append(who, u.usage.String())
	}
	var devOpen, fileOpen []opener
	for _, o := range u.opens {
		if o.file {
			fileOpen = append(fileOpen, o)
		} else {
			devOpen = append(devOpen, o)
		}
	}
	if len(devOpen) > 0 {
		who = append(who, "open by "+pidList(devOpen))
	}
	if len(fileOpen) > 0 {
		who = append(who, "in use through its file "+file+", open by "+pidList(fileOpen))
	}
	switch {
	case len(who) > 0:
		return strings.Join(who, " and "), nil
	case errors.Is(u.claim, blockdev.ErrBusy):
		return "claimed by a user that no mount table or process this run can read shows (a mount held only by processes of another PID namespace, a filesystem unmounted lazily but still busy, or a kernel user such as an iSCSI target)", nil
	}
	return "", u.claim
}

// pidList names the processes of opens, each once, as "pid N (comm)",
// at most maxOpeners of them and how many more.
func pidList(opens []opener) string {
	var out []string
	seen := map[int]bool{}
	more := 0
	for _, o := range opens {
		switch {
		case seen[o.pid]:
		case len(out) == maxOpeners:
			more++
		default:
			out = append(out, fmt.Sprintf("pid %d (%s)", o.pid, o.comm))
		}
		seen[o.pid] = true
	}
	if more > 0 {
		out = append(out, fmt.Sprintf("%d more", more))
	}
	return strings.Join(out, ", ")
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
	method, err := filecopy.CopyProgress(ctx, file, part, o.progress("copying", "snapshot", snap.Name))
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
		h, err := holdersOf(d, bd, file)
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
