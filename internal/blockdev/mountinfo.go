package blockdev

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// MountEntry is one mount of a filesystem, from a mountinfo file.
type MountEntry struct {
	// ID is the mount's id: unique across mount namespaces, and what
	// statx's STATX_MNT_ID answers for a file reached through the mount.
	ID  uint64
	Dev Dev
	// Root is the directory of the filesystem mounted there, Mountpoint
	// where, relative to the root of the process whose mountinfo it is.
	Root, Mountpoint string
}

// MountsOf reads a mountinfo file (/proc/PID/mountinfo) and returns the
// mounts of the filesystems on the devices ds: unlike Mountpoints, it reads
// any process's table (another mount namespace's) and keeps the mount ids,
// so that a mount opened later can be checked to be the one listed.
func MountsOf(r io.Reader, ds ...Dev) ([]MountEntry, error) {
	want := make(map[string]Dev, len(ds))
	for _, d := range ds {
		want[d.String()] = d
	}
	var out []MountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		d, ok := want[f[2]]
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %q: mount id: %w", sc.Text(), err)
		}
		out = append(out, MountEntry{ID: id, Dev: d, Root: unescape(f[3]), Mountpoint: unescape(f[4])})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
