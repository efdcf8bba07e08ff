package loopdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"golang.org/x/sys/unix"
)

// Reattach binds backing to the loop device want, which the caller has just
// detached, so that the volume keeps its loop number (and with it the links
// and the major:minor whatever the node remembers name); only if another
// program took that number meanwhile does it bind a free one, which
// reattached reports false. LOOP_CHANGE_FD would keep the number without
// the gap, but the kernel allows it only on read-only loop devices.
func Reattach(ctx context.Context, want Device, backing string) (d Device, reattached bool, err error) {
	if want.Name == "" {
		d, err = Attach(ctx, backing)
		return d, false, err
	}
	abs, err := filepath.Abs(backing)
	if err != nil {
		return Device{}, false, err
	}
	back, err := os.OpenFile(abs, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return Device{}, false, err
	}
	defer back.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(back.Fd()), &st); err != nil {
		return Device{}, false, fmt.Errorf("reading %s: %w", abs, err)
	}
	id := fileID(&st)
	if _, err := blockdev.EnsureNode(want.Name); err == nil {
		// EBUSY for a moment is the kernel finishing the detach (the
		// last close tears the old binding down); for longer, someone
		// else's binding.
		for attempt := 0; attempt < 50; attempt++ {
			if err := ctx.Err(); err != nil {
				return Device{}, false, err
			}
			_, err = configure(want.Path, back, abs, false)
			if err == nil {
				want.backing = id
				return want, true, nil
			}
			if !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	d, err = Attach(ctx, backing)
	if err != nil {
		return Device{}, false, fmt.Errorf("%s was taken meanwhile, and no other loop device could be attached: %w", want.Path, err)
	}
	return d, false, nil
}
