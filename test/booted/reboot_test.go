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
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/test/guest"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

const guestID = "guest-1"

// secondID is a second guest booted at the same time, a node of the same
// master: serve runs both nodes' state runs side by side, and the first
// one's reboot leaves the second's volumes alone.
const secondID = "guest-2"

// TestRebootKeepsVolumes: volumes the control plane prepares on a booted
// guest keep their names across a real reboot. udev makes the /dev/disk
// links (the kernel reads the GPT we write on an NVMe disk),
// salt-volumes-restore.service re-attaches sparse volumes at boot before
// local-fs.target from the node's state alone, and serve learns of it from
// the node's beacon: every volume Available again without a state run. A
// disk pulled out of the running guest fails its volume.
func TestRebootKeepsVolumes(t *testing.T) {
	repo := saltstack.Need(t)
	img, err := guest.Image(repo)
	require.NoError(t, err, "the guest image (scripts/guest-image.sh)")
	exec, cleanupExec, err := testenv.BuildExec()
	require.NoError(t, err)
	t.Cleanup(cleanupExec)
	ctx := context.Background()
	// The guest boots (a minute or more under emulation) while the master,
	// salt-api and serve start and the binaries build.
	type booted struct {
		g    *guest.Guest
		err  error
		took time.Duration
	}
	started := time.Now()
	dir := t.TempDir()
	// boot starts a guest in the background; the function it returns
	// waits for it (once).
	boot := func(id string, disks ...guest.Disk) func() *booted {
		c := make(chan booted, 1)
		go func() {
			g, err := guest.Boot(ctx, img, filepath.Join(dir, id), disks...)
			c <- booted{g, err, time.Since(started)}
		}()
		var b *booted
		return func() *booted {
			if b == nil {
				got := <-c
				b = &got
			}
			return b
		}
	}
	// A small node: one blank virtio disk.
	waitBoot2 := boot(secondID, guest.Disk{Name: "vdb", Size: 64 << 20, Bus: "virtio"})
	// An operator's partitioned NVMe and SCSI disks, a disk for LVM and a
	// blank one.
	waitBoot := boot(guestID, guest.Disk{Name: "nvme0", Size: 1 << 30, Bus: "nvme", Partitions: []int64{256 << 20, 256 << 20, 400 << 20}},
		guest.Disk{Name: "scsi0", Size: 512 << 20, Bus: "scsi", Partitions: []int64{320 << 20, 100 << 20}},
		guest.Disk{Name: "vdb", Size: 256 << 20, Bus: "virtio"}, guest.Disk{Name: "vdc", Size: 64 << 20, Bus: "virtio"})
	// Registered before the stack starts, so run after it stops.
	for _, w := range []func() *booted{waitBoot, waitBoot2} {
		t.Cleanup(func() {
			g := w().g
			if g == nil {
				return
			}
			if t.Failed() {
				out, _ := g.Run("journalctl", "-b", "--no-pager", "-n", "80")
				t.Logf("--- journal of the guest in %s\n%s", g.Dir, out)
				t.Logf("--- its console\n%s", g.Tail(3000))
			}
			t.Logf("qemu's translation cache in %s: %s", g.Dir, g.JIT())
			g.Stop()
		})
	}
	s := saltstack.StartOpts(t, exec, saltstack.Options{API: true})
	binDir := t.TempDir()
	require.NoError(t, testenv.Build(binDir, "salt-volumes"))
	formulaBin := filepath.Join(repo, "salt", "states", "salt_volumes", "files", "salt-volume-exec")
	// What make salt-files does (the file is ignored by git), every time:
	// one left by an earlier build would test that build's code.
	_, statErr := os.Stat(formulaBin)
	require.NoError(t, testenv.BuildAs(filepath.Dir(formulaBin), "salt-volume-exec", "cmd/salt-volume-exec"))
	if statErr != nil {
		t.Cleanup(func() { os.Remove(formulaBin) })
	}
	b, b2 := waitBoot(), waitBoot2()
	require.NoError(t, b.err)
	require.NoError(t, b2.err)
	g, g2 := b.g, b2.g
	t.Logf("two guests booted at once, ssh answering: %s and %s (Salt started meanwhile)", b.took.Round(time.Second), b2.took.Round(time.Second))
	run := func(args ...string) string {
		t.Helper()
		out, err := g.Run(args...)
		require.NoError(t, err)
		return strings.TrimSpace(out)
	}

	// The guest is a minion of a master on this machine (10.0.2.2 is the
	// host's 127.0.0.1 from inside), and salt-volume-exec is installed as an
	// operator installs it: state.apply salt_volumes.installed (which also
	// turns the beacon on).
	pub, ret := s.Ports()
	for id, gg := range map[string]*guest.Guest{guestID: g, secondID: g2} {
		require.NoError(t, gg.Write("/etc/salt/minion.d/master.conf", []byte(fmt.Sprintf(
			"id: %s\nmaster: 10.0.2.2\nmaster_port: %d\npublish_port: %d\nacceptance_wait_time: 2\nsalt_volumes:\n  beacon_interval: %d\n",
			id, ret, pub, int(beaconInterval.Seconds()))), 0o644))
		_, err := gg.Run("systemctl", "restart", "salt-minion")
		require.NoError(t, err)
	}
	// Minutes, not seconds: an emulated guest sharing two cores with the
	// rest of make test answers slowly, most of all just after a boot.
	// 20 min: on 2026-12-07, with three guests booting beside make test's
	// race build, guest-1's minion answered jobs 5-7 min after they were
	// published and missed 10 min twice.
	minionUp := func() { s.WaitForMinion(guestID, 20*time.Second, 20*time.Minute) }
	minionUp()
	s.WaitForMinion(secondID, 20*time.Second, 20*time.Minute)
	t.Logf("both guests' minions answer: %s after the boots started", time.Since(started).Round(time.Second))
	installed := time.Now()
	out, code := s.Salt("--timeout=600", "-L", guestID+","+secondID, "state.apply", "salt_volumes.installed", "--out=json", "--static")
	require.Equal(t, 0, code, out)
	t.Logf("state.apply salt_volumes.installed on both guests at once: %s", time.Since(installed).Round(time.Second))
	assert.Equal(t, "enabled", run("systemctl", "is-enabled", "salt-volumes-restore.service"))
	run2 := func(args ...string) string {
		t.Helper()
		out, err := g2.Run(args...)
		require.NoError(t, err)
		return strings.TrimSpace(out)
	}
	assert.Equal(t, "enabled", run2("systemctl", "is-enabled", "salt-volumes-restore.service"))
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
	lvmRefusals(t, g, run)
	lvmSnapshots(t, g, run)
	lvmRestores(t, g, run)
	encryptedCrashes(t, g, run)

	// The control plane, on this machine beside the master: serve reads the
	// master's bus and job cache and publishes through salt-api.
	p := serveproc.New(t, s, filepath.Join(binDir, "salt-volumes"))
	p.Start("")

	type vol struct {
		name  string
		args  []string
		block bool
		uuid  string
		dev   string
		link  string
		job   string
	}
	vols := []*vol{
		{name: "boot-fs", args: []string{"--size", "64Mi"}},
		{name: "boot-blk", args: []string{"--mode", "Block", "--size", "32Mi"}, block: true},
		// Encrypted: a LUKS2 container in the sparse file, its key in a
		// root-only file on the node, opened at boot by the restore unit.
		{name: "boot-enc", args: []string{"--size", "64Mi", "--encryption", "keyfile"}},
		// Encrypted with a key the master keeps in pillar: Locked after
		// a boot until the master opens it.
		{name: masterVolume, args: []string{"--size", "64Mi", "--encryption", "master"}},
		// Encrypted in Block mode: the opened device is the volume.
		{name: "boot-encblk", args: []string{"--mode", "Block", "--size", "24Mi", "--encryption", "keyfile"}, block: true},
		// Partitions of the operator's disks, in both modes: a Block
		// volume's partition gets the volume UUID as its GUID, nothing
		// else on the disk changes.
		{name: "boot-nvme", args: []string{"--mode", "Block", "--device", "/dev/nvme0n1p2"}, block: true},
		{name: "boot-nvmefs", args: []string{"--device", "/dev/nvme0n1p3"}},
		{name: "boot-scsi", args: []string{"--fs", "xfs", "--device", "/dev/sda1"}},
		{name: "boot-scsiblk", args: []string{"--mode", "Block", "--device", "/dev/sda2"}, block: true},
		// A blank whole disk in Block mode: the GPT we write, read by the
		// guest's kernel.
		{name: "boot-disk", args: []string{"--mode", "Block", "--device", "/dev/vdc"}, block: true},
		// An existing logical volume named as a raw device.
		{name: "boot-lv", args: []string{"--device", "/dev/vg0/lv0"}},
		// Logical volumes salt-volumes creates in the operator's VG, and
		// an existing one taken as it is in Block mode.
		{name: "boot-lvfs", args: []string{"--vg", "vg0", "--size", "32Mi"}},
		{name: "boot-lvblk", args: []string{"--vg", "vg0", "--mode", "Block", "--size", "20Mi"}, block: true},
		{name: "boot-lvraw", args: []string{"--mode", "Block", "--device", "/dev/vg0/lv1"}, block: true},
	}
	// On the second node, in the same breath: a sparse volume, and a Block
	// volume on its blank disk.
	seconds := []*vol{
		{name: "two-fs", args: []string{"--size", "32Mi"}},
		{name: "two-disk", args: []string{"--mode", "Block", "--device", "/dev/vdb"}, block: true},
	}
	run("lvcreate", "-q", "-y", "-n", "lv1", "-L", "8M", "vg0")
	// All at once, as users do: one state run on each node prepares them.
	byName := map[string]*vol{}
	for _, v := range vols {
		byName[v.name] = v
	}
	// What the operator's partition tables say, besides GUIDs.
	layout := func() string {
		return run("partx", "-g", "-o", "NR,START,END,TYPE,NAME", "/dev/nvme0n1") + "\n" + run("partx", "-g", "-o", "NR,START,END,TYPE,NAME", "/dev/sda")
	}
	tables := layout()
	require.Len(t, strings.Split(tables, "\n"), 5, tables)
	masterKey := masterKeyInPillar(t, s)
	created := time.Now()
	for _, v := range vols {
		out, errs, code := p.CLI(append([]string{"create", v.name, "--node", guestID}, v.args...)...)
		require.Equal(t, 0, code, "create %s: %s %s", v.name, out, errs)
	}
	for _, v := range seconds {
		out, errs, code := p.CLI(append([]string{"create", v.name, "--node", secondID}, v.args...)...)
		require.Equal(t, 0, code, "create %s: %s %s", v.name, out, errs)
	}
	// available waits for v and takes in what serve says of it.
	available := func(v *vol) {
		t.Helper()
		out, errs, code := p.CLI("wait", v.name, "--for", "Available", "--timeout", "10m")
		require.Equal(t, 0, code, "%s: %s %s", v.name, out, errs)
		view, err := p.Client().Get(ctx, v.name)
		require.NoError(t, err)
		v.uuid, v.dev, v.link, v.job = view.Spec.UUID, view.Status.DevicePath, view.Status.PersistentPath, view.Status.JobID
	}
	for _, v := range seconds {
		available(v)
		run2("udevadm", "settle")
		assert.Equal(t, v.dev, run2("readlink", "-f", v.link), "%s: its link names its device on %s", v.name, secondID)
		_, err := g.Run("test", "-e", v.link)
		assert.Error(t, err, "%s: nothing of it on %s", v.name, guestID)
	}
	assert.Equal(t, "/dev/vdb1", seconds[1].dev, "the second guest's kernel read our GPT")
	for _, v := range seconds {
		if v.block {
			run2("dd", "if=/proc/sys/kernel/random/boot_id", "of="+v.link, "conv=fsync", "status=none")
		} else {
			run2("mkdir", "-p", "/mnt/v")
			run2("mount", v.link, "/mnt/v")
			run2("dd", "if=/proc/sys/kernel/random/boot_id", "of=/mnt/v/kept", "conv=fsync", "status=none")
			run2("umount", "/mnt/v")
		}
	}
	secondBoot := run2("cat", "/proc/sys/kernel/random/boot_id")
	for _, v := range vols {
		available(v)
		if v.name == "boot-encblk" {
			assert.Equal(t, "/dev/mapper/sv-"+v.uuid, v.link, "an encrypted Block volume is its opened container")
		} else if v.block && strings.HasPrefix(v.name, "boot-lv") {
			// An LV is named by LVM's own UUID (seed 000): dm-uuid-LVM-<VG UUID><LV UUID>.
			assert.Regexp(t, `^/dev/disk/by-id/dm-uuid-LVM-[A-Za-z0-9]{64}$`, v.link, v.name)
		} else if v.block {
			assert.Equal(t, "/dev/disk/by-partuuid/"+v.uuid, v.link, v.name)
		} else {
			assert.Equal(t, "/dev/disk/by-uuid/"+v.uuid, v.link, v.name)
		}
	}
	t.Logf("%d volumes created through serve -> all Available: %s", len(vols), time.Since(created).Round(time.Second))
	run("udevadm", "settle")
	// The LVs we made are named after their volumes and tagged with their
	// UUIDs; the operator's are left as they were.
	tags := run("lvs", "--noheadings", "-o", "lv_name,lv_tags", "vg0")
	for _, v := range []*vol{byName["boot-lvfs"], byName["boot-lvblk"]} {
		assert.Regexp(t, `(?m)^\s*`+v.name+`\s+salt-volumes.io/uuid=`+v.uuid+`$`, tags, "%s: an LV named and tagged as documented", v.name)
	}
	assert.Regexp(t, `(?m)^\s*lv0\s*$`, tags, "the operator's LV has no tag of ours")
	assert.Equal(t, "ext4", run("blkid", "-o", "value", "-s", "TYPE", "/dev/vg0/boot-lvfs"))
	assert.Equal(t, byName["boot-lvfs"].uuid, run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/boot-lvfs"), "the filesystem UUID is the volume's")
	for _, v := range vols {
		assert.Equal(t, v.dev, run("readlink", "-f", v.link), "%s: its link names its device", v.name)
	}
	// The kernel itself read the GPT written on the blank disk; udev made
	// the links of the partitions and filesystems: the links udev makes
	// are the ones we asked for, on the same devices.
	assert.Equal(t, "/dev/vdc1", byName["boot-disk"].dev)
	for _, n := range []string{"boot-disk", "boot-nvme", "boot-scsiblk", "boot-nvmefs", "boot-scsi"} {
		v := byName[n]
		assert.Contains(t, run("udevadm", "info", "--query=symlink", "--name="+v.dev), strings.TrimPrefix(v.link, "/dev/"), "%s: udev's own link", n)
	}
	assert.Equal(t, "/dev/nvme0n1p2", byName["boot-nvme"].dev)
	assert.Equal(t, "/dev/nvme0n1p3", byName["boot-nvmefs"].dev)
	assert.Equal(t, "/dev/sda1", byName["boot-scsi"].dev)
	assert.Equal(t, "/dev/sda2", byName["boot-scsiblk"].dev)
	assert.Equal(t, lv, byName["boot-lv"].dev)
	assert.Equal(t, "xfs", run("blkid", "-o", "value", "-s", "TYPE", byName["boot-scsi"].dev))
	// Only the GUIDs of the Block volumes' partitions changed in the
	// operator's tables: same partitions, same places.
	assert.Equal(t, tables, layout(), "the partition tables' layout untouched")
	assert.Equal(t, byName["boot-nvme"].uuid, strings.ToLower(run("blkid", "-o", "value", "-s", "PARTUUID", "/dev/nvme0n1p2")))

	// Data on each: a file in each filesystem, bytes on each block device.
	before := run("cat", "/proc/sys/kernel/random/boot_id")
	run("mkdir", "-p", "/mnt/v")
	for _, v := range vols {
		if v.block {
			run("dd", "if=/proc/sys/kernel/random/boot_id", "of="+v.link, "conv=fsync", "status=none")
			continue
		}
		run("mount", v.link, "/mnt/v")
		run("dd", "if=/proc/sys/kernel/random/boot_id", "of=/mnt/v/kept", "conv=fsync", "status=none")
		run("umount", "/mnt/v")
	}
	enc := byName["boot-enc"]
	// What grep finds in a plain volume's file, it must not find in an
	// encrypted one's.
	require.True(t, inFile(t, g, before, filepath.Join(guestState, "sparse", byName["boot-fs"].uuid)), "the plain volume's file holds the plaintext")
	encrypted := checkEncrypted(t, g, run, enc.uuid, enc.dev, before)
	encryptionRatios(t, g, byName["boot-fs"].link, enc.link)
	checkEncryptedBlock(t, g, run, byName["boot-encblk"].uuid, byName["boot-encblk"].dev, before)

	restored := func() float64 { return p.Metric(`salt_volumes_restores_total{result="reconstructed"}`) }
	restoredBefore := restored()
	started = time.Now()
	require.NoError(t, g.Reboot(ctx))
	t.Logf("rebooted, ssh answering again: %s", time.Since(started).Round(time.Second))
	assert.Equal(t, "active", run("systemctl", "is-active", "salt-volumes-restore.service"), "the restore unit ran at boot")
	var rep struct {
		Restore struct {
			ID       string `json:"id"`
			Restored int    `json:"restored"`
			Failed   int    `json:"failed"`
			Locked   int    `json:"locked"`
		} `json:"restore"`
	}
	out = run("salt-volume-exec", "last-restore")
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Equal(t, 0, rep.Restore.Failed, out)
	assert.GreaterOrEqual(t, rep.Restore.Restored, 4, "the sparse volumes re-attached, the encrypted ones opened: %s", out)
	t.Logf("the restore unit at boot: %d restored, %d failed", rep.Restore.Restored, rep.Restore.Failed)

	// serve hears of it from the node's beacon once the minion is back:
	// the restore counted, every volume Available, and no state run of
	// ours started for any of them.
	minionUp()
	eventually(t, 3*time.Minute, "serve counts the restore at boot", func() (bool, string) {
		got := restored()
		return got >= restoredBefore+float64(rep.Restore.Restored), fmt.Sprint(got)
	})
	t.Logf("restore counted by serve: %s after the reboot started", time.Since(started).Round(time.Second))
	masterOpenedAfterBoot(t, s, p, run, byName[masterVolume].uuid, rep.Restore.ID, rep.Restore.Locked)
	// The boot's run and the beacon's (the master-key volume) each
	// counted once, whichever serve read first.
	eventually(t, 2*time.Minute, "serve counts the beacon's restore too", func() (bool, string) {
		got := restored()
		return got >= restoredBefore+float64(rep.Restore.Restored)+1, fmt.Sprint(got)
	})
	assert.Equal(t, restoredBefore+float64(rep.Restore.Restored)+1, restored(), "no volume counted twice")
	for _, v := range vols {
		eventually(t, 2*time.Minute, v.name+" Available after the reboot", func() (bool, string) {
			view, err := p.Client().Get(ctx, v.name)
			require.NoError(t, err)
			return view.Status.Phase.String() == "Available", view.Status.Phase.String() + " " + view.Status.Reason + " " + view.Status.Message
		})
		view, err := p.Client().Get(ctx, v.name)
		require.NoError(t, err)
		assert.Equal(t, v.job, view.Status.JobID, "%s: no state run since its creation", v.name)
	}

	run("udevadm", "settle")
	for _, v := range vols {
		dev := run("readlink", "-f", v.link)
		assert.Regexp(t, `^/dev/(loop\d+(p1)?|nvme0n1p[23]|sda[12]|vdc1|dm-\d+)$`, dev, "%s: its link is back after the reboot", v.name)
		view, err := p.Client().Get(ctx, v.name)
		require.NoError(t, err)
		assert.Equal(t, dev, view.Status.DevicePath, "%s: serve knows its device after the reboot", v.name)
	}
	for _, v := range vols {
		if v.block {
			got := run("dd", "if="+v.link, "bs=36", "count=1", "status=none")
			assert.Equal(t, before, got, "%s: the bytes written before the reboot", v.name)
			continue
		}
		run("mount", v.link, "/mnt/v")
		assert.Equal(t, before, run("cat", "/mnt/v/kept"), "%s: the file written before the reboot", v.name)
		run("umount", "/mnt/v")
	}
	lockedAndOpened(t, s, p, run, enc.name, enc.uuid, enc.link, enc.job, before)
	masterHeldThenOpened(t, s, p, run, byName[masterVolume].uuid)

	// The second guest, not rebooted, kept its volumes as they were: no
	// state run, the same devices, the same bytes.
	for _, v := range seconds {
		view, err := p.Client().Get(ctx, v.name)
		require.NoError(t, err)
		assert.Equal(t, "Available", view.Status.Phase.String(), v.name)
		assert.Equal(t, v.job, view.Status.JobID, "%s: no state run since its creation", v.name)
		assert.Equal(t, v.dev, run2("readlink", "-f", v.link), v.name)
		if v.block {
			assert.Equal(t, secondBoot, run2("dd", "if="+v.link, "bs=36", "count=1", "status=none"), v.name)
		} else {
			run2("mount", v.link, "/mnt/v")
			assert.Equal(t, secondBoot, run2("cat", "/mnt/v/kept"), v.name)
			run2("umount", "/mnt/v")
		}
	}
	// Salt's view converges too: the node's state for the first volume,
	// applied again by hand, changes nothing.
	fs := vols[0]
	fsPillar := saltstack.Pillar(map[string]any{"salt_volumes": map[string]any{"volume": map[string]any{
		"name": fs.name, "uuid": fs.uuid, "node": guestID, "sparseLoopDevice": map[string]any{"size": "64Mi"}}}})
	out, code = s.Salt("--timeout=600", guestID, "state.apply", "salt_volumes.prepared", fsPillar, "--out=json", "--static")
	require.Equal(t, 0, code, out)
	for key, st := range saltstack.JSON(t, out)[guestID].(map[string]any) {
		st := st.(map[string]any)
		assert.Equal(t, true, st["result"], key)
		assert.Empty(t, st["changes"], "%s: nothing to prepare again after the reboot", key)
	}

	// Grown while mounted, through serve: online, as only a root with
	// CAP_SYS_RESOURCE can (this guest's; not the host's).
	run("mount", fs.link, "/mnt/v")
	dfBefore := run("df", "--output=size", "-B1", "/mnt/v")
	out, errs, code := p.CLI("resize", fs.name, "--size", "96Mi", "--wait", "--timeout", "5m")
	require.Equal(t, 0, code, out+errs)
	grown, err := p.Client().Get(ctx, fs.name)
	require.NoError(t, err)
	assert.Equal(t, int64(96<<20), grown.Status.Size)
	dfAfter := run("df", "--output=size", "-B1", "/mnt/v")
	assert.NotEqual(t, dfBefore, dfAfter, "df shows the growth at once")
	assert.Equal(t, before, run("cat", "/mnt/v/kept"), "the file written before is intact")
	run("umount", "/mnt/v")
	t.Logf("grown online from 64Mi to 96Mi through serve: df %s -> %s", strings.Fields(dfBefore)[1], strings.Fields(dfAfter)[1])
	// The encrypted one too: the loop device, then the opened container
	// (cryptsetup resize), then its ext4, while mounted.
	run("mount", enc.link, "/mnt/v")
	encBefore := run("df", "--output=size", "-B1", "/mnt/v")
	out, errs, code = p.CLI("resize", enc.name, "--size", "96Mi", "--wait", "--timeout", "5m")
	require.Equal(t, 0, code, out+errs)
	encAfter := run("df", "--output=size", "-B1", "/mnt/v")
	encFS, _ := strconv.ParseInt(strings.Fields(encAfter)[1], 10, 64)
	assert.Greater(t, encFS, int64(64<<20), "the encrypted volume's filesystem took the room: %s", encAfter)
	assert.Equal(t, strconv.Itoa(80<<20), run("blockdev", "--getsize64", run("readlink", "-f", enc.link)), "the opened container: 96Mi less the 16Mi header")
	assert.Equal(t, before, run("cat", "/mnt/v/kept"), "the encrypted volume's file is intact")
	run("umount", "/mnt/v")
	t.Logf("encrypted volume grown online from 64Mi to 96Mi through serve: df %s -> %s", strings.Fields(encBefore)[1], strings.Fields(encAfter)[1])

	// An lvmLogicalVolume grows too: lvextend, then its ext4 (offline:
	// nothing mounts it), through serve.
	out, errs, code = p.CLI("resize", "boot-lvfs", "--size", "64Mi", "--wait", "--timeout", "5m")
	require.Equal(t, 0, code, out+errs)
	lvGrown, err := p.Client().Get(ctx, "boot-lvfs")
	require.NoError(t, err)
	assert.Equal(t, int64(64<<20), lvGrown.Status.Size)
	assert.Equal(t, "67108864", run("lvs", "--noheadings", "--units", "b", "--nosuffix", "-o", "lv_size", "vg0/boot-lvfs"), "the LV grew")
	run("mount", "/dev/vg0/boot-lvfs", "/mnt/v")
	lvDF := run("df", "--output=size", "-B1", "/mnt/v")
	run("umount", "/mnt/v")
	lvFS, _ := strconv.ParseInt(strings.Fields(lvDF)[1], 10, 64)
	assert.Greater(t, lvFS, int64(48<<20), "its filesystem fills the grown LV: %s", lvDF)
	_, errs, code = p.CLI("resize", "boot-lvfs", "--size", "32Mi")
	assert.Equal(t, 2, code, "shrinking refused: %s", errs)

	// An LVM snapshot through serve and Salt (a thick one, 8Mi set
	// aside), and a clone of it beside the origin, with the origin's
	// data and a UUID of its own.
	out, errs, code = p.CLI("snapshot", "create", "boot-lvfs", "lv-nightly", "--size", "8Mi", "--wait", "--timeout", "5m")
	require.Equal(t, 0, code, out+errs)
	snap, err := p.Client().Snapshot(ctx, "lv-nightly")
	require.NoError(t, err)
	assert.Equal(t, "Ready", snap.Phase, snap.Message)
	assert.Equal(t, "lvm-thick", snap.Method)
	assert.Equal(t, int64(8<<20), snap.COWSize)
	assert.Equal(t, "vg0/svsnap-"+byName["boot-lvfs"].uuid[:8]+"-lv-nightly", snap.LV)
	assert.Contains(t, run("lvs", "--noheadings", "-o", "lv_name,origin", "vg0"), "boot-lvfs", "the snapshot LV of boot-lvfs")
	out, errs, code = p.CLI("create", "boot-lvcopy", "--from", "snapshot/lv-nightly", "--wait", "--timeout", "5m")
	require.Equal(t, 0, code, out+errs)
	lvCopy, err := p.Client().Get(ctx, "boot-lvcopy")
	require.NoError(t, err)
	require.NotNil(t, lvCopy.Spec.LVMLogicalVolume, "the clone of an LVM snapshot is an LV")
	assert.Equal(t, "vg0", lvCopy.Spec.LVMLogicalVolume.VGName)
	run("mount", "/dev/vg0/boot-lvfs", "/mnt/v")
	run("mkdir", "-p", "/mnt/c")
	run("mount", lvCopy.Status.PersistentPath, "/mnt/c")
	assert.Equal(t, before, run("cat", "/mnt/c/kept"), "the clone holds the origin's file, both mounted at once")
	run("umount", "/mnt/c", "/mnt/v")
	assert.Equal(t, lvCopy.Spec.UUID, run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/boot-lvcopy"))
	// 6.75Mi written to the origin fill the snapshot's 8Mi past 80 %: the
	// node's beacon reports the warning, which serve shows under the
	// nodes table and counts in its metrics.
	run("mount", "/dev/vg0/boot-lvfs", "/mnt/v")
	run("dd", "if=/dev/urandom", "of=/mnt/v/fill", "bs=64K", "count=108", "oflag=direct", "conv=fsync", "status=none")
	run("rm", "/mnt/v/fill")
	run("umount", "/mnt/v")
	// ext4's own writes on top (its journal, and the inode tables its
	// lazy init zeroes in the background) vary, and once took the 8Mi past
	// full: an overflow is the same warning path, and lvmSnapshots checks
	// each step on a Block LV, where the bytes written are exact.
	warned := regexp.MustCompile(`warning: ` + guestID + `: snapshot lv-nightly of boot-lvfs: (its copy-on-write space is over (80|90|95)% full|overflowed)`)
	eventually(t, 2*time.Minute, "the snapshot's warning reported by the beacon", func() (bool, string) {
		_, errs, _ := p.CLI("nodes")
		return warned.MatchString(errs), errs
	})
	assert.Equal(t, 1.0, p.Metric(`salt_volumes_node_snapshot_warnings{node="`+guestID+`"}`))
	_, errs, code = p.CLI("rm", "boot-lvfs")
	assert.Equal(t, 3, code, "a volume with a snapshot is not deleted: %s", errs)
	assert.Contains(t, errs, "lv-nightly")
	out, errs, code = p.CLI("snapshot", "rm", "lv-nightly", "--wait", "--timeout", "5m")
	require.Equal(t, 0, code, out+errs)
	assert.NotContains(t, run("lvs", "--noheadings", "-o", "lv_name", "vg0"), "svsnap-", "its LV removed")
	vols = append(vols, &vol{name: "boot-lvcopy", uuid: lvCopy.Spec.UUID})
	for _, v := range []*vol{fs, enc} {
		eventually(t, 2*time.Minute, v.name+" reported unmounted by the beacon", func() (bool, string) {
			got, err := p.Client().Get(ctx, v.name)
			require.NoError(t, err)
			return !got.Status.InUse, fmt.Sprint(got.Status.InUse)
		})
	}

	// A disk pulled out of the running guest: its volume goes Failed
	// (StorageLost) by the beacon's next report.
	scsi := byName["boot-scsi"]
	w := p.Watch(scsi.name)
	pulled := time.Now()
	require.NoError(t, g.RemoveDisk("scsi0"))
	evs := w.Until(t, 2*time.Minute, func(ev saltvolumes.Event) bool { return ev.Volume.Status.Phase.String() == "Failed" })
	lost := time.Since(pulled)
	last := evs[len(evs)-1].Volume.Status
	assert.Equal(t, "StorageLost", last.Reason, last.Message)
	t.Logf("disk pulled -> %s Failed (%s): %s (beacon interval %s): %s", scsi.name, last.Reason, lost.Round(100*time.Millisecond), beaconInterval, last.Message)
	// Said by the beacon's change report, not its heartbeat (5 min): the
	// report comes within an interval, then serve confirms it with a
	// salt_volumes.status job on the guest (seconds under emulation).
	assert.Less(t, lost, time.Minute, "found by the beacon's next run, not by a heartbeat")
	w.Stop()

	// Everything deleted through serve: loop devices detached, links and
	// records gone; the operator's LVM untouched.
	// Asked at once, as the creates were: the removals share state runs.
	held, heldKey := keptForErase(t, g, run, encrypted)
	for _, v := range append(vols, seconds...) {
		args := []string{"rm", v.name}
		if v.name == "boot-lvfs" || v.name == "boot-lvcopy" || v.name == "boot-enc" {
			args = append(args, "--wipe") // removes the LV; boot-lvblk's stays
		}
		out, errs, code := p.CLI(args...)
		require.Equal(t, 0, code, "rm %s: %s %s", v.name, out, errs)
	}
	for _, v := range append(vols, seconds...) {
		out, errs, code := p.CLI("wait", v.name, "--for", "Deleted", "--timeout", "10m")
		require.Equal(t, 0, code, "%s: %s %s", v.name, out, errs)
	}
	assert.Empty(t, run2("losetup", "-n", "-O", "NAME"), "no loop device left attached on %s", secondID)
	listed2 := run2("salt-volume-exec", "list")
	for _, v := range seconds {
		assert.NotContains(t, listed2, v.uuid, "%s: no record left", v.name)
	}
	run("udevadm", "settle")
	for _, v := range []*vol{byName["boot-fs"], byName["boot-blk"]} {
		_, err := g.Run("test", "-e", v.link)
		assert.Error(t, err, "%s: its link is gone with its loop device", v.name)
	}
	assert.Empty(t, run("losetup", "-n", "-O", "NAME"), "no loop device left attached")
	listed := run("salt-volume-exec", "list")
	for _, v := range vols {
		assert.NotContains(t, listed, v.uuid, "%s: no record left", v.name)
	}
	assert.Equal(t, "vg0", run("pvs", "--noheadings", "-o", "vg_name", "/dev/vdb"), "the operator's LVM untouched")
	lvs := run("lvs", "--noheadings", "-o", "lv_name", "vg0")
	assert.NotContains(t, lvs, "boot-lvfs", "deleted with --wipe: its LV removed")
	assert.Contains(t, lvs, "boot-lvblk", "deleted without --wipe: its LV and data kept")
	assert.Contains(t, lvs, "lv0")
	assert.Contains(t, lvs, "lv1", "an existing LV used as a raw volume is never removed")
	assert.Equal(t, before, run("dd", "if=/dev/vg0/boot-lvblk", "bs=36", "count=1", "status=none"), "the kept LV's data")

	// The encrypted volume, deleted with --wipe: a crypto-erase. And its
	// key was never in a job return, an event, a log of the master, of
	// serve or of the guest.
	checkErased(t, g, encrypted, held, heldKey)
	files := assertNoKeyUnder(t, s.Root, encrypted.key)
	assertNoKey(t, "serve's log", []byte(p.LogText()), encrypted.key)
	assertNoKey(t, "the guest's journal", []byte(run("journalctl", "--no-pager", "-o", "cat")), encrypted.key)
	if minionLog, err := g.Run("cat", "/var/log/salt/minion"); err == nil {
		assertNoKey(t, "the minion's log", []byte(minionLog), encrypted.key)
	}
	t.Logf("the encrypted volume's key is in none of the master's %d files (job cache, events, logs), serve's log or the guest's journal", files)
	// The master-held key: in the master's pillar (where the operator put
	// it) and its minion data cache (Salt keeps each minion's pillar
	// there: cache/pillar/<id>.p on 3008, cache/minions/<id>/data.p on
	// 3006), in no job return, event or log of the master, serve or the
	// guest, and nowhere on the node.
	files = assertNoKeyUnderExcept(t, s.Root, masterKey, func(p string) bool {
		return strings.Contains(p, "/pillar/") || strings.Contains(p, "/minions/"+guestID+"/data.p")
	})
	assertNoKey(t, "serve's log", []byte(p.LogText()), masterKey)
	assertNoKey(t, "the guest's journal", []byte(run("journalctl", "--no-pager", "-o", "cat")), masterKey)
	noMasterKeyOnTheNode(t, g, masterKey)
	t.Logf("the master-held key is in none of the master's %d files beside its pillar and minion data cache, serve's log, or the guest's disks", files)
}

// lvmRefusals: an LV that salt-volumes did not create is never taken or
// formatted, and what an earlier LV left on a new LV's extents is refused
// (the new LV removed again) unless the volume asks for it to be wiped.
func lvmRefusals(t *testing.T, g *guest.Guest, run func(...string) string) {
	prepare := func(spec string, args ...string) (string, error) {
		return g.RunInput([]byte(spec), append([]string{"salt-volume-exec", "prepare", "--spec", "-"}, args...)...)
	}
	run("lvcreate", "-q", "-y", "-n", "boot-hand", "-L", "8M", "vg0")
	run("mkfs.ext4", "-q", "/dev/vg0/boot-hand")
	hand := run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/boot-hand")
	out, err := prepare(`{"name":"boot-hand","uuid":"` + uuid.NewString() + `","lvmLogicalVolume":{"vgName":"vg0","size":"8Mi"}}`)
	require.Error(t, err, "an LV made by hand with a filesystem: %s", out)
	assert.Contains(t, err.Error(), "exit status 3")
	assert.Contains(t, out, "salt-volumes did not create it")
	assert.Equal(t, hand, run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/boot-hand"), "its filesystem intact")

	// A filesystem left on extents an LV no longer uses: the next LV there
	// finds it.
	run("lvcreate", "-q", "-y", "-n", "old", "-L", "16M", "vg0")
	run("mkfs.ext4", "-q", "/dev/vg0/old")
	run("lvremove", "-q", "-y", "vg0/old")
	u := uuid.NewString()
	fresh := `{"name":"boot-fresh","uuid":"` + u + `","lvmLogicalVolume":{"vgName":"vg0","size":"16Mi"%s}}`
	out, err = prepare(fmt.Sprintf(fresh, ""))
	require.Error(t, err, "a new LV holding an earlier LV's filesystem: %s", out)
	assert.Contains(t, err.Error(), "exit status 3")
	assert.Contains(t, out, "ext4 signature", "the refusal says what is there")
	assert.NotContains(t, run("lvs", "--noheadings", "-o", "lv_name", "vg0"), "boot-fresh", "the new LV removed again")
	assert.NotContains(t, run("salt-volume-exec", "list"), u, "no record left")
	out, err = prepare(fmt.Sprintf(fresh, `,"wipeSignatures":true`))
	require.NoError(t, err, "with wipeSignatures: %s", out)
	assert.Equal(t, u, run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/boot-fresh"), "formatted after the wipe")
	out, err = g.RunInput([]byte(fmt.Sprintf(fresh, `,"wipeSignatures":true`)), "salt-volume-exec", "unprepare", "--wipe", "--spec", "-")
	require.NoError(t, err, "unprepare --wipe: %s", out)
	assert.NotContains(t, run("lvs", "--noheadings", "-o", "lv_name", "vg0"), "boot-fresh", "unprepare --wipe removed our LV")
	run("lvremove", "-q", "-y", "vg0/boot-hand")
}

// beaconInterval is the guest's beacon interval: the default. Shorter, the
// beacon's runs crowd the emulated guest's one CPU (and serve confirms each
// change with a job there): under make test's load the guest then answered
// test.ping only minutes late after its reboot.
const beaconInterval = 10 * time.Second

var eventually = testenv.Eventually
