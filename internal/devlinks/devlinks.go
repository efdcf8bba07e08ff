// Package devlinks makes /dev/disk/by-uuid and /dev/disk/by-partuuid links
// resolve, whether or not udev runs on the machine.
package devlinks

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// UdevRunning reports whether a udev daemon is listening.
func UdevRunning() bool {
	_, err := os.Stat("/run/udev/control")
	return err == nil
}

// Ensure makes link point at /dev/<name>. With udev it asks udev to
// re-evaluate the device and waits (bounded) for the link; without udev, or
// if udev did not produce it in time, it writes the link itself, in the
// same relative form udev uses.
func Ensure(ctx context.Context, link, name string, udevWait time.Duration) error {
	target := "../../" + name
	if cur, err := os.Readlink(link); err == nil && cur == target {
		return nil
	}
	if UdevRunning() {
		trigger(ctx, name, link, udevWait)
		if cur, err := os.Readlink(link); err == nil && filepath.Base(cur) == name {
			return nil
		}
	}
	dir := filepath.Dir(link)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s/.%s.%d", dir, filepath.Base(link), os.Getpid())
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func trigger(ctx context.Context, name, link string, wait time.Duration) {
	udevadm(ctx, wait, []string{"trigger", "--action=change", "--sysname-match=" + name},
		[]string{"settle", settleTimeout(wait), "--exit-if-exists=" + link})
}

// Settle waits (bounded) until udev has handled the events queued so far,
// among them the partition-table re-read its watch rule starts when a writer
// of a disk closes it; without udev it returns at once.
func Settle(ctx context.Context, wait time.Duration) {
	if UdevRunning() {
		udevadm(ctx, wait, []string{"settle", settleTimeout(wait)})
	}
}

func settleTimeout(wait time.Duration) string {
	return fmt.Sprintf("--timeout=%d", int(wait.Seconds())+1)
}

// udevadm runs udevadm once per argument list, all within wait (and a
// little): best effort, as udev only speeds up what we check ourselves.
func udevadm(ctx context.Context, wait time.Duration, runs ...[]string) {
	path, err := exec.LookPath("udevadm")
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait+2*time.Second)
	defer cancel()
	for _, args := range runs {
		_ = exec.CommandContext(ctx, path, args...).Run()
	}
}

// Remove deletes link if it exists; it never follows it.
func Remove(link string) error {
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Resolve returns the kernel name a link points at, or "" if it is absent
// or dangling.
func Resolve(link string) string {
	p, err := filepath.EvalSymlinks(link)
	if err != nil {
		return ""
	}
	return filepath.Base(p)
}
