package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/devlinks"
	"github.com/salt-volumes/salt-volumes/internal/filecopy"
	"github.com/salt-volumes/salt-volumes/internal/lvm"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// LVM snapshots: an LV of their own beside the volume's, named
// svsnap-<the volume UUID's first 8>-<name> and tagged with the volume's
// UUID and the snapshot's name (the tag, not the name, makes it ours). A
// thick one sets aside copy-on-write space in the VG and is lost if that
// overflows; a thin one (of a thin LV) shares its pool's space and stays
// inactive, so that the filesystem UUID it shares with its origin never
// gets a /dev/disk/by-uuid link of its own.

// Snapshot methods of LVM volumes.
const (
	MethodLVMThick filecopy.Method = "lvm-thick"
	MethodLVMThin  filecopy.Method = "lvm-thin"
)

// fillWarnPercent: a snapshot's copy-on-write space (or a thin pool) this
// full gets a warning in every listing and beacon report.
const fillWarnPercent = 80

func snapshotLVName(volumeUUID, name string) string { return "svsnap-" + volumeUUID[:8] + "-" + name }

func snapshotTag(volumeUUID, name string) string {
	return spec.LVMTagPrefix + volumeUUID + "/snapshot=" + name
}

func splitLV(vglv string) (vg, lv string) {
	vg, lv, _ = strings.Cut(vglv, "/")
	return vg, lv
}

// takeLVMSnapshot snapshots the volume's LV; the caller holds its lock.
// The record is written before lvcreate, so that a run killed after it
// finds the LV by name and adopts it by its tag.
func (e *Engine) takeLVMSnapshot(ctx context.Context, rec *nodestate.Record, name string, opts SnapshotOptions) (*Snapshot, error) {
	s := rec.Spec
	o := opFor(e, s)
	recPath, _ := e.snapshotPaths(s.UUID, name)
	old, err := readSnapshot(recPath)
	if err == nil {
		if err := checkOwner(old, opts.Owner, s.Name); err != nil {
			return nil, err
		}
	}
	switch {
	case err == nil && old.Phase == SnapshotTaken:
		lv, err := snapshotLVOf(ctx, old)
		if err != nil {
			return nil, err
		}
		if lv == nil {
			return nil, failed("snapshot_missing", nil, "snapshot %s of %s: its record is here, its logical volume %s is gone: delete the snapshot and take it again", name, s.Name, old.LV)
		}
		e.lvmFill([]*Snapshot{old})
		return old, nil
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return nil, failed("state", err, "reading snapshot %s of %s", name, s.Name)
	}
	origin, err := snapshotOrigin(ctx, rec)
	if err != nil {
		return nil, err
	}
	vg := origin.VG
	lvName, tag := snapshotLVName(s.UUID, name), snapshotTag(s.UUID, name)
	snap := &Snapshot{Version: 1, Name: name, Volume: s.Name, VolumeUUID: s.UUID, Phase: SnapshotTaking,
		Mode: s.Mode, FSType: s.FSType, LV: vg + "/" + lvName, Size: origin.Size, Method: MethodLVMThick, Owner: opts.Owner}
	thin := origin.Pool != ""
	if thin {
		snap.Method = MethodLVMThin
		if opts.COWSize > 0 {
			return nil, invalid("size_not_taken", "size: %s/%s is a thin LV: its snapshots share thin pool %s/%s and set no space aside: leave the size out", vg, origin.Name, vg, origin.Pool)
		}
	}
	if old != nil {
		// A run killed after its record: what it found then stands.
		snap.Frozen, snap.COWSize = old.Frozen, old.COWSize
	}
	lv, err := lvm.GetLV(ctx, vg, lvName)
	if err != nil {
		return nil, failed("lvm", err, "reading volume group %s", vg)
	}
	if lv != nil && !lv.HasTag(tag) {
		return nil, refused("lv_not_ours", "logical volume %s/%s exists and is not snapshot %s of %s (it lacks the tag %s): not touching it; take the snapshot under another name", vg, lvName, name, s.Name, tag)
	}
	start := time.Now()
	takenAt := start
	if lv == nil {
		if !thin {
			cow, err := e.cowSize(ctx, vg, origin, opts.COWSize)
			if err != nil {
				return nil, err
			}
			snap.COWSize = cow
		}
		if _, err := e.State.SnapshotDir(s.UUID); err != nil {
			return nil, failed("state", err, "the snapshots of %s", s.Name)
		}
		// lvcreate suspends the origin's device-mapper device for the
		// moment it takes, which freezes a filesystem mounted on it.
		if dev := deviceOf(rec); dev != "" {
			if u, err := blockdev.UsageOf(dev); err == nil && len(u.Mountpoints) > 0 {
				snap.Frozen = true
			}
		}
		if err := writeSnapshot(recPath, snap); err != nil {
			return nil, failed("state", err, "recording snapshot %s", name)
		}
		o.step("snapshot-recorded", "snapshot", name, "lv", snap.LV)
		if err := lvm.Snapshot(ctx, vg, origin.Name, lvName, snap.COWSize, tag); err != nil {
			return nil, failed("lvcreate", err, "taking snapshot %s of %s", name, s.Name)
		}
		o.step("snapshot-lv-created", "lv", snap.LV, "method", string(snap.Method))
		if lv, err = lvm.GetLV(ctx, vg, lvName); err != nil || lv == nil {
			return nil, failed("lvm", err, "reading snapshot %s back", snap.LV)
		}
	} else {
		// Adopted after a crash: the LV was made by the run killed, and
		// then the data froze; lvs gives a thick snapshot's COW size.
		if !thin && snap.COWSize == 0 {
			snap.COWSize = lv.Size
		}
		if !lv.Created.IsZero() {
			takenAt = lv.Created
		}
	}
	snap.LVUUID, snap.Allocated = lv.UUID, snap.COWSize
	snap.Took = time.Since(start).Round(time.Millisecond).String()
	snap.Phase, snap.TakenAt = SnapshotTaken, takenAt.UTC()
	if err := writeSnapshot(recPath, snap); err != nil {
		return nil, failed("state", err, "recording snapshot %s", name)
	}
	o.step("snapshot-taken", "snapshot", name, "method", string(snap.Method))
	e.lvmFill([]*Snapshot{snap})
	return snap, nil
}

