// Package freeze holds a mounted filesystem frozen (FIFREEZE) for a
// snapshot's copy in a way that cannot outlive its bound or the process
// that asked for it: the freeze is made, held and undone by a watchdog,
// the same binary re-executed in a session of its own, which thaws on its
// parent's word, when its parent dies, or at the bound plus a margin,
// whichever comes first. A record in the state dir says a freeze of ours
// may hold, so that the next run can tell a freeze it must undo (its
// watchdog killed too) from one somebody else made, which it never thaws.
package freeze

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FIFREEZE and FITHAW: _IOWR('X', 119, int) and _IOWR('X', 120, int).
const (
	fifreeze = 0xC0045877
	fithaw   = 0xC0045878
)

// ErrBusy: FIFREEZE found the filesystem frozen already, by someone else
// (fsfreeze, a guest agent, a backup tool): it is theirs to thaw.
var ErrBusy = errors.New("frozen by someone else (fsfreeze, a guest agent, a backup tool)")

// ErrNotFrozen: FITHAW found the filesystem not frozen (EINVAL): somebody
// thawed it before we did, so writes went on during what we froze it for.
var ErrNotFrozen = errors.New("it was not frozen any more (somebody else thawed it)")

// Freeze freezes the filesystem whose mount root f is open on.
func Freeze(f *os.File) error {
	err := unix.IoctlSetInt(int(f.Fd()), fifreeze, 0)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("freezing %s: %w", f.Name(), ErrBusy)
	}
	if err != nil {
		return fmt.Errorf("freezing %s: %w", f.Name(), err)
	}
	return nil
}

// Thaw thaws the filesystem whose mount root f is open on. One that was
// not frozen is ErrNotFrozen: a caller that froze it must hear that its
// freeze did not hold.
func Thaw(f *os.File) error {
	err := unix.IoctlSetInt(int(f.Fd()), fithaw, 0)
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("thawing %s: %w", f.Name(), ErrNotFrozen)
	}
	if err != nil {
		return fmt.Errorf("thawing %s: %w", f.Name(), err)
	}
	return nil
}

// Identity names a mounted filesystem: its device (major:minor) and the
// mount's id. A path alone could name another filesystem by the time a
// later run thaws. MountID is statx's STATX_MNT_ID, which the kernel
// reuses once a mount is gone; UniqueMountID its STATX_MNT_ID_UNIQUE
// (kernels 6.8 and later, 0 before), never reused within a boot.
type Identity struct {
	Dev           string `json:"dev"`
	MountID       uint64 `json:"mountID"`
	UniqueMountID uint64 `json:"uniqueMountID,omitempty"`
}

// Same says whether id names the filesystem and mount rec recorded: a
// unique mount id is compared when both have one.
func (id Identity) Same(rec Identity) bool {
	if id.Dev != rec.Dev || id.MountID != rec.MountID {
		return false
	}
	return id.UniqueMountID == 0 || rec.UniqueMountID == 0 || id.UniqueMountID == rec.UniqueMountID
}

// OpenRoot opens the mount root at mountpoint, for Freeze, Thaw and
// Identify (a directory: nothing is read or written through it).
func OpenRoot(mountpoint string) (*os.File, error) {
	fd, err := unix.Open(mountpoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: mountpoint, Err: err}
	}
	return os.NewFile(uintptr(fd), mountpoint), nil
}

// Identify reads the identity of the filesystem f is open on: statx's
// mount id (or /proc/self/fdinfo's on kernels before 5.8) and its unique
// mount id where the kernel has one.
func Identify(f *os.File) (Identity, error) {
	var stx unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_BASIC_STATS|unix.STATX_MNT_ID, &stx); err != nil {
		return Identity{}, fmt.Errorf("statx %s: %w", f.Name(), err)
	}
	id := Identity{Dev: fmt.Sprintf("%d:%d", stx.Dev_major, stx.Dev_minor), MountID: stx.Mnt_id}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		var err error
		if id.MountID, err = fdinfoMountID(f); err != nil {
			return Identity{}, err
		}
	}
	var ux unix.Statx_t
	if unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID_UNIQUE, &ux) == nil && ux.Mask&unix.STATX_MNT_ID_UNIQUE != 0 {
		id.UniqueMountID = ux.Mnt_id
	}
	return id, nil
}

func fdinfoMountID(f *os.File) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", f.Fd()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no mnt_id in the fdinfo of %s", f.Name())
}
