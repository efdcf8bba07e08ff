package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// WithPrivateMount mounts dev in a mount namespace of its own, runs fn
// with the mount point and unmounts. A mount in the host's namespace is
// copied into every namespace another process makes while it exists
// (test/nodeexec makes some that live for minutes), and such a copy
// keeps the device open after our umount: a concurrent test then sees
// the volume as in use. The namespace belongs to one OS thread that is
// never handed back, so Go ends the thread and the namespace with it.
// fn must stay on the calling goroutine (no goroutines of its own): only
// this thread sees the mount.
func WithPrivateMount(dev string, fn func(dir string) error) error {
	fstype, err := exec.Command("blkid", "-o", "value", "-s", "TYPE", dev).Output()
	if err != nil {
		return fmt.Errorf("blkid %s: %w", dev, err)
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread dies with this goroutine.
		done <- inPrivateNamespace(dev, strings.TrimSpace(string(fstype)), fn)
	}()
	return <-done
}

func inPrivateNamespace(dev, fstype string, fn func(string) error) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	dir, err := os.MkdirTemp("", "private-mount-")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	if err := unix.Mount(dev, dir, fstype, 0, ""); err != nil {
		return fmt.Errorf("mount %s (%s): %w", dev, fstype, err)
	}
	ferr := fn(dir)
	if err := unix.Unmount(dir, 0); err != nil {
		return errors.Join(ferr, fmt.Errorf("unmount %s: %w", dir, err))
	}
	return ferr
}