// snapshotOrigin is the LV a volume's LVM snapshots are taken of: the one
// salt-volumes created for an lvmLogicalVolume, checked by its recorded
// LVM UUID, or the operator's LV a rawBlockDevice volume is on, found by
// the device-mapper UUID of the device it was prepared on. A raw volume
// on anything else has nothing to take a snapshot with.
func snapshotOrigin(ctx context.Context, rec *nodestate.Record) (*lvm.LV, error) {
	s := rec.Spec
	if l := s.LVMLogicalVolume; l != nil {
		origin, err := lvm.GetLV(ctx, l.VGName, s.Name)
		switch {
		case err != nil:
			return nil, failed("lvm", err, "reading logical volume %s/%s", l.VGName, s.Name)
		case origin == nil || origin.UUID != rec.LVUUID:
			return nil, failed("lv_missing", nil, "logical volume %s/%s (LVM UUID %s), which salt-volumes created for volume %s, is not on this node: nothing to snapshot", l.VGName, s.Name, rec.LVUUID, s.Name)
		}
		return origin, nil
	}
	dev := deviceOf(rec)
	if dev == "" {
		return nil, failed("device_missing", nil, "volume %s: its device %s (%s when prepared) is not on this node: nothing to snapshot", s.Name, s.RawBlockDevice.DevicePath, rec.Device)
	}
	dmu := dmUUID(dev)
	if !strings.HasPrefix(dmu, "LVM-") {
		return nil, refused("snapshot_unsupported", "volume %s is on %s (/dev/%s), a disk or partition, not an LVM logical volume: there is nothing on this node to take a snapshot of it with (sparse and LVM volumes, and raw volumes on an LV, have snapshots)", s.Name, s.RawBlockDevice.DevicePath, dev)
	}
	lvs, err := lvm.List(ctx)
	if err != nil {
		return nil, failed("lvm", err, "reading the logical volumes")
	}
	for i := range lvs {
		lv := &lvs[i]
		if lv.DMUUID() != dmu {
			continue
		}
		if lv.Origin != "" && lv.Pool == "" {
			return nil, refused("snapshot_unsupported", "volume %s is on %s/%s, a thick LVM snapshot: LVM takes no snapshot of a thick snapshot; take it of %s/%s instead", s.Name, lv.VG, lv.Name, lv.VG, lv.Origin)
		}
		return lv, nil
	}
	return nil, failed("lv_missing", nil, "volume %s is on /dev/%s, device-mapper UUID %s, and LVM lists no logical volume with it: nothing to snapshot", s.Name, dev, dmu)
}

