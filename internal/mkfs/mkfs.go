// Package mkfs formats a device or image with the volume UUID as the
// filesystem UUID, by running mkfs.ext4 or mkfs.xfs with an argument list.
package mkfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Args builds the mkfs command line. Discards are skipped: on a fresh
// sparse file they are pointless and on a raw disk they can take minutes.
// mkfs's own overwrite checks stay on (no -F, no -f) unless force is set,
// which callers do only to redo a write of their own that was interrupted.
// opts must have passed the spec's allow-list.
func Args(fsType, uuid string, opts []string, target string, force bool) (string, []string, error) {
	switch fsType {
	case "ext4":
		args := []string{"-q", "-U", uuid, "-E", "nodiscard"}
		if force {
			args = append(args, "-F")
		}
		args = append(args, opts...)
		return "mkfs.ext4", append(args, target), nil
	case "xfs":
		args := []string{"-q", "-K", "-m", "uuid=" + uuid}
		if force {
			args = append(args, "-f")
		}
		args = append(args, opts...)
		return "mkfs.xfs", append(args, target), nil
	}
	return "", nil, fmt.Errorf("unsupported filesystem %q", fsType)
}

// Target is what mkfs writes: a device path, or an open file that mkfs
// reaches through /dev/fd so that no path lookup can be redirected between
// our checks and its open.
type Target struct {
	Path string
	File *os.File
}

// Format runs mkfs; the error carries mkfs's own message.
func Format(ctx context.Context, fsType, uuid string, opts []string, t Target, force bool) error {
	target := t.Path
	if t.File != nil {
		target = "/dev/fd/3" // the first of ExtraFiles
	}
	name, args, err := Args(fsType, uuid, opts, target, force)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return fmt.Errorf("%s is not installed (package %s): %w", name, pkg(fsType), err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	if t.File != nil {
		cmd.ExtraFiles = []*os.File{t.File}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

func pkg(fsType string) string {
	if fsType == "xfs" {
		return "xfsprogs"
	}
	return "e2fsprogs"
}
