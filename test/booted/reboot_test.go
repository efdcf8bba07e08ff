// Package booted tests salt-volume-exec on booted Debian guests (test/guest):
// a kernel that parses partition tables, udev making /dev/disk links, real
// NVMe disks, and reboots with the restore unit running at boot.
package booted

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/test/guest"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

const guestID = "guest-1"

// TestRebootKeepsVolumes: volumes prepared on a booted guest keep their
// names across a real reboot. udev makes the /dev/disk links (the kernel
// reads the GPT we write on an NVMe disk), and salt-volumes-restore.service
// re-attaches sparse volumes at boot before local-fs.target, from the
// node's state alone.
func TestRebootKeepsVolumes(t *testing.T) {
	repo := saltstack.Need(t)
	img, err := guest.Image(repo)
	require.NoError(t, err, "the guest image (scripts/guest-image.sh)")
	exec, cleanupExec, err := testenv.BuildExec()
	require.NoError(t, err)
	t.Cleanup(cleanupExec)
	ctx := context.Background()
	started := time.Now()
	g, err := guest.Boot(ctx, img, t.TempDir(), guest.Disk{Name: "nvme0", Size: 1 << 30, Bus: "nvme"},
		guest.Disk{Name: "scsi0", Size: 512 << 20, Bus: "scsi"}, guest.Disk{Name: "vdb", Size: 256 << 20, Bus: "virtio"})
	if g != nil {
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := g.Run("journalctl", "-b", "--no-pager", "-n", "80")
				t.Logf("--- guest journal\n%s", out)
				t.Logf("--- guest console\n%s", g.Tail(3000))
			}
			g.Stop()
		})
	}
	require.NoError(t, err)
	t.Logf("guest booted, ssh answering: %s", time.Since(started).Round(time.Second))
	run := func(args ...string) string {
		t.Helper()
		out, err := g.Run(args...)
		require.NoError(t, err)
		return strings.TrimSpace(out)
	}

	// The guest is a minion of a master on this machine (10.0.2.2 is the
	// host's 127.0.0.1 from inside), and salt-volume-exec is installed as an
	// operator installs it: state.apply salt_volumes.installed.
	s := saltstack.Start(t, exec, false)
	pub, ret := s.Ports()
	require.NoError(t, g.Write("/etc/salt/minion.d/master.conf", []byte(fmt.Sprintf(
		"id: %s\nmaster: 10.0.2.2\nmaster_port: %d\npublish_port: %d\nacceptance_wait_time: 2\n", guestID, ret, pub)), 0o644))
	run("systemctl", "restart", "salt-minion")
	minionUp := func() { s.WaitForMinion(guestID, 20*time.Second, 5*time.Minute) }
	minionUp()
	t.Logf("the guest's minion answers: %s after boot", time.Since(started).Round(time.Second))
	formulaBin := filepath.Join(repo, "salt", "states", "salt_volumes", "files", "salt-volume-exec")
	if _, err := os.Stat(formulaBin); err != nil {
		// What make salt-files does; the file is ignored by git.
		require.NoError(t, testenv.BuildAs(filepath.Dir(formulaBin), "salt-volume-exec", "cmd/salt-volume-exec"))
		t.Cleanup(func() { os.Remove(formulaBin) })
	}
	installed := time.Now()
	out, code := s.Salt("--timeout=600", guestID, "state.apply", "salt_volumes.installed", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	t.Logf("state.apply salt_volumes.installed on the guest: %s", time.Since(installed).Round(time.Second))
	assert.Equal(t, "enabled", run("systemctl", "is-enabled", "salt-volumes-restore.service"))
	disks := run("lsblk", "-dno", "NAME,TRAN")
	assert.Regexp(t, `(?m)^nvme0n1\s+nvme$`, disks, "an NVMe disk")
	assert.Regexp(t, `(?m)^sda\s+`, disks, "a SCSI disk")
	// An operator's LVM on the virtio disk: a volume group and a logical
	// volume that salt-volumes did not make.
	run("pvcreate", "-q", "/dev/vdb")
	run("vgcreate", "-q", "vg0", "/dev/vdb")
	run("lvcreate", "-q", "-y", "-n", "lv0", "-L", "64M", "vg0")
	lv := run("readlink", "-f", "/dev/vg0/lv0")
	require.Regexp(t, `^/dev/dm-\d+$`, lv)

	// The physical volume is the operator's: a raw volume on it is refused
	// and nothing on it changes.
	pv := []byte(`{"name":"boot-pv","uuid":"` + uuid.NewString() + `","rawBlockDevice":{"devicePath":"/dev/vdb"}}`)
	out, err = g.RunInput(pv, "salt-volume-exec", "prepare", "--spec", "-")
	require.Error(t, err, "a raw volume on an LVM physical volume: %s", out)
	assert.Contains(t, err.Error(), "exit status 3", "refused to protect data")
	assert.Contains(t, out, "/dev/vdb is held by dm-", "the refusal names what holds it (the logical volume's device-mapper device)")
	assert.Equal(t, "vg0", run("pvs", "--noheadings", "-o", "vg_name", "/dev/vdb"), "the physical volume untouched")

	type vol struct {
		name, uuid, spec, dev string
	}
	vols := []*vol{
		{name: "boot-fs", spec: `"sparseLoopDevice":{"size":"64Mi"}`},
		{name: "boot-blk", spec: `"mode":"Block","sparseLoopDevice":{"size":"32Mi"}`},
		{name: "boot-nvme", spec: `"mode":"Block","rawBlockDevice":{"devicePath":"/dev/nvme0n1"}`},
		{name: "boot-scsi", spec: `"fsType":"xfs","rawBlockDevice":{"devicePath":"/dev/sda"}`},
		// An existing logical volume named as a raw device.
		{name: "boot-lv", spec: `"rawBlockDevice":{"devicePath":"/dev/vg0/lv0"}`},
	}
	specOf := func(v *vol) []byte {
		return []byte(`{"name":"` + v.name + `","uuid":"` + v.uuid + `",` + v.spec + `}`)
	}
	link := func(v *vol) string {
		if strings.Contains(v.spec, `"Block"`) {
			return "/dev/disk/by-partuuid/" + v.uuid
		}
		return "/dev/disk/by-uuid/" + v.uuid
	}
	// The first through Salt, the way the control plane prepares volumes;
	// the others with salt-volume-exec itself.
	vols[0].uuid = uuid.NewString()
	fsPillar := saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volume": map[string]any{
		"name": vols[0].name, "uuid": vols[0].uuid, "node": guestID, "sparseLoopDevice": map[string]any{"size": "64Mi"}}}})
	out, code = s.Salt("--timeout=600", guestID, "state.apply", "salt_volumes.prepared", fsPillar, "--out=json", "--static")
	require.Equal(t, 0, code, out)
	for _, v := range vols {
		if v.uuid == "" {
			v.uuid = uuid.NewString()
		}
		out, err := g.RunInput(specOf(v), "salt-volume-exec", "prepare", "--spec", "-")
		require.NoError(t, err, "prepare %s: %s", v.name, out)
		var d saltvolumes.Device
		require.NoError(t, json.Unmarshal([]byte(out), &d), out)
		require.Equal(t, "prepared", d.State, out)
		assert.Equal(t, link(v), d.PersistentPath, v.name)
		v.dev = d.DevicePath
	}
	run("udevadm", "settle")
	for _, v := range vols {
		assert.Equal(t, v.dev, run("readlink", "-f", link(v)), "%s: its link names its device", v.name)
	}
	// The kernel itself read the GPT written on the NVMe disk, and udev
	// made the partition's link.
	nvme := vols[2]
	assert.Equal(t, "/dev/nvme0n1p1", nvme.dev)
	assert.Contains(t, run("udevadm", "info", "--query=symlink", "--name="+nvme.dev), "disk/by-partuuid/"+nvme.uuid, "udev's own link")

	assert.Equal(t, "/dev/sda", vols[3].dev)
	assert.Equal(t, lv, vols[4].dev)
	assert.Equal(t, "xfs", run("blkid", "-o", "value", "-s", "TYPE", vols[3].dev))

	// Data on each: a file in each filesystem, bytes on each block device.
	block := func(v *vol) bool { return strings.Contains(v.spec, `"Block"`) }
	before := run("cat", "/proc/sys/kernel/random/boot_id")
	run("mkdir", "-p", "/mnt/v")
	for _, v := range vols {
		if block(v) {
			run("dd", "if=/proc/sys/kernel/random/boot_id", "of="+link(v), "conv=fsync", "status=none")
			continue
		}
		run("mount", link(v), "/mnt/v")
		run("dd", "if=/proc/sys/kernel/random/boot_id", "of=/mnt/v/kept", "conv=fsync", "status=none")
		run("umount", "/mnt/v")
	}

	started = time.Now()
	require.NoError(t, g.Reboot(ctx))
	t.Logf("rebooted, ssh answering again: %s", time.Since(started).Round(time.Second))

	assert.Equal(t, "active", run("systemctl", "is-active", "salt-volumes-restore.service"), "the restore unit ran at boot")
	minionUp()
	// Salt's view converges too: the same state again changes nothing.
	out, code = s.Salt("--timeout=600", guestID, "state.apply", "salt_volumes.prepared", fsPillar, "--out=json", "--static")
	require.Equal(t, 0, code, out)
	for key, st := range saltstack.JSON(t, out)[guestID].(map[string]any) {
		st := st.(map[string]any)
		assert.Equal(t, true, st["result"], key)
		assert.Empty(t, st["changes"], "%s: nothing to prepare again after the reboot", key)
	}
	var rep struct {
		Restore struct {
			Restored int `json:"restored"`
			Failed   int `json:"failed"`
		} `json:"restore"`
	}
	out = run("salt-volume-exec", "last-restore")
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Equal(t, 0, rep.Restore.Failed, out)
	assert.GreaterOrEqual(t, rep.Restore.Restored, 2, "both sparse volumes re-attached: %s", out)
	t.Logf("the restore unit at boot: %d restored, %d failed", rep.Restore.Restored, rep.Restore.Failed)
	run("udevadm", "settle")
	for _, v := range vols {
		dev := run("readlink", "-f", link(v))
		assert.Regexp(t, `^/dev/(loop\d+(p1)?|nvme0n1p1|sda|dm-\d+)$`, dev, "%s: its link is back after the reboot", v.name)
		info, err := g.RunInput(specOf(v), "salt-volume-exec", "info", "--spec", "-")
		require.NoError(t, err, info)
		var d saltvolumes.Device
		require.NoError(t, json.Unmarshal([]byte(info), &d), info)
		assert.Equal(t, "prepared", d.State, "%s after the reboot: %s", v.name, info)
		assert.Equal(t, dev, d.DevicePath, v.name)
	}
	for _, v := range vols {
		if block(v) {
			got := run("dd", "if="+link(v), "bs=36", "count=1", "status=none")
			assert.Equal(t, before, got, "%s: the bytes written before the reboot", v.name)
			continue
		}
		run("mount", link(v), "/mnt/v")
		assert.Equal(t, before, run("cat", "/mnt/v/kept"), "%s: the file written before the reboot", v.name)
		run("umount", "/mnt/v")
	}

	for _, v := range vols {
		out, err := g.RunInput(specOf(v), "salt-volume-exec", "unprepare", "--spec", "-")
		require.NoError(t, err, "unprepare %s: %s", v.name, out)
	}
	run("udevadm", "settle")
	for _, v := range vols[:2] {
		_, err := g.Run("test", "-e", link(v))
		assert.Error(t, err, "%s: its link is gone with its loop device", v.name)
	}
	assert.Empty(t, run("losetup", "-n", "-O", "NAME"), "no loop device left attached")
	listed := run("salt-volume-exec", "list")
	for _, v := range vols {
		assert.NotContains(t, listed, v.uuid, "%s: no record left", v.name)
	}
	assert.Equal(t, "vg0", run("pvs", "--noheadings", "-o", "vg_name", "/dev/vdb"), "the operator's LVM untouched")
}