// cowSize is a thick snapshot's copy-on-write space: asked, or a quarter of
// the origin, in whole extents, refused if the VG lacks it.
func (e *Engine) cowSize(ctx context.Context, vg string, origin *lvm.LV, asked int64) (int64, error) {
	g, err := lvm.GetVG(ctx, vg)
	if err != nil {
		return 0, failed("lvm", err, "reading volume group %s", vg)
	}
	cow := asked
	if cow <= 0 {
		cow = origin.Size / 4
	}
	cow = max(roundUp(cow, g.ExtentSize), g.ExtentSize)
	if cow > g.Free {
		return 0, invalid("size_too_large", "size: a thick snapshot of %s/%s sets %s aside for the blocks that change while it lives, and volume group %s has %s free: give a smaller size, or extend the VG (vgextend)",
			vg, origin.Name, spec.FormatSize(cow), vg, spec.FormatSize(g.Free))
	}
	return cow, nil
}

// snapshotLVOf finds a snapshot's LV by its name, checked by our tag and
// the recorded LVM UUID; nil if it is gone.
func snapshotLVOf(ctx context.Context, sn *Snapshot) (*lvm.LV, error) {
	vg, name := splitLV(sn.LV)
	lv, err := lvm.GetLV(ctx, vg, name)
	switch {
	case errors.Is(err, lvm.ErrNoVG):
		return nil, nil
	case err != nil:
		return nil, failed("lvm", err, "reading snapshot %s's logical volume %s", sn.Name, sn.LV)
	case lv == nil:
		return nil, nil
	case !lv.HasTag(snapshotTag(sn.VolumeUUID, sn.Name)) || (sn.LVUUID != "" && lv.UUID != sn.LVUUID):
		return nil, refused("lv_not_ours", "logical volume %s is not snapshot %s of %s any more (its tag or LVM UUID changed): not touching it", sn.LV, sn.Name, sn.Volume)
	}
	return lv, nil
}

// deleteLVMSnapshot removes the snapshot's LV (by its LVM UUID) and then
// its record; either may be gone already. The caller holds the lock.
func (e *Engine) deleteLVMSnapshot(ctx context.Context, s *spec.Spec, sn *Snapshot, recPath string) error {
	lv, err := snapshotLVOf(ctx, sn)
	if err != nil {
		return err
	}
	if lv != nil {
		vg, _ := splitLV(sn.LV)
		if err := lvm.Remove(ctx, vg, lv.UUID); err != nil {
			return failed("lvremove", err, "removing snapshot %s (%s)", sn.Name, sn.LV)
		}
		opFor(e, s).step("snapshot-lv-removed", "lv", sn.LV)
	}
	if err := os.Remove(recPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return failed("snapshot_delete", err, "removing %s", recPath)
	}
	_ = os.Remove(e.snapshotDir(s.UUID))
	return nil
}

// lvmFill reads how full the LVM snapshots among snaps are (one lvs for
// all) and warns of those close to overflowing: a thick snapshot's
// copy-on-write space, a thin one's pool.
func (e *Engine) lvmFill(snaps []*Snapshot) {
	var any bool
	for _, sn := range snaps {
		any = any || sn.LV != ""
	}
	if !any {
		return
	}
	if lvs, ok := e.listLVs("the LVM snapshots' fill levels"); ok {
		fillFrom(snaps, lvs)
		e.restoringNotLost(snaps)
	}
}

