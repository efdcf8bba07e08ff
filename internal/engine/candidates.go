package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/lvm"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
)

// Bounds of what a report lists for people choosing where a volume goes.
const (
	maxCandidateDisks = 32
	maxVGs            = 32
)

// candidateDisks lists the block devices a raw volume could take, for
// people choosing one: whole disks and partitions with a size, writable,
// without partitions, holders or mounts, not the backing device of a loop
// device, and carrying nothing our probe recognises (a filesystem, a
// partition table, LVM, LUKS, swap, ...). Reads only: each device's first
// and last blocks through the page cache. Loop devices themselves are
// never listed (they are sparse volumes or packages); their partitions
// are. device-mapper, md, zram, ram and optical devices are left out.
func candidateDisks(recs []*nodestate.Record) []saltvolumes.Disk {
	sized, err := blockdev.Sized()
	if err != nil {
		return nil
	}
	// A raw volume in Block mode on a partition changes only its GPT
	// entry: its content stays blank, yet it is ours.
	taken := map[string]bool{}
	for _, r := range recs {
		if r.Device != "" {
			taken[r.Device] = true
		}
		if r.Spec != nil && r.Spec.RawBlockDevice != nil {
			if p, err := filepath.EvalSymlinks(r.Spec.RawBlockDevice.DevicePath); err == nil {
				taken[filepath.Base(p)] = true
			}
		}
	}
	var out []saltvolumes.Disk
	for _, d := range sized {
		if len(out) == maxCandidateDisks {
			break
		}
		size := d.Blocks * 1024
		if size < 1<<20 || taken[d.Name] || skipCandidate(d.Name) || sysValue(d.Name, "ro") == "1" {
			continue
		}
		if kids, err := blockdev.Children(d.Name); err != nil || len(kids) > 0 {
			continue
		}
		if u, err := blockdev.UsageOf(d.Name); err != nil || u.InUse() {
			continue
		}
		if !blank("/dev/"+d.Name, size) {
			continue
		}
		out = append(out, saltvolumes.Disk{Path: "/dev/" + d.Name, Size: size, Model: model(d.Name)})
	}
	return out
}

func skipCandidate(name string) bool {
	if rest, ok := strings.CutPrefix(name, "loop"); ok && !strings.Contains(rest, "p") {
		return true
	}
	for _, p := range []string{"dm-", "md", "zram", "ram", "sr", "nbd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// blank: the device opens read-only and our probe finds nothing on it.
func blank(dev string, size int64) bool {
	f, err := os.Open(dev)
	if err != nil {
		return false
	}
	defer f.Close()
	r, err := probe.Device(f, size, 512)
	return err == nil && r.Kind == ""
}

func sysValue(name, file string) string {
	b, err := os.ReadFile(filepath.Join(blockdev.SysBlock, name, file))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// model is the disk's vendor and model as the kernel has them; for a
// partition, which disk it is on.
func model(name string) string {
	if _, err := os.Stat(filepath.Join(blockdev.SysBlock, name, "partition")); err == nil {
		// The class entry links to the partition's directory, which is
		// inside its disk's.
		if real, err := filepath.EvalSymlinks(filepath.Join(blockdev.SysBlock, name)); err == nil {
			return "partition of " + filepath.Base(filepath.Dir(real))
		}
		return "partition"
	}
	m := strings.Join(strings.Fields(sysValue(name, "device/vendor")+" "+sysValue(name, "device/model")), " ")
	if len(m) > 64 {
		m = m[:64]
	}
	return m
}

// lvmBackupDir is where LVM writes a copy of a volume group's metadata
// after each change to it (lvm.conf's backup/backup_dir).
var lvmBackupDir = "/etc/lvm/backup"

// vgCache is the last volume group listing, kept in the state dir: the
// beacon lists every 10 s, and a vgs run costs 60 ms here and seconds in
// an emulated guest.
type vgCache struct {
	Key string                `json:"key"`
	At  time.Time             `json:"at"`
	VGs []saltvolumes.VGSpace `json:"vgs"`
}

// vgCacheKey changes when a volume group's metadata does (a new backup
// file, or a newer one); "" when LVM keeps no backups.
func vgCacheKey() string {
	ents, err := os.ReadDir(lvmBackupDir)
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, en := range ents {
		if info, err := en.Info(); err == nil {
			fmt.Fprintf(&b, "%s@%d;", en.Name(), info.ModTime().UnixNano())
		}
	}
	return b.String()
}

// volumeGroups lists the node's volume groups with their free space; none
// where LVM's tools are not installed. The listing is read again when a
// volume group's metadata changed, and at least every 10 minutes (every
// minute without LVM's metadata backups to tell).
func (e *Engine) volumeGroups() []saltvolumes.VGSpace {
	if _, err := exec.LookPath("vgs"); err != nil {
		return nil
	}
	path := filepath.Join(e.State.Root, "vgs-cache.json")
	key := vgCacheKey()
	maxAge := 10 * time.Minute
	if key == "" {
		maxAge = time.Minute
	}
	var c vgCache
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &c) == nil && c.Key == key && time.Since(c.At) < maxAge && time.Since(c.At) >= 0 {
		return c.VGs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	vgs, err := lvm.ListVGs(ctx)
	if err != nil {
		e.Log.Warn("reading the volume groups' free space", "error", err)
		return nil
	}
	out := []saltvolumes.VGSpace{}
	for _, vg := range vgs {
		if len(out) == maxVGs {
			break
		}
		out = append(out, saltvolumes.VGSpace{Name: vg.Name, Size: vg.Size, Free: vg.Free})
	}
	if b, err := json.Marshal(vgCache{Key: key, At: time.Now(), VGs: out}); err == nil {
		// A cache: a failed write only costs the next report a vgs run.
		_ = nodestate.WriteFileAtomic(path, b, 0o600)
	}
	return out
}
