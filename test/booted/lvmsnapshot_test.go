package booted

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/guest"
)

// lvmSnapshots: snapshots of LVM volumes with the node's binary, on a
// booted guest (device-mapper, udev): thick ones with copy-on-write space
// of the size asked, their fill level and the warning before they
// overflow, thin ones of a thin LV; clones of both mounted beside their
// origins with the old content and a UUID of their own; a run killed after
// every step of a snapshot and of a clone converges when run again; a raw
// volume on an operator's LV gets that LV's snapshots, one on a disk is
// refused. All of it is removed again: vg0 is as before.
func lvmSnapshots(t *testing.T, g *guest.Guest, run func(...string) string) {
	started := time.Now()
	defer func() {
		t.Logf("LVM snapshots and clones with the node's binary: %s", time.Since(started).Round(time.Second))
	}()
	type volume struct{ name, uuid, spec string }
	newVol := func(name, lvm string, extra string) volume {
		u := uuid.NewString()
		return volume{name, u, fmt.Sprintf(`{"name":%q,"uuid":%q,"lvmLogicalVolume":%s%s}`, name, u, lvm, extra)}
	}
	exe := func(v volume, env []string, args ...string) (string, error) {
		cmd := append(append([]string{"env"}, env...), append([]string{"salt-volume-exec"}, args...)...)
		return g.RunInput([]byte(v.spec), append(cmd, "--spec", "-")...)
	}
	ok := func(v volume, args ...string) map[string]any {
		t.Helper()
		out, err := exe(v, nil, args...)
		require.NoError(t, err, "%s %v: %s", v.name, args, out)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &m), out)
		return m
	}
	// crashEach kills the binary after each step in turn, then runs it to
	// the end: every step must leave something the next run finishes.
	crashEach := func(v volume, steps []string, args ...string) map[string]any {
		t.Helper()
		for _, st := range steps {
			out, err := exe(v, []string{"SALT_VOLUMES_CRASH_AFTER=" + st}, args...)
			require.Error(t, err, "%s: killed after %s: %s", v.name, st, out)
			// SIGKILL: ssh says 255 (the remote command died of a
			// signal); the binary's own failures exit 1-4.
			assert.Regexp(t, `exit status (137|255)`, err.Error(), "%s: killed after %s, not failed: %s", v.name, st, out)
		}
		// A second on: what the killed run made (an LV's lv_time, one
		// second's resolution) is then told from the last run's clock.
		run("sleep", "1.1")
		return ok(v, args...)
	}
	lvs := func() string { return run("lvs", "--noheadings", "-o", "lv_name,lv_tags,origin,pool_lv", "vg0") }
	snapshots := func(v volume) []map[string]any {
		t.Helper()
		var res struct{ Snapshots []map[string]any }
		out, err := exe(v, nil, "snapshots")
		require.NoError(t, err, out)
		require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		return res.Snapshots
	}
	byUUID := func(u string) string {
		run("udevadm", "settle")
		return run("readlink", "-f", "/dev/disk/by-uuid/"+u)
	}
	write := func(dir, text string) {
		require.NoError(t, g.Write(dir+"/data", []byte(text), 0o644))
		run("sync")
	}
	// Every event udev handles for a block device from here on, with the
	// links it gave the device (#49 item 6: a clone carries its origin's
	// filesystem UUID until it gets its own; at no instant may udev hand
	// the origin's by-uuid link to it).
	run("systemd-run", "--unit=udev-watch", "--property=StandardOutput=file:/root/udev-events", "udevadm", "monitor", "--udev", "--property", "--subsystem-match=block")
	defer func() { _, _ = g.Run("systemctl", "stop", "udev-watch") }()
	// claimedBy lists the devices that claimed /dev/disk/by-uuid/u in an
	// event, except LVM's thick snapshots (low link priority: they never
	// take it from their origin).
	claimedBy := func(u string) map[string]int {
		run("udevadm", "settle")
		out := run("cat", "/root/udev-events")
		devs := map[string]int{}
		for _, ev := range strings.Split(out, "\nUDEV ") {
			props := map[string]string{}
			for _, line := range strings.Split(ev, "\n") {
				if k, v, ok := strings.Cut(line, "="); ok {
					props[k] = v
				}
			}
			if props["DM_UDEV_LOW_PRIORITY_FLAG"] == "1" {
				continue
			}
			for _, l := range strings.Fields(props["DEVLINKS"]) {
				if l == "/dev/disk/by-uuid/"+u {
					devs[props["DEVNAME"]+" "+props["DM_NAME"]]++
				}
			}
		}
		return devs
	}
	onlyOrigin := func(u, dev, what string) {
		t.Helper()
		for d := range claimedBy(u) {
			assert.True(t, strings.HasPrefix(d, dev+" "), "%s: udev gave the origin's link /dev/disk/by-uuid/%s to %s (the origin is %s)", what, u, d, dev)
		}
		assert.Equal(t, dev, byUUID(u), "%s: the origin's by-uuid link", what)
	}

	// Thick: an ext4 LV, mounted and written, snapshotted with 16Mi of
	// copy-on-write space; the kill-at-every-step run first.
	// The extents may hold what lvmRefusals' LVs left: wiped, as asked.
	origin := newVol("snap-thick", `{"vgName":"vg0","size":"32Mi","wipeSignatures":true}`, "")
	ok(origin, "prepare")
	originDev := run("readlink", "-f", "/dev/vg0/snap-thick")
	run("mkdir", "-p", "/mnt/o", "/mnt/c", "/mnt/o2")
	run("mount", "/dev/vg0/snap-thick", "/mnt/o")
	write("/mnt/o", "before")
	s1 := crashEach(origin, []string{"snapshot-recorded", "snapshot-lv-created"}, "snapshot", "--name", "s1", "--size", "16Mi")
	assert.Equal(t, "lvm-thick", s1["method"])
	assert.Equal(t, true, s1["frozen"], "the mounted ext4 frozen by LVM's suspend")
	assert.Equal(t, float64(16<<20), s1["cowSize"])
	assert.Equal(t, "vg0/svsnap-"+origin.uuid[:8]+"-s1", s1["lv"])
	assert.Regexp(t, `(?m)^\s*svsnap-`+origin.uuid[:8]+`-s1\s+salt-volumes.io/uuid=`+origin.uuid+`/snapshot=s1\s+snap-thick\s*$`, lvs(), "one snapshot LV, tagged as ours, of the origin")
	assert.Equal(t, originDev, byUUID(origin.uuid), "the volume's by-uuid link still names the origin, not the snapshot that shares its UUID")
	// Adopted by the last run: taken when LVM made the LV, not then.
	made, err := time.Parse("2006-01-02 15:04:05 -0700", run("lvs", "--noheadings", "-o", "lv_time", "vg0/svsnap-"+origin.uuid[:8]+"-s1"))
	require.NoError(t, err)
	assert.Equal(t, made.UTC().Format(time.RFC3339), s1["takenAt"].(string)[:19]+"Z", "takenAt is the LV's creation")
	again := ok(origin, "snapshot", "--name", "s1", "--size", "16Mi")
	assert.Equal(t, s1["lvUUID"], again["lvUUID"], "taking it again answers the snapshot taken")
	write("/mnt/o", "after")

	// Deleting the origin is refused while it has a snapshot.
	out, err := exe(origin, nil, "unprepare", "--wipe")
	require.Error(t, err, out)
	assert.Contains(t, out, "has snapshots (s1)")

	// A clone of s1, larger, killed after every step: mounted beside the
	// origin with the old content and its own UUID.
	clone := newVol("snap-thick-c", `{"vgName":"vg0","size":"40Mi"}`, fmt.Sprintf(`,"source":{"volumeUUID":%q,"snapshot":"s1"}`, origin.uuid))
	res := crashEach(clone, []string{"lv-created", "cloned", "clone-identity", "lv-deactivated", "clone-revealed"}, "prepare")
	onlyOrigin(origin.uuid, originDev, "a thick clone killed after each step")
	assert.Equal(t, "/dev/disk/by-uuid/"+clone.uuid, res["persistentPath"])
	assert.Equal(t, clone.uuid, run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/snap-thick-c"), "the clone's ext4 has the clone's UUID")
	assert.Equal(t, origin.uuid, run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/snap-thick"), "the origin's unchanged")
	run("mount", "/dev/disk/by-uuid/"+clone.uuid, "/mnt/c")
	assert.Equal(t, "before", run("cat", "/mnt/c/data"), "the clone holds the snapshot's content")
	assert.Equal(t, "after", run("cat", "/mnt/o/data"), "the origin its own, both mounted at once")
	size := func(dir string) int64 {
		n, err := strconv.ParseInt(run("findmnt", "-bno", "SIZE", dir), 10, 64)
		require.NoError(t, err)
		return n
	}
	assert.Greater(t, size("/mnt/c"), size("/mnt/o")+(6<<20), "the clone's ext4 grown to its 40Mi, the origin's 32Mi")
	run("umount", "/mnt/c")

	// The fill level and its warning: a Block LV's snapshot with one
	// extent (4Mi) of copy-on-write space, written through the origin.
	blk := newVol("snap-fill", `{"vgName":"vg0","size":"16Mi","wipeSignatures":true}`, `,"mode":"Block"`)
	ok(blk, "prepare")
	ok(blk, "snapshot", "--name", "fill", "--size", "4Mi")
	run("dd", "if=/dev/urandom", "of=/dev/vg0/snap-fill", "bs=64K", "count=56", "oflag=direct", "status=none")
	sn := snapshots(blk)
	require.Len(t, sn, 1)
	assert.GreaterOrEqual(t, sn[0]["dataPercent"], 80.0, "3.5Mi changed of 4Mi: %v", sn[0])
	assert.Contains(t, sn[0]["warning"], "full: at 100% LVM drops the snapshot and its data is lost", "warned before it overflows")
	assert.Nil(t, sn[0]["lost"], "not lost yet")
	var list struct {
		Capacity struct{ SnapshotWarnings []string }
	}
	listed := run("salt-volume-exec", "list")
	require.NoError(t, json.Unmarshal([]byte(listed), &list))
	assert.Contains(t, strings.Join(list.Capacity.SnapshotWarnings, "\n"), "snapshot fill of snap-fill: its copy-on-write space is over", "in the node's report the beacon sends")
	run("dd", "if=/dev/urandom", "of=/dev/vg0/snap-fill", "bs=64K", "count=32", "seek=64", "oflag=direct", "status=none")
	sn = snapshots(blk)
	assert.Contains(t, sn[0]["warning"], "overflowed", "lost, and said so: %v", sn[0])
	assert.Equal(t, true, sn[0]["lost"], "lost, for the Salt state and the control plane to tell: %v", sn[0])
	out, err = exe(newVol("snap-fill-c", `{"vgName":"vg0","size":"16Mi"}`, fmt.Sprintf(`,"mode":"Block","source":{"volumeUUID":%q,"snapshot":"fill"}`, blk.uuid)), nil, "prepare")
	require.Error(t, err, "no clone of a snapshot that overflowed: %s", out)
	assert.Contains(t, out, "overflowed")
	assert.NotContains(t, lvs(), "snap-fill-c", "the refused clone left no LV")

	// A Block LV with a filesystem its user made inside: its clone (Block
	// too, asking to wipe what a fresh LV holds) keeps the snapshot's
	// content; the clone's own bytes are not an earlier LV's leftovers.
	blkfs := newVol("snap-blkfs", `{"vgName":"vg0","size":"16Mi","wipeSignatures":true}`, `,"mode":"Block"`)
	ok(blkfs, "prepare")
	run("mkfs.ext4", "-q", "/dev/vg0/snap-blkfs")
	run("mount", "/dev/vg0/snap-blkfs", "/mnt/c")
	write("/mnt/c", "block before")
	ok(blkfs, "snapshot", "--name", "b1", "--size", "8Mi")
	write("/mnt/c", "block after")
	run("umount", "/mnt/c")
	blkClone := newVol("snap-blkfs-c", `{"vgName":"vg0","size":"16Mi","wipeSignatures":true}`, fmt.Sprintf(`,"mode":"Block","source":{"volumeUUID":%q,"snapshot":"b1"}`, blkfs.uuid))
	crashEach(blkClone, []string{"lv-created", "cloned", "clone-revealed"}, "prepare")
	assert.Contains(t, lvs(), "snap-blkfs-c", "the clone's LV is there")
	run("mount", "-o", "ro", "/dev/vg0/snap-blkfs-c", "/mnt/c")
	assert.Equal(t, "block before", run("cat", "/mnt/c/data"), "the clone holds the snapshot's filesystem")
	run("umount", "/mnt/c")
	ok(blkfs, "snapshot-delete", "--name", "b1")
	ok(blkClone, "unprepare", "--wipe")
	ok(blkfs, "unprepare", "--wipe")

	// Thin: a thin LV in a pool of the operator's; its snapshot takes no
	// size and stays inactive (no second by-uuid link); the clone is a
	// thin snapshot of it, in the same pool, with its own UUID.
	run("lvcreate", "-q", "-y", "--type", "thin-pool", "-L", "48M", "-n", "pool", "vg0")
	thin := newVol("snap-thin", `{"vgName":"vg0","size":"32Mi","thinPool":"pool"}`, "")
	ok(thin, "prepare")
	run("mount", "/dev/vg0/snap-thin", "/mnt/c")
	write("/mnt/c", "thin before")
	t1 := crashEach(thin, []string{"snapshot-recorded", "snapshot-lv-created"}, "snapshot", "--name", "t1")
	assert.Equal(t, "lvm-thin", t1["method"])
	assert.Nil(t, t1["cowSize"], "a thin snapshot sets nothing aside")
	assert.NotNil(t, t1["dataPercent"], "the pool's fill level: %v", t1)
	// The pool's metadata too (a full one stops the pool as full data
	// does), in the listing and in the node's report, as LVM says.
	// The mounted ext4 goes on writing (its lazy init), so the pool
	// moves between two readings: compared within a point.
	poolFill := func() (data, meta float64) {
		f := strings.Fields(run("lvs", "--noheadings", "-o", "data_percent,metadata_percent", "vg0/pool"))
		require.Len(t, f, 2)
		data, err := strconv.ParseFloat(f[0], 64)
		require.NoError(t, err)
		meta, err = strconv.ParseFloat(f[1], 64)
		require.NoError(t, err)
		return data, meta
	}
	sn = snapshots(thin)
	require.Len(t, sn, 1)
	_, meta := poolFill()
	require.IsType(t, 0.0, sn[0]["metadataPercent"], "the pool's metadata fill: %v", sn[0])
	assert.InDelta(t, meta, sn[0]["metadataPercent"].(float64), 1, "the pool's metadata fill: %v", sn[0])
	var report struct {
		Capacity struct {
			ThinPools []struct {
				Name                         string
				DataPercent, MetadataPercent float64
			}
			VGs []struct {
				Name       string
				Size, Free int64
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(run("salt-volume-exec", "list")), &report))
	// The volume groups and their free space, as vgs has them, for people
	// choosing where an LVM volume goes (#51).
	vgFree, err := strconv.ParseInt(strings.TrimSpace(run("vgs", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_free", "vg0")), 10, 64)
	require.NoError(t, err)
	require.NotEmpty(t, report.Capacity.VGs)
	assert.Equal(t, "vg0", report.Capacity.VGs[0].Name)
	assert.Equal(t, vgFree, report.Capacity.VGs[0].Free, "the report's free space is vgs's")
	assert.Greater(t, report.Capacity.VGs[0].Size, vgFree)
	data, meta := poolFill()
	require.Len(t, report.Capacity.ThinPools, 1, "the pool holding our thin LV is reported")
	assert.Equal(t, "vg0/pool", report.Capacity.ThinPools[0].Name)
	assert.InDelta(t, data, report.Capacity.ThinPools[0].DataPercent, 1)
	assert.InDelta(t, meta, report.Capacity.ThinPools[0].MetadataPercent, 1)
	thinDev := run("readlink", "-f", "/dev/vg0/snap-thin")
	assert.Equal(t, thinDev, byUUID(thin.uuid), "the thin snapshot, inactive, has no link")
	write("/mnt/c", "thin after")
	thinClone := newVol("snap-thin-c", `{"vgName":"vg0","size":"32Mi"}`, fmt.Sprintf(`,"source":{"volumeUUID":%q,"snapshot":"t1"}`, thin.uuid))
	crashEach(thinClone, []string{"lv-created", "clone-identity", "lv-deactivated", "clone-revealed"}, "prepare")
	onlyOrigin(thin.uuid, thinDev, "a thin clone killed after each step")
	assert.Regexp(t, `(?m)^\s*snap-thin-c\s+\S+\s+svsnap-\S+\s+pool\s*$`, lvs(), "the clone is a thin LV of the snapshot, in the pool")
	run("mount", "/dev/disk/by-uuid/"+thinClone.uuid, "/mnt/o2")
	assert.Equal(t, "thin before", run("cat", "/mnt/o2/data"))
	assert.Equal(t, "thin after", run("cat", "/mnt/c/data"))

	// A sparse xfs volume's clone is attached to a loop device for its log
	// replay while it still carries the origin's UUID: udev must not see it.
	sx := volume{"snap-xfs", uuid.NewString(), ""}
	sx.spec = fmt.Sprintf(`{"name":"snap-xfs","uuid":%q,"fsType":"xfs","sparseLoopDevice":{"size":"320Mi"}}`, sx.uuid)
	sxDev := ok(sx, "prepare")["devicePath"].(string)
	run("mount", sxDev, "/mnt/o2")
	write("/mnt/o2", "xfs before")
	ok(sx, "snapshot", "--name", "x1")
	sxc := volume{"snap-xfs-c", uuid.NewString(), ""}
	sxc.spec = fmt.Sprintf(`{"name":"snap-xfs-c","uuid":%q,"fsType":"xfs","sparseLoopDevice":{"size":"320Mi"},"source":{"volumeUUID":%q,"snapshot":"x1"}}`, sxc.uuid, sx.uuid)
	sxcDev := crashEach(sxc, []string{"cloned", "clone-log-mounted", "clone-log-replayed", "clone-identity"}, "prepare")["devicePath"].(string)
	onlyOrigin(sx.uuid, sxDev, "a sparse xfs clone killed after each step")
	assert.Equal(t, sxcDev, byUUID(sxc.uuid), "the clone's own link")
	run("umount", "/mnt/o2")
	ok(sx, "snapshot-delete", "--name", "x1")
	ok(sxc, "unprepare", "--wipe")
	ok(sx, "unprepare", "--wipe")

	// Everything removed: snapshots first (the volumes refuse otherwise),
	// then the volumes with --wipe, which removes their LVs.
	run("umount", "/mnt/o", "/mnt/c", "/mnt/o2")
	ok(origin, "snapshot-delete", "--name", "s1")
	ok(origin, "snapshot-delete", "--name", "s1") // done is done
	ok(blk, "snapshot-delete", "--name", "fill")
	ok(thin, "snapshot-delete", "--name", "t1")
	for _, v := range []volume{clone, thinClone, origin, blk, thin} {
		ok(v, "unprepare", "--wipe")
	}
	run("lvremove", "-q", "-y", "vg0/pool")

	// A raw volume on an LV of the operator's: its snapshot is an LVM
	// snapshot of that LV (tagged ours, killed after each step), its clone
	// a new LV with the old content; deleting the volume leaves the
	// operator's LV where it was. A raw volume on a disk is refused.
	run("lvcreate", "-q", "-y", "-n", "oplv", "-L", "16M", "vg0")
	rawU := uuid.NewString()
	onLV := volume{"snap-raw", rawU, fmt.Sprintf(`{"name":"snap-raw","uuid":%q,"rawBlockDevice":{"devicePath":"/dev/vg0/oplv"}}`, rawU)}
	ok(onLV, "prepare")
	run("mkdir", "-p", "/mnt/r", "/mnt/rc")
	run("mount", "/dev/vg0/oplv", "/mnt/r")
	write("/mnt/r", "raw before")
	r1 := crashEach(onLV, []string{"snapshot-recorded", "snapshot-lv-created"}, "snapshot", "--name", "r1", "--size", "8Mi")
	assert.Equal(t, "lvm-thick", r1["method"])
	assert.Equal(t, float64(8<<20), r1["cowSize"])
	assert.Regexp(t, `(?m)^\s*svsnap-`+rawU[:8]+`-r1\s+salt-volumes.io/uuid=`+rawU+`/snapshot=r1\s+oplv\s*$`, lvs(), "a snapshot LV of the operator's LV, tagged as ours")
	write("/mnt/r", "raw after")
	rawClone := newVol("snap-raw-c", `{"vgName":"vg0","size":"16Mi"}`, fmt.Sprintf(`,"source":{"volumeUUID":%q,"snapshot":"r1"}`, rawU))
	ok(rawClone, "prepare")
	run("mount", "/dev/disk/by-uuid/"+rawClone.uuid, "/mnt/rc")
	assert.Equal(t, "raw before", run("cat", "/mnt/rc/data"), "the clone of the operator's LV holds the snapshot's content")
	assert.Equal(t, "raw after", run("cat", "/mnt/r/data"))
	assert.NotEqual(t, run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/oplv"), run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/snap-raw-c"), "both mounted at once, each with its UUID")
	run("umount", "/mnt/rc", "/mnt/r")
	out, err = exe(onLV, nil, "unprepare")
	require.Error(t, err, out)
	assert.Contains(t, out, "has snapshots (r1)")
	ok(onLV, "snapshot-delete", "--name", "r1")
	// --wipe zeroes the operator's LV (the volumes through serve later
	// get these extents, and refuse a signature left on them) and leaves
	// it where it was.
	ok(onLV, "unprepare", "--wipe")
	ok(rawClone, "unprepare", "--wipe")
	assert.Regexp(t, `(?m)^\s*oplv\s*$`, lvs(), "the operator's LV stays, untagged, its snapshot gone")
	sig, _ := g.Run("blkid", "-p", "-o", "value", "-s", "TYPE", "/dev/vg0/oplv") // exit 2: nothing found
	assert.Empty(t, strings.TrimSpace(sig), "wiped")
	run("lvremove", "-q", "-y", "vg0/oplv")
	run("truncate", "-s", "16M", "/root/disk.img")
	loop := run("losetup", "-f", "--show", "/root/disk.img")
	onDisk := volume{"snap-disk", uuid.NewString(), ""}
	onDisk.spec = fmt.Sprintf(`{"name":"snap-disk","uuid":%q,"rawBlockDevice":{"devicePath":%q}}`, onDisk.uuid, loop)
	ok(onDisk, "prepare")
	out, err = exe(onDisk, nil, "snapshot", "--name", "d1")
	require.Error(t, err, out)
	assert.Contains(t, err.Error(), "exit status 3", "refused")
	assert.Contains(t, out, "not an LVM logical volume: there is nothing on this node to take a snapshot of it with")
	assert.Equal(t, "[]", fmt.Sprint(snapshots(onDisk)), "nothing recorded")
	ok(onDisk, "unprepare")
	run("losetup", "-d", loop)
	run("rm", "/root/disk.img")
	assert.Regexp(t, `^\s*lv0\s*$`, lvs(), "vg0 as before: the operator's LV only")
	assert.Equal(t, "[]", fmt.Sprint(snapshots(origin)))
}

// lvmRestores: restores in place of LVM volumes with the node's binary on
// the booted guest (LVM's merge, device-mapper, udev). A thick snapshot
// merges into its volume and is used up; a thin one is kept under its
// name; a run killed after every step converges when run again; a volume
// mounted in another mount namespace and an overflowed thick snapshot are
// refused with nothing changed. Small LVs and one filesystem: every
// minute here is CI's. All of it is removed again: vg0 is as before.
func lvmRestores(t *testing.T, g *guest.Guest, run func(...string) string) {
	started := time.Now()
	defer func() {
		t.Logf("LVM restores in place with the node's binary: %s", time.Since(started).Round(time.Second))
	}()
	type volume struct{ name, uuid, spec string }
	newVol := func(name, lvm string) volume {
		u := uuid.NewString()
		return volume{name, u, fmt.Sprintf(`{"name":%q,"uuid":%q,"lvmLogicalVolume":%s}`, name, u, lvm)}
	}
	exe := func(v volume, env []string, args ...string) (string, error) {
		cmd := append(append([]string{"env"}, env...), append([]string{"salt-volume-exec"}, args...)...)
		return g.RunInput([]byte(v.spec), append(cmd, "--spec", "-")...)
	}
	ok := func(t *testing.T, v volume, args ...string) map[string]any {
		t.Helper()
		out, err := exe(v, nil, args...)
		require.NoError(t, err, "%s %v: %s", v.name, args, out)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &m), out)
		return m
	}
	// refused runs a command that must be refused (exit 3) with code.
	refused := func(t *testing.T, v volume, code string, args ...string) string {
		t.Helper()
		out, err := exe(v, nil, args...)
		require.Error(t, err, "%s %v: %s", v.name, args, out)
		assert.Contains(t, err.Error(), "exit status 3", "refused: %s", out)
		var res struct {
			Error struct{ Code, Message string }
		}
		require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		assert.Equal(t, code, res.Error.Code, res.Error.Message)
		return res.Error.Message
	}
	// crashEach kills the binary after each step in turn, then runs it to
	// the end: every step must leave something the next run finishes.
	crashEach := func(t *testing.T, v volume, steps []string, args ...string) map[string]any {
		t.Helper()
		for _, st := range steps {
			out, err := exe(v, []string{"SALT_VOLUMES_CRASH_AFTER=" + st}, args...)
			require.Error(t, err, "%s: killed after %s: %s", v.name, st, out)
			assert.Regexp(t, `exit status (137|255)`, err.Error(), "%s: killed after %s, not failed: %s", v.name, st, out)
		}
		return ok(t, v, args...)
	}
	lvsOf := func(args ...string) string { return run(append([]string{"lvs", "--noheadings"}, args...)...) }
	snapshots := func(t *testing.T, v volume) map[string]map[string]any {
		t.Helper()
		var res struct{ Snapshots []map[string]any }
		out, err := exe(v, nil, "snapshots")
		require.NoError(t, err, out)
		require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		by := map[string]map[string]any{}
		for _, s := range res.Snapshots {
			by[s["name"].(string)] = s
		}
		return by
	}
	byUUID := func(u string) string {
		run("udevadm", "settle")
		return run("readlink", "-f", "/dev/disk/by-uuid/"+u)
	}
	write := func(dir, text string) {
		require.NoError(t, g.Write(dir+"/data", []byte(text), 0o644))
		run("sync")
	}
	read := func(v volume) string {
		run("mount", "/dev/disk/by-uuid/"+v.uuid, "/mnt/rs")
		defer run("umount", "/mnt/rs")
		return run("cat", "/mnt/rs/data")
	}
	// unchanged: the volume's LV as before a refused restore: active, the
	// same LVM UUID, no restore record, no copy of a snapshot.
	unchanged := func(t *testing.T, v volume, lvUUID string) {
		t.Helper()
		assert.Equal(t, "active", lvsOf("-o", "lv_active", "vg0/"+v.name))
		assert.Equal(t, lvUUID, lvsOf("-o", "lv_uuid", "vg0/"+v.name))
		assert.Empty(t, run("ls", "-A", "/var/lib/salt-volumes/restores"), "no restore record")
		assert.NotContains(t, lvsOf("-a", "-o", "lv_name", "vg0"), "svkeep-", "no copy of a snapshot left")
	}
	run("mkdir", "-p", "/mnt/rs", "/mnt/rsns", "/var/lib/salt-volumes/restores")

	// Thick: a 16Mi ext4 LV, written, snapshotted with 8Mi of
	// copy-on-write space, written again.
	thick := newVol("rs-thick", `{"vgName":"vg0","size":"16Mi","wipeSignatures":true}`)
	ok(t, thick, "prepare")
	thickLV := lvsOf("-o", "lv_uuid", "vg0/rs-thick")
	run("mount", "/dev/vg0/rs-thick", "/mnt/rs")
	write("/mnt/rs", "before")
	ok(t, thick, "snapshot", "--name", "s1", "--size", "8Mi")
	write("/mnt/rs", "after")
	run("umount", "/mnt/rs")

	t.Run("refused while mounted in another mount namespace", func(t *testing.T) {
		// A mount only a private mount namespace has (a container's, a
		// pod's): the node's own mount table does not show it.
		// setsid: out of the ssh session's way; the same pid throughout
		// (unshare and sh exec, sleep holds the namespace).
		pid := run("sh", "-c", `setsid unshare -m --propagation private sh -c 'mount /dev/vg0/rs-thick /mnt/rsns && touch /run/rs-ns && exec sleep 300' </dev/null >/dev/null 2>&1 & echo $!`)
		defer func() {
			_, _ = g.Run("kill", pid)
			_, _ = g.Run("sh", "-c", `while kill -0 `+pid+` 2>/dev/null; do sleep 0.1; done; rm -f /run/rs-ns
				for i in $(seq 100); do [ -z "$(lvs --noheadings -o lv_device_open vg0/rs-thick | tr -d ' ')" ] && exit 0; sleep 0.2; done`)
		}()
		run("sh", "-c", `for i in $(seq 100); do [ -e /run/rs-ns ] && exit 0; sleep 0.1; done; exit 1`)
		assert.Empty(t, run("sh", "-c", "findmnt -rno TARGET /mnt/rsns || true"), "not mounted in the node's own namespace")
		msg := refused(t, thick, "in_use", "snapshot-restore", "--name", "s1")
		assert.Contains(t, msg, "mounted on /mnt/rsns (in the mount namespace of pid", "names the mount and its namespace")
		assert.Contains(t, msg, "nothing was changed")
		unchanged(t, thick, thickLV)
		assert.Contains(t, snapshots(t, thick), "s1", "the snapshot stays")
	})

	t.Run("thick: killed after every step, merged and used up", func(t *testing.T) {
		res := crashEach(t, thick, []string{"restore-recorded", "restore-merging", "restore-deactivated", "restore-merge-started",
			"restore-activated", "restore-merged", "restore-snapshot-consumed"}, "snapshot-restore", "--name", "s1")
		t.Logf("thick restore: took %v (last run), sameDevice %v, warnings %v", res["took"], res["sameDevice"], res["warnings"])
		assert.Equal(t, "lvm-thick", res["method"])
		assert.Equal(t, true, res["snapshotConsumed"], "a thick snapshot merges and is gone: said so")
		assert.Equal(t, "s1", res["finished"], "the last run finished what the killed ones began")
		vol, _ := res["volume"].(map[string]any)
		assert.Equal(t, "/dev/disk/by-uuid/"+thick.uuid, vol["persistentPath"])
		assert.Equal(t, thickLV, lvsOf("-o", "lv_uuid", "vg0/rs-thick"), "the same LV (LVM UUID)")
		assert.Equal(t, thick.uuid, run("blkid", "-o", "value", "-s", "UUID", "/dev/vg0/rs-thick"), "the volume's filesystem UUID")
		assert.Equal(t, run("readlink", "-f", "/dev/vg0/rs-thick"), byUUID(thick.uuid), "its persistent path names it")
		assert.NotContains(t, lvsOf("-a", "-o", "lv_name", "vg0"), "svsnap-"+thick.uuid[:8], "the snapshot's LV merged away")
		assert.Empty(t, snapshots(t, thick), "its record gone")
		assert.Empty(t, run("ls", "-A", "/var/lib/salt-volumes/restores"), "no restore record left")
		assert.Equal(t, "before", read(thick), "the snapshot's data; what was written after it is gone")
	})

	t.Run("an overflowed thick snapshot is refused", func(t *testing.T) {
		ok(t, thick, "snapshot", "--name", "s2", "--size", "4Mi")
		// 6Mi written through the origin overflows 4Mi of copy-on-write
		// space (the filesystem is not needed again).
		run("dd", "if=/dev/urandom", "of=/dev/vg0/rs-thick", "bs=64K", "count=96", "seek=128", "oflag=direct", "status=none")
		sum := run("sha256sum", "/dev/vg0/rs-thick")
		msg := refused(t, thick, "snapshot_invalid", "snapshot-restore", "--name", "s2")
		assert.Contains(t, msg, "overflowed")
		assert.Contains(t, msg, "delete the snapshot")
		unchanged(t, thick, thickLV)
		assert.Equal(t, sum, run("sha256sum", "/dev/vg0/rs-thick"), "the volume's bytes unchanged")
		ok(t, thick, "snapshot-delete", "--name", "s2")
	})
	t.Run("thick: a sibling snapshot too small for the merge is refused, then kept", func(t *testing.T) {
		// s3 holds 5Mi of changed blocks; s4, taken after the first 3Mi,
		// 2Mi of its 4Mi: merging s3 would copy 5Mi into s4 first.
		ok(t, thick, "snapshot", "--name", "s3", "--size", "8Mi")
		run("dd", "if=/dev/urandom", "of=/dev/vg0/rs-thick", "bs=64K", "count=48", "oflag=direct", "status=none")
		ok(t, thick, "snapshot", "--name", "s4", "--size", "4Mi")
		run("dd", "if=/dev/urandom", "of=/dev/vg0/rs-thick", "bs=64K", "count=32", "seek=64", "oflag=direct", "status=none")
		s4LV := "vg0/svsnap-" + thick.uuid[:8] + "-s4"
		sum := run("sha256sum", "/dev/vg0/rs-thick")
		msg := refused(t, thick, "cow_too_small", "snapshot-restore", "--name", "s3")
		assert.Contains(t, msg, s4LV)
		assert.Contains(t, msg, "lvextend -L +")
		assert.Contains(t, msg, "nothing was changed")
		unchanged(t, thick, thickLV)
		assert.Equal(t, sum, run("sha256sum", "/dev/vg0/rs-thick"), "the volume's bytes unchanged")
		run("lvextend", "-q", "-L", "+4M", s4LV)
		out, stderr, err := g.RunInputStderr([]byte(thick.spec), "salt-volume-exec", "snapshot-restore", "--name", "s3", "--spec", "-")
		require.NoError(t, err, out)
		var res map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		assert.Equal(t, true, res["snapshotConsumed"])
		// The merge told its bytes: s3's changed blocks (5Mi of its 8Mi
		// LV, so about 5Mi), from none to all.
		var merged [][2]int64
		for _, l := range strings.Split(stderr, "\n") {
			var m struct {
				Step        string
				Done, Total int64
			}
			if json.Unmarshal([]byte(l), &m) == nil && m.Step == "merging" {
				merged = append(merged, [2]int64{m.Done, m.Total})
			}
		}
		if assert.GreaterOrEqual(t, len(merged), 2, "the merge's start and end: %s", stderr) {
			total := merged[0][1]
			assert.Equal(t, [2]int64{0, total}, merged[0])
			assert.Equal(t, [2]int64{total, total}, merged[len(merged)-1])
			assert.InDelta(t, 5<<20, total, 2<<20, "about what s3 kept")
		}
		assert.NotEqual(t, byte('I'), lvsOf("-o", "lv_attr", s4LV)[4], "s4 survived the merge (not invalid)")
		s4 := snapshots(t, thick)["s4"]
		require.NotNil(t, s4)
		assert.Nil(t, s4["lost"], "s4 is not lost")
		ok(t, thick, "snapshot-delete", "--name", "s4")
	})

	t.Run("thick: the snapshot removed by hand before its merge: rolled back, not restored", func(t *testing.T) {
		ok(t, thick, "snapshot", "--name", "s5", "--size", "4Mi")
		out, err := exe(thick, []string{"SALT_VOLUMES_CRASH_AFTER=restore-deactivated"}, "snapshot-restore", "--name", "s5")
		require.Error(t, err, out)
		run("lvremove", "-q", "-y", "vg0/svsnap-"+thick.uuid[:8]+"-s5")
		out, err = exe(thick, nil, "snapshot-restore", "--name", "s5")
		require.Error(t, err, out)
		assert.Contains(t, err.Error(), "exit status 1", out)
		assert.Contains(t, out, `"code":"snapshot_missing"`)
		assert.Contains(t, out, "nothing was merged")
		assert.Contains(t, out, "rolled back")
		assert.NotContains(t, out, `"snapshotConsumed"`, "never reported restored")
		unchanged(t, thick, thickLV)
		ok(t, thick, "snapshot-delete", "--name", "s5")
	})
	_, _ = g.Run("umount", "/mnt/rs")
	ok(t, thick, "snapshot-delete", "--name", "s1") // gone already, if restored: done is done
	ok(t, thick, "unprepare", "--wipe")

	// Thin: a 16Mi ext4 thin LV in a pool of the operator's, two
	// snapshots.
	run("lvcreate", "-q", "-y", "--type", "thin-pool", "-L", "24M", "-n", "rspool", "vg0")
	thin := newVol("rs-thin", `{"vgName":"vg0","size":"16Mi","thinPool":"rspool"}`)
	ok(t, thin, "prepare")
	t.Run("thin: killed after every step, the snapshot kept", func(t *testing.T) {
		thinLV := lvsOf("-o", "lv_uuid", "vg0/rs-thin")
		run("mount", "/dev/vg0/rs-thin", "/mnt/rs")
		write("/mnt/rs", "thin before")
		ok(t, thin, "snapshot", "--name", "t1")
		ok(t, thin, "snapshot", "--name", "t2")
		write("/mnt/rs", "thin after")
		run("umount", "/mnt/rs")
		t1 := snapshots(t, thin)["t1"]
		require.NotNil(t, t1)
		t1LV := "vg0/svsnap-" + thin.uuid[:8] + "-t1"
		res := crashEach(t, thin, []string{"restore-recorded", "restore-keep-created", "restore-kept", "restore-merging",
			"restore-deactivated", "restore-merge-started", "restore-merged", "restore-activated", "restore-renamed"},
			"snapshot-restore", "--name", "t1")
		t.Logf("thin restore: took %v (last run), sameDevice %v", res["took"], res["sameDevice"])
		assert.Equal(t, "lvm-thin", res["method"])
		assert.Equal(t, false, res["snapshotConsumed"], "a thin snapshot is kept")
		assert.Contains(t, fmt.Sprint(res["warnings"]), "snapshots t2 of rs-thin", "the volume's other thin snapshots: unlinked, said so")
		assert.Equal(t, thinLV, lvsOf("-o", "lv_uuid", "vg0/rs-thin"), "the same LV (LVM UUID)")
		assert.Equal(t, run("readlink", "-f", "/dev/vg0/rs-thin"), byUUID(thin.uuid), "its persistent path names it")
		assert.Equal(t, "thin before", read(thin), "the snapshot's data")
		after := snapshots(t, thin)["t1"]
		require.NotNil(t, after, "the snapshot stays")
		assert.Equal(t, t1["takenAt"], after["takenAt"], "the same snapshot: taken when it was")
		assert.Equal(t, t1LV, after["lv"], "under its LV name")
		assert.NotEqual(t, t1["lvUUID"], after["lvUUID"], "its LV is the copy kept of it")
		assert.Equal(t, after["lvUUID"], lvsOf("-o", "lv_uuid", t1LV), "the record names the LV that has the name")
		assert.Nil(t, after["lost"])
		assert.NotContains(t, lvsOf("-a", "-o", "lv_name", "vg0"), "svkeep-", "the copy took the snapshot's name")
		assert.Empty(t, run("ls", "-A", "/var/lib/salt-volumes/restores"), "no restore record left")
		assert.Empty(t, lvsOf("-o", "origin", "vg0/svsnap-"+thin.uuid[:8]+"-t2"), "LVM unlinked t2 from the volume")
		msg := refused(t, thin, "snapshot_unlinked", "snapshot-restore", "--name", "t2")
		assert.Contains(t, msg, "clone it instead")

		// Written since: the kept snapshot still holds the snapshot's
		// data, and is restored again (no crash this time). Its own LV
		// mounted: refused; only active: deactivated before the merge.
		run("mount", "/dev/vg0/rs-thin", "/mnt/rs")
		write("/mnt/rs", "thin later")
		run("umount", "/mnt/rs")
		run("lvchange", "-q", "-ay", "-K", t1LV)
		run("mount", "-o", "ro", "/dev/"+t1LV, "/mnt/rsns")
		msg = refused(t, thin, "in_use", "snapshot-restore", "--name", "t1")
		assert.Contains(t, msg, "mounted on /mnt/rsns", "the snapshot's own LV counts")
		unchanged(t, thin, thinLV)
		run("umount", "/mnt/rsns")
		again := ok(t, thin, "snapshot-restore", "--name", "t1")
		assert.Equal(t, false, again["snapshotConsumed"])
		assert.Equal(t, "thin before", read(thin), "restored again from the kept snapshot")
		assert.Contains(t, snapshots(t, thin), "t1")
	})
	_, _ = g.Run("umount", "/mnt/rs")
	for _, n := range []string{"t1", "t2"} {
		ok(t, thin, "snapshot-delete", "--name", n)
	}
	ok(t, thin, "unprepare", "--wipe")
	run("lvremove", "-q", "-y", "vg0/rspool")
	run("rmdir", "/mnt/rs", "/mnt/rsns")
	assert.Regexp(t, `^\s*lv0\s*$`, lvsOf("-o", "lv_name", "vg0"), "vg0 as before: the operator's LV only")
}