// restoringNotLost: a snapshot its volume's unfinished LVM restore merges
// is hidden (lvs without -a) or gone into the volume: being restored, not
// lost.
func (e *Engine) restoringNotLost(snaps []*Snapshot) {
	for _, sn := range snaps {
		if !sn.Lost || sn.LV == "" {
			continue
		}
		rr, err := readRestore(e.lvmRestorePath(sn.VolumeUUID))
		if err != nil || rr.Snapshot != sn.Name {
			continue
		}
		sn.Lost = false
		sn.Warning = "being restored into its volume (the restore's phase " + rr.Phase + "): LVM merges its logical volume " + sn.LV + " into the volume's; run the restore again to finish it"
	}
}

// listLVs runs one lvs; what says what for, in the warning if it fails.
func (e *Engine) listLVs(what string) ([]lvm.LV, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lvs, err := lvm.List(ctx)
	if err != nil {
		e.Log.Warn("reading "+what, "error", err)
		return nil, false
	}
	return lvs, true
}

// fillFrom sets the fill levels and warnings of the LVM snapshots among
// snaps from lvs.
func fillFrom(snaps []*Snapshot, lvs []lvm.LV) {
	byName := map[string]*lvm.LV{}
	vgs := map[string]bool{}
	for i := range lvs {
		byName[lvs[i].VG+"/"+lvs[i].Name] = &lvs[i]
		vgs[lvs[i].VG] = true
	}
	for _, sn := range snaps {
		if sn.LV == "" || sn.Phase != SnapshotTaken {
			continue
		}
		lv := byName[sn.LV]
		if vg, _ := splitLV(sn.LV); lv == nil && !vgs[vg] {
			// The whole VG is missing (a PV late at boot, a SAN path
			// down): nothing is known of the snapshot, lost or not.
			sn.Warning = "its volume group " + vg + " is not visible to LVM now: the snapshot is neither read nor lost until it is"
			continue
		}
		if lv == nil || (sn.LVUUID != "" && lv.UUID != sn.LVUUID) {
			sn.Warning, sn.Lost = "lost: its logical volume "+sn.LV+" is gone: delete the snapshot", true
			continue
		}
		if lv.Pool == "" {
			if lv.Invalid {
				sn.Warning, sn.Lost = "overflowed: its copy-on-write space filled up and LVM dropped the snapshot (its data is lost): delete it", true
				continue
			}
			if lv.DataPercent >= 0 {
				p := lv.DataPercent
				sn.DataPercent = &p
				sn.Warning = fillWarning(lv.VG+"/"+lv.Name, p, -1)
			}
			continue
		}
		pool := byName[lv.VG+"/"+lv.Pool]
		if pool == nil || pool.DataPercent < 0 {
			continue
		}
		d, m := pool.DataPercent, pool.MetadataPercent
		sn.DataPercent = &d
		if m >= 0 {
			sn.MetadataPercent = &m
		}
		sn.Warning = fillWarning(pool.VG+"/"+pool.Name, d, m)
	}
}

