// Package mkfs formats a device or image with the volume UUID as the
// filesystem UUID, by running mkfs.ext4 or mkfs.xfs with an argument list.
package mkfs

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Args builds the mkfs command line. Discards are skipped: on a fresh
// sparse file they are pointless and on a raw disk they can take minutes.
func Args(fsType, uuid string, opts []string, target string) (string, []string, error) {
	switch fsType {
	case "ext4":
		args := []string{"-q", "-F", "-U", uuid, "-E", "nodiscard"}
		args = append(args, opts...)
		return "mkfs.ext4", append(args, target), nil
	case "xfs":
		args := []string{"-q", "-f", "-K", "-m", "uuid=" + uuid}
		args = append(args, opts...)
		return "mkfs.xfs", append(args, target), nil
	}
	return "", nil, fmt.Errorf("unsupported filesystem %q", fsType)
}

// Format runs mkfs; the error carries mkfs's own message.
func Format(ctx context.Context, fsType, uuid string, opts []string, target string) error {
	name, args, err := Args(fsType, uuid, opts, target)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return fmt.Errorf("%s is not installed (package %s): %w", name, pkg(fsType), err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
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