// fillWarning says how close to full a thick snapshot's copy-on-write
// space (meta < 0) or a thin pool (data and metadata) is, by the step
// crossed (80, 90, 95 %), not the exact level, so that the beacon reports a
// change once a step; "" below 80 %. The two fill up differently: a thick
// snapshot that overflows is dropped, its origin unharmed; a thin pool
// that fills stops taking writes, and every thin LV in it, the volume
// included, errors them.
func fillWarning(lv string, data, meta float64) string {
	step := func(p float64) float64 {
		for _, s := range []float64{95, 90, fillWarnPercent} {
			if p >= s {
				return s
			}
		}
		return 0
	}
	if meta < 0 {
		if s := step(data); s > 0 {
			return fmt.Sprintf("its copy-on-write space is over %g%% full: at 100%% LVM drops the snapshot and its data is lost; extend it (lvextend -L +SIZE %s) or delete the snapshot", s, lv)
		}
		return ""
	}
	var parts []string
	if s := step(data); s > 0 {
		parts = append(parts, fmt.Sprintf("data over %g%%", s))
	}
	if s := step(meta); s > 0 {
		parts = append(parts, fmt.Sprintf("metadata over %g%%", s))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("thin pool %s is filling (%s): when either is full the pool stops taking writes and every thin LV in it, this volume included, errors them; extend the pool (lvextend -L +SIZE %s, or --poolmetadatasize +SIZE for metadata) or delete snapshots", lv, strings.Join(parts, ", "), lv)
}

// thinPools reads how full the thin pools are that hold LVs of ours
// (volumes, snapshots, clones): the node's report carries them.
func thinPools(lvs []lvm.LV) []saltvolumes.ThinPool {
	byName := map[string]*lvm.LV{}
	for i := range lvs {
		byName[lvs[i].VG+"/"+lvs[i].Name] = &lvs[i]
	}
	seen := map[string]bool{}
	var out []saltvolumes.ThinPool
	for _, lv := range lvs {
		name := lv.VG + "/" + lv.Pool
		if lv.Pool == "" || seen[name] || !ourLV(&lv) {
			continue
		}
		seen[name] = true
		if p := byName[name]; p != nil && p.DataPercent >= 0 {
			out = append(out, saltvolumes.ThinPool{Name: name, DataPercent: p.DataPercent, MetadataPercent: max(p.MetadataPercent, 0)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ourLV: an LV that carries one of our tags.
func ourLV(lv *lvm.LV) bool {
	for _, t := range lv.Tags {
		if strings.HasPrefix(t, spec.LVMTagPrefix) {
			return true
		}
	}
	return false
}

// lvmSource reads the LVM snapshot a new LVM volume is cloned from and
// checks that the clone fits it.
func (e *Engine) lvmSource(s *spec.Spec) (*Snapshot, error) {
	snap, err := e.sourceSnapshot(s, "lvmLogicalVolume.size")
	if err != nil {
		return nil, err
	}
	vg, _ := splitLV(snap.LV)
	switch {
	case snap.LV == "":
		return nil, invalid("source_mismatch", "source: snapshot %s is a copy of a sparse volume's file: its clone is a sparseLoopDevice volume", snap.Name)
	case vg != s.LVMLogicalVolume.VGName:
		return nil, invalid("source_mismatch", "lvmLogicalVolume.vgName: snapshot %s is in volume group %s: its clone is made there too", snap.Name, vg)
	}
	return snap, nil
}

// createCloneLV makes a clone's LV: a thin snapshot of a thin snapshot (no
// copy, in the same pool), or a new linear LV that cloneLVContent fills
// from a thick snapshot.
func (e *Engine) createCloneLV(ctx context.Context, o *op, rec *nodestate.Record) error {
	s := o.s
	vg := s.LVMLogicalVolume.VGName
	snap, err := e.lvmSource(s)
	if err != nil {
		e.dropUnstarted(rec)
		return err
	}
	slv, err := snapshotLVOf(ctx, snap)
	switch {
	case err != nil:
		e.dropUnstarted(rec)
		return err
	case slv == nil:
		e.dropUnstarted(rec)
		return invalid("snapshot_missing", "source: snapshot %s's logical volume %s is gone: delete the snapshot", snap.Name, snap.LV)
	case slv.Invalid:
		e.dropUnstarted(rec)
		return invalid("snapshot_invalid", "source: snapshot %s overflowed (its copy-on-write space filled up and LVM dropped it): nothing to clone; delete it", snap.Name)
	}
	if snap.Method == MethodLVMThin {
		_, name := splitLV(snap.LV)
		if err := lvm.SnapshotSkipped(ctx, vg, name, s.Name, lvTag(s)); err != nil {
			return failed("lvcreate", err, "creating clone %s/%s of snapshot %s", vg, s.Name, snap.Name)
		}
		o.changed = true
		o.step("lv-created", "lv", vg+"/"+s.Name, "tag", lvTag(s), "from", snap.LV)
		return nil
	}
	g, err := lvm.GetVG(ctx, vg)
	if err != nil {
		return failed("lvm", err, "reading volume group %s", vg)
	}
	if need := roundUp(s.SizeBytes, g.ExtentSize); need > g.Free {
		e.dropUnstarted(rec)
		return invalid("size_too_large", "lvmLogicalVolume.size: %s is more than volume group %s has free (%s) for the clone: use a smaller size or extend the VG (vgextend)",
			spec.FormatSize(s.SizeBytes), vg, spec.FormatSize(g.Free))
	}
	if err := lvm.CreateSkipped(ctx, vg, s.Name, s.SizeBytes, lvTag(s)); err != nil {
		return failed("lvcreate", err, "creating logical volume %s/%s", vg, s.Name)
	}
	o.changed = true
	o.step("lv-created", "lv", vg+"/"+s.Name, "tag", lvTag(s))
	return nil
}

// A clone's LV carries its snapshot's filesystem, UUID and all, until
// newIdentity gives it the clone's own; udev, which links a UUID two
// devices claim at equal priority to whichever it saw last, would move the
// origin's /dev/disk/by-uuid link (its persistent path) to the clone
// meanwhile. So the LV is made inactive and skipped at activation (the
// boot does not activate a half-made clone), activated only once marked
// for udev to leave alone (devlinks.Hide), and shown to udev by a fresh
// activation once it has its own identity (revealClone).

// cloneUnfinished: the volume is a clone whose content is not written yet
// (by its record: a spec asked for later, an unprepare's, may lack the
// source).
func cloneUnfinished(rec *nodestate.Record) bool {
	return rec.Spec != nil && rec.Spec.Source != nil && !rec.Formatted()
}

// hideActiveClone deactivates an unfinished clone's LV found active
// without udev's mark (a run killed after revealClone, or an LV activated
// by hand): udev has seen it, and its content is about to be written
// again. Skipped at activation first, so a crash leaves nothing the boot
// activates.
func (e *Engine) hideActiveClone(ctx context.Context, o *op, rec *nodestate.Record) error {
	vg := o.s.LVMLogicalVolume.VGName
	if err := lvm.SetActivationSkip(ctx, vg, rec.LVUUID, true); err != nil {
		return failed("lvchange", err, "setting the activation skip flag of clone %s/%s", vg, o.s.Name)
	}
	if err := lvm.Deactivate(ctx, vg, rec.LVUUID); err != nil {
		return failed("lvchange", err, "deactivating clone %s/%s to hide it from udev", vg, o.s.Name)
	}
	o.step("lv-deactivated", "lv", vg+"/"+o.s.Name)
	return nil
}

// revealClone shows a clone that now has its own identity to udev: the
// activation-skip flag cleared, the LV deactivated, udev's mark removed,
// the LV activated again (device-mapper's rules take their flags from an
// activation, not from a change event). It returns the LV's device.
func (e *Engine) revealClone(ctx context.Context, o *op, rec *nodestate.Record, name string) (string, error) {
	vg := o.s.LVMLogicalVolume.VGName
	if !devlinks.UdevRunning() {
		if err := lvm.SetActivationSkip(ctx, vg, rec.LVUUID, false); err != nil {
			return "", failed("lvchange", err, "clearing the activation skip flag of clone %s/%s", vg, o.s.Name)
		}
		return name, nil
	}
	// In this order, a run killed between two steps leaves the LV either
	// skipped at activation or carrying the clone's own UUID; the next run
	// hides it and sets the flag again before it writes anything.
	if err := lvm.Deactivate(ctx, vg, rec.LVUUID); err != nil {
		return "", failed("lvchange", err, "deactivating clone %s/%s to show it to udev (is it mounted? unmount it and run prepare again)", vg, o.s.Name)
	}
	if err := devlinks.Unhide(rec.DMUUID); err != nil {
		return "", failed("udev", err, "removing udev's mark of clone %s/%s", vg, o.s.Name)
	}
	o.step("lv-deactivated", "lv", vg+"/"+o.s.Name)
	if err := lvm.SetActivationSkip(ctx, vg, rec.LVUUID, false); err != nil {
		return "", failed("lvchange", err, "clearing the activation skip flag of clone %s/%s", vg, o.s.Name)
	}
	if err := lvm.Activate(ctx, vg, rec.LVUUID); err != nil {
		return "", failed("lvchange", err, "activating clone %s/%s", vg, o.s.Name)
	}
	devlinks.Settle(ctx, e.UdevWait)
	name = dmByUUID(rec.DMUUID)
	if name == "" {
		return "", failed("lvm", nil, "clone %s/%s is active but no device-mapper device has UUID %s", vg, o.s.Name, rec.DMUUID)
	}
	o.changed = true
	o.step("clone-revealed", "lv", vg+"/"+o.s.Name)
	return name, nil
}

// cloneLVContent finishes a clone's LV until its record says it is
// written: the thick snapshot's blocks copied (again, after a crash: every
// block is overwritten), the thin clone grown to its size, then the
// filesystem's new UUID (a Block volume's identity is its LV's own UUID)
// and its growth to the LV's end.
func (e *Engine) cloneLVContent(ctx context.Context, o *op, name string) error {
	s := o.s
	snap, err := e.lvmSource(s)
	if err != nil {
		return err
	}
	slv, err := snapshotLVOf(ctx, snap)
	if err != nil {
		return err
	}
	if slv == nil {
		return failed("snapshot_missing", nil, "source: snapshot %s's logical volume %s is gone", snap.Name, snap.LV)
	}
	dev := "/dev/" + name
	if snap.Method == MethodLVMThick {
		from := dmByUUID(slv.DMUUID())
		if from == "" {
			return failed("snapshot_missing", nil, "source: snapshot %s (%s) is not active", snap.Name, snap.LV)
		}
		if err := copyDevice(ctx, "/dev/"+from, dev, snap.Size, o.progress("copying", "snapshot", snap.Name), o.progress("zeroing", "device", name)); err != nil {
			return failed("clone_copy", err, "copying snapshot %s into %s", snap.Name, dev)
		}
		o.changed = true
		o.step("cloned", "snapshot", snap.Name, "method", string(snap.Method), "bytes", snap.Size)
	} else if size, _ := blockdev.SizeOf(name); size < s.SizeBytes {
		if err := lvm.Extend(ctx, s.LVMLogicalVolume.VGName, s.Name, s.SizeBytes); err != nil {
			return failed("lvextend", err, "growing clone %s/%s to its size", s.LVMLogicalVolume.VGName, s.Name)
		}
		o.step("lv-extended", "lv", s.LVMLogicalVolume.VGName+"/"+s.Name, "size", s.SizeBytes)
	}
	if s.Mode != spec.ModeFilesystem {
		return nil
	}
	if err := e.newIdentity(ctx, o, dev, snap); err != nil {
		return err
	}
	if s.SizeBytes > snap.Size {
		return e.growFS(ctx, o, name)
	}
	return nil
}

// copyDevice copies the first n bytes of device from over device to and
// zeroes the rest of to (a new LV's extents may hold an earlier LV's data,
// which a larger clone must not hand its user), then flushes. It reports
// each part to copied and zeroed (nil: not told) and stops between
// chunks when ctx ends.
func copyDevice(ctx context.Context, from, to string, n int64, copied, zeroed filecopy.Progress) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer dst.Close()
	tell := func(p filecopy.Progress, done, total int64) {
		if p != nil {
			p(done, total)
		}
	}
	buf := make([]byte, 4<<20)
	tell(copied, 0, n)
	for off := int64(0); off < n; {
		if err := ctx.Err(); err != nil {
			return err
		}
		chunk := buf[:min(int64(len(buf)), n-off)]
		if _, err := io.ReadFull(src, chunk); err != nil {
			return fmt.Errorf("reading %s at %d: %w", from, off, err)
		}
		if _, err := dst.Write(chunk); err != nil {
			return err
		}
		off += int64(len(chunk))
		tell(copied, off, n)
	}
	size, err := dst.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if size > n {
		tell(zeroed, 0, size-n)
	}
	for off := n; off < size; off += blockdev.ZeroChunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := min(off+blockdev.ZeroChunk, size)
		if err := blockdev.ZeroOut(dst, off, end-off); err != nil {
			return err
		}
		tell(zeroed, end-n, size-n)
	}
	return dst.Sync()
}
