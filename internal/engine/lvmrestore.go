package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/lvm"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Restore in place of an LVM volume: LVM merges the snapshot's LV into the
// volume's (lvconvert --merge). The volume's LV keeps its name, its LVM
// UUID and so its device-mapper UUID, and its filesystem keeps the
// volume's UUID (the snapshot's is the same): its persistent path stays.
//
// A thick snapshot is used up by its merge: LVM removes its LV once the
// blocks are copied back, and its record goes (SnapshotConsumed). A thin
// one is kept: a thin snapshot of it (KeepLV, identical to it) is taken
// first, and takes the snapshot's LV name once the snapshot merged; the
// snapshot's record keeps its name and takenAt, with KeepLV's LVM UUID.
//
// Phases, in restores/<uuid>.json:
//
//   - recorded: the checks passed; nothing changed yet.
//   - kept (thin): KeepLV made and its LVM UUID recorded.
//   - merging: the merge is about to be asked for. The volume's LV is
//     deactivated first (LVM refuses while it is open, so a mount that
//     came after the checks stops the restore there, rolled back) — a
//     thick snapshot checked valid just before, while its origin is still
//     active (lvconvert sees an overflow only on an active snapshot); a
//     thin snapshot's own LV deactivated too (open, LVM would put the
//     merge off to an activation that then never comes) — then the merge
//     is asked for (lvconvert --merge).
//   - merge-asked: lvconvert --merge succeeded (recorded at once after
//     it; a run killed in between is told by LVM's lv_merging, or for a
//     thin snapshot its thin device id, which the volume's LV takes). A
//     thin merge is done at once; a thick one starts at the next
//     activation: the LV reads as the snapshot at once, and LVM's poller
//     copies its blocks back and then removes its LV, which this waits
//     for (failing, with the record kept, if the snapshot is invalid or
//     the merge stops moving).
//   - merged: the snapshot's LV is gone into the volume's. The LV is
//     extended to the volume's size (a thin merge leaves it the size the
//     snapshot had), the filesystem grown as a growth grows it, the link
//     checked, KeepLV renamed to the snapshot's LV name and the snapshot's
//     record updated (thick: removed); then the restore's record goes.
//   - invalid: LVM's merge of a thick snapshot stopped because the
//     snapshot is invalid (it overflowed): the kernel merges nothing from
//     it. No run finishes this; the operator does (see lvmInvalidWhy).
//
// Each run decides its next step from the record and what lvs -a shows
// (lvmRestoreNext, a pure function), so a run killed after any step is
// finished by the next. Until the merge is asked for, a restore can be
// rolled back (KeepLV removed, the volume's LV active again, the record
// removed): a run for another snapshot does that first, and so does a
// run that finds the snapshot's LV gone before its merge was asked for.
// From merge-asked on, every failure is restore_unfinished: the volume
// holds (or is taking) the snapshot's data, and the restore must be run
// again to finish it.

// Phases of an LVM volume's restore.
const (
	lvmRestoreRecorded   = "recorded"
	lvmRestoreKept       = "kept"
	lvmRestoreMerging    = "merging"
	lvmRestoreMergeAsked = "merge-asked"
	lvmRestoreMerged     = "merged"
	lvmRestoreInvalid    = "invalid"
)

// lvmSeen is what lvs -a shows of a restore's logical volumes.
type lvmSeen struct {
	// Origin: the volume's LV, by its LVM UUID.
	Origin       bool
	OriginActive bool
	// Merging: a merge into the volume's LV was asked for (lv_merging on
	// it or on the snapshot's LV): under way, or waiting for the LV's
	// next activation.
	Merging     bool
	MergeFailed bool
	// OtherMerging: another LV whose origin is the volume's (not the
	// restore's snapshot, not KeepLV) has lv_merging: a merge someone
	// else asked for (LVM sets it on a thin snapshot, not on its origin).
	OtherMerging bool
	// OriginThinID is the volume's LV's thin device id ("" if not thin).
	OriginThinID string
	// Snapshot: the snapshot's LV, by its LVM UUID (hidden while it
	// merges); SnapshotMerging its own lv_merging, SnapshotActive whether
	// it is active, SnapshotInvalid (thick, known while active) whether
	// it overflowed (lv_attr I, or data_percent 100), SnapshotPercent its
	// data_percent (-1: none reported), which falls as a thick merge
	// copies its blocks back.
	Snapshot        bool
	SnapshotMerging bool
	SnapshotActive  bool
	SnapshotInvalid bool
	SnapshotPercent float64
	// SnapshotThickSize is a thick snapshot's LV size (its copy-on-write
	// space; 0 for a thin one).
	SnapshotThickSize int64
	// Keep: KeepLV, by its recorded LVM UUID. KeepStale: no UUID recorded
	// yet, and an LV with KeepLV's name, our tag and the snapshot as its
	// origin is there (an earlier run's, maybe activated and written
	// since: removed and taken again). KeepForeign: an LV has KeepLV's
	// name and is not ours.
	Keep, KeepStale, KeepForeign bool
	// CheckedValid is this run's, not LVM's: this run saw the thick
	// snapshot valid with the volume's LV active, and then deactivated
	// the LV itself (nothing can fill the snapshot since). A run that
	// finds the LV inactive before the merge activates it to look.
	CheckedValid bool
}

// lvmStep is what a restore does next.
type lvmStep string

const (
	// lvmKeep takes KeepLV (a thin snapshot of the snapshot) and records
	// its LVM UUID.
	lvmKeep lvmStep = "keep"
	// lvmDropKeep removes a KeepLV an earlier run made but did not record
	// (by its LVM UUID), to take a fresh one.
	lvmDropKeep lvmStep = "drop-keep"
	// lvmToMerging records phase merging.
	lvmToMerging lvmStep = "to-merging"
	// lvmDeactivate deactivates the volume's LV; refused while it is open.
	lvmDeactivate lvmStep = "deactivate"
	// lvmDeactivateSnapshot deactivates a thin snapshot's LV; refused
	// while it is open.
	lvmDeactivateSnapshot lvmStep = "deactivate-snapshot"
	// lvmMerge asks LVM to merge the snapshot (lvconvert --merge) and
	// records phase merge-asked.
	lvmMerge lvmStep = "merge"
	// lvmToMergeAsked records phase merge-asked: a run was killed after
	// lvconvert --merge, before it recorded that.
	lvmToMergeAsked lvmStep = "to-merge-asked"
	// lvmActivate activates the volume's LV (a thick merge starts).
	lvmActivate lvmStep = "activate"
	// lvmWait waits until LVM's merge ends (the snapshot's LV removed).
	lvmWait lvmStep = "wait"
	// lvmToInvalid records phase invalid: the merging thick snapshot is
	// invalid, the kernel stopped the merge.
	lvmToInvalid lvmStep = "to-invalid"
	// lvmToMerged records phase merged.
	lvmToMerged lvmStep = "to-merged"
	// lvmFinish extends, grows, links, renames KeepLV, updates the
	// snapshot's record and removes the restore's.
	lvmFinish lvmStep = "finish"
	// lvmRollback: nothing was merged, and no run could go on (the
	// snapshot's LV gone, or a thick one overflowed, before the merge was
	// asked for): the restore is rolled back (the volume's LV active
	// again, KeepLV removed, the record removed), failing with why.
	lvmRollback lvmStep = "rollback"
	// lvmFail stops the restore, saying why; the record stays, and a run
	// once the cause is gone goes on.
	lvmFail lvmStep = "fail"
	// lvmStuck stops the restore, saying why: no run can finish or roll
	// it back; the message names the record to remove by hand.
	lvmStuck lvmStep = "stuck"
)

// lvmInvalidWhy is why a restore in phase invalid stops, and what to do.
func lvmInvalidWhy(r *restoreRecord) string {
	vg, _ := splitLV(r.SnapshotLV)
	return "LVM's merge of " + r.SnapshotLV + " stopped because the snapshot is invalid (its copy-on-write space overflowed before the merge): the kernel merges nothing from an invalid snapshot, so the volume reads as it did before the restore, and the snapshot's data is lost. Remove the invalid snapshot by hand (lvremove " + r.SnapshotLV + "; lvs -a " + vg + " shows it), check the volume's data"
}

// lvmRestoreNext decides a restore's next step from its record r and what
// LVM shows (o); for lvmFail, lvmStuck and lvmRollback, why.
func lvmRestoreNext(r *restoreRecord, o lvmSeen) (lvmStep, string) {
	thin := r.Method == MethodLVMThin
	switch {
	case !o.Origin:
		return lvmStuck, "the volume's logical volume (LVM UUID " + r.OriginLVUUID + ") is gone: nothing is left to restore, finish or roll back"
	case r.Phase == lvmRestoreInvalid:
		return lvmStuck, lvmInvalidWhy(r)
	case o.MergeFailed:
		return lvmFail, "LVM says the merge of " + r.SnapshotLV + " into the volume's logical volume failed (lvs -a -o+lv_merge_failed): look at it by hand (lvs -a, the system log; lvconvert --merge again)"
	case o.KeepForeign && r.Phase != lvmRestoreMerged:
		return lvmFail, "a logical volume named " + r.KeepLV + " is there and is not this restore's copy of the snapshot: not touching it; rename or remove it, then run the restore again"
	}
	gone := "the snapshot's logical volume " + r.SnapshotLV + " (LVM UUID " + r.SnapshotLVUUID + ") is gone, and its merge was not asked of LVM: it was removed (by hand?) before the restore merged it; nothing was merged"
	other := "LVM has a merge into the volume's logical volume pending that this restore did not ask for (lvs -a -o+lv_merging shows it): wait until it has finished (lvs -a), then run the restore again"
	// Before the merge was asked for, KeepLV must be there: merging
	// without it would use the thin snapshot up.
	keep := thin && o.Snapshot && !o.Merging && (!o.Keep || r.KeepLVUUID == "")
	switch r.Phase {
	case lvmRestoreRecorded, lvmRestoreKept:
		switch {
		case !o.Snapshot:
			return lvmRollback, gone
		case o.Merging || o.OtherMerging:
			return lvmFail, other
		case thin && o.KeepStale:
			return lvmDropKeep, ""
		case keep:
			return lvmKeep, ""
		}
		return lvmToMerging, ""
	case lvmRestoreMerging:
		switch {
		case o.Snapshot && o.SnapshotMerging:
			// Killed after lvconvert --merge, before recording it.
			return lvmToMergeAsked, ""
		case o.Snapshot && (o.Merging || o.OtherMerging):
			return lvmFail, other
		case !o.Snapshot && thin && r.SnapshotThinID != "" && o.OriginThinID == r.SnapshotThinID:
			// Merged at once (a thin merge of an inactive LV), killed
			// before recording it.
			return lvmToMergeAsked, ""
		case !o.Snapshot && thin && (r.OriginThinID == "" || o.OriginThinID == "" || o.OriginThinID != r.OriginThinID):
			return lvmStuck, fmt.Sprintf("the snapshot's logical volume %s is gone, and what LVM shows cannot tell whether it merged into the volume (the volume's LV has thin device %q; before the restore %q, the snapshot's %q): look at the volume's data", r.SnapshotLV, o.OriginThinID, r.OriginThinID, r.SnapshotThinID)
		case !o.Snapshot:
			return lvmRollback, gone
		case thin && o.KeepStale:
			return lvmDropKeep, ""
		case keep:
			return lvmKeep, ""
		case o.OriginActive && !thin && o.SnapshotInvalid:
			return lvmRollback, "snapshot " + r.SnapshotLV + " overflowed (its copy-on-write space filled up and LVM dropped it) before its merge was asked for: it cannot be merged; nothing was merged; delete the snapshot"
		case o.OriginActive:
			return lvmDeactivate, ""
		case thin && o.SnapshotActive:
			return lvmDeactivateSnapshot, ""
		case !thin && !o.CheckedValid:
			// Deactivated by an earlier run (or by hand): whether the
			// snapshot overflowed shows only while it is active.
			return lvmActivate, ""
		}
		return lvmMerge, ""
	case lvmRestoreMergeAsked:
		switch {
		case o.Snapshot && o.SnapshotMerging && !thin && o.OriginActive && o.SnapshotInvalid:
			return lvmToInvalid, ""
		case o.Merging && !o.OriginActive:
			return lvmActivate, ""
		case o.Merging:
			return lvmWait, ""
		case o.Snapshot:
			return lvmStuck, "LVM shows snapshot " + r.SnapshotLV + " there and not merging, although this restore asked for its merge (lvconvert --merge succeeded): look at it by hand (lvs -a -o+lv_merging,lv_merge_failed, the system log) and at the volume's data"
		case thin && r.OriginThinID != "" && o.OriginThinID == r.OriginThinID && r.OriginThinID != r.SnapshotThinID:
			// Gone, and not into the volume: removed by hand while its
			// merge was put off. The volume is as it was.
			return lvmRollback, fmt.Sprintf("the snapshot's logical volume %s is gone and the volume's LV still has its own thin device %s, not the snapshot's (%s): it was removed before it merged; nothing was merged", r.SnapshotLV, o.OriginThinID, r.SnapshotThinID)
		}
		return lvmToMerged, ""
	case lvmRestoreMerged:
		if !o.OriginActive {
			return lvmActivate, ""
		}
		return lvmFinish, ""
	}
	return lvmFail, "the restore record's phase " + r.Phase + " is not one this salt-volume-exec knows"
}

// rollbackable: nothing of the volume changed yet, the merge not asked
// for (the snapshot's LV there, no merge pending).
func rollbackable(r *restoreRecord, o lvmSeen) bool {
	return (r.Phase == lvmRestoreRecorded || r.Phase == lvmRestoreKept || r.Phase == lvmRestoreMerging) &&
		o.Origin && o.Snapshot && !o.Merging && !o.MergeFailed
}

// lvmSee reads, from lvs -a of the volume's VG, what restore r's LVs are;
// tag is the snapshot's tag (KeepLV carries it too).
func lvmSee(lvs []lvm.LV, r *restoreRecord, tag string) lvmSeen {
	o := lvmSeen{SnapshotPercent: -1}
	_, snapName := splitLV(r.SnapshotLV)
	originName := ""
	for i := range lvs {
		if lvs[i].UUID == r.OriginLVUUID {
			originName = lvs[i].Name
		}
	}
	for i := range lvs {
		lv := &lvs[i]
		switch {
		case lv.UUID == r.OriginLVUUID:
			o.Origin, o.OriginActive, o.OriginThinID = true, lv.Active, lv.ThinID
			o.Merging = o.Merging || lv.Merging
			o.MergeFailed = o.MergeFailed || lv.MergeFailed
		case lv.UUID == r.SnapshotLVUUID:
			// lv_merging is the snapshot's too (a thin origin's is not
			// reported at all).
			o.Snapshot, o.SnapshotMerging, o.SnapshotActive, o.SnapshotPercent = true, lv.Merging, lv.Active, lv.DataPercent
			o.SnapshotInvalid = lv.Pool == "" && lv.Active && (lv.Invalid || lv.DataPercent >= 100)
			if lv.Pool == "" {
				o.SnapshotThickSize = lv.Size
			}
			o.Merging = o.Merging || lv.Merging
			o.MergeFailed = o.MergeFailed || lv.MergeFailed
		case r.KeepLVUUID != "" && lv.UUID == r.KeepLVUUID:
			o.Keep = true
		case r.KeepLV != "" && lv.Name == r.KeepLV:
			if r.KeepLVUUID == "" && lv.HasTag(tag) && lv.Origin == snapName {
				o.KeepStale = true
			} else {
				o.KeepForeign = true
			}
		case originName != "" && lv.Origin == originName && lv.Merging:
			o.OtherMerging = true
		}
	}
	return o
}

func keepLVName(volumeUUID, name string) string { return "svkeep-" + volumeUUID[:8] + "-" + name }

func (e *Engine) lvmRestorePath(u string) string {
	return filepath.Join(e.State.Restores(), u+".json")
}

// refuseLVMRestorePending is refuseRestorePending for an LVM volume's
// restore record.
func (e *Engine) refuseLVMRestorePending(s *spec.Spec, snapshot, what string) error {
	p := e.lvmRestorePath(s.UUID)
	rr, err := readRestore(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return failed("state", err, "reading %s", p)
	}
	if snapshot != "" && rr.Snapshot != snapshot {
		return nil
	}
	if rr.Phase == lvmRestoreInvalid {
		return refused("restore_pending", "volume %s: a restore from snapshot %s (started %s) stopped, so %s is refused: %s; then remove the restore's record %s by hand",
			s.Name, rr.Snapshot, rr.StartedAt.Format(time.RFC3339), what, lvmInvalidWhy(rr), p)
	}
	return refused("restore_pending", "volume %s: a restore from snapshot %s (started %s, phase %s) did not finish, so %s is refused: finish it by running the restore again (salt-volume-exec snapshot-restore --name %s, or the API's or Salt's restore); then try again",
		s.Name, rr.Snapshot, rr.StartedAt.Format(time.RFC3339), rr.Phase, what, rr.Snapshot)
}

// lvmRun is one LVM restore under way.
type lvmRun struct {
	e     *Engine
	o     *op
	rec   *nodestate.Record
	r     *restoreRecord
	vg    string
	tag   string
	out   *SnapshotRestore
	lvs   []lvm.LV
	seen  lvmSeen
	path  string
	start time.Time
	// checked: this run found the volume unused a moment ago.
	checked bool
	// checkedValid: this run saw the thick snapshot valid with the
	// volume's LV active, then deactivated the LV (lvmSeen.CheckedValid).
	checkedValid bool
	// mergeReport tells a thick merge's bytes (mergeProgress), merged
	// how many of them were told.
	mergeReport func(done, total int64)
	merged      int64
}

// mergeProgress tells a thick merge's bytes, x.r.SnapshotUsed in all
// (nothing if not known): none at first, then as the snapshot's changed
// blocks left (its data_percent of its size) fall, never back and never
// all before it is done; all of them once merged.
func (x *lvmRun) mergeProgress(left int64, done bool) {
	total := x.r.SnapshotUsed
	if total <= 0 {
		return
	}
	if x.mergeReport == nil {
		x.mergeReport = x.o.progress("merging", "snapshot", x.r.Snapshot)
		x.mergeReport(0, total)
	}
	switch {
	case done:
		x.mergeReport(total, total)
	case left >= 0:
		x.merged = max(x.merged, min(total-1, total-left))
		x.mergeReport(x.merged, total)
	}
}

// restoreFromLVMSnapshot puts LVM volume rec.Spec back to its snapshot name (see
// above); the caller holds the volume's lock.
func (e *Engine) restoreFromLVMSnapshot(ctx context.Context, rec *nodestate.Record, name string, start time.Time) (*SnapshotRestore, error) {
	s := rec.Spec
	run := &lvmRun{e: e, o: opFor(e, s), rec: rec, vg: s.LVMLogicalVolume.VGName, tag: snapshotTag(s.UUID, name),
		out: &SnapshotRestore{Snapshot: name}, path: e.lvmRestorePath(s.UUID), start: start}
	rr, err := readRestore(run.path)
	switch {
	case err == nil:
		if err := run.see(ctx, rr); err != nil {
			return nil, err
		}
		if rr.OriginLVUUID != rec.LVUUID {
			return nil, failed("state", nil, "%s names logical volume %s as volume %s's, and its record %s: look at it by hand", run.path, rr.OriginLVUUID, s.Name, rec.LVUUID)
		}
		if rr.Snapshot != name {
			if !rollbackable(rr, run.seen) {
				return nil, refused("restore_pending", "volume %s: a restore from snapshot %s did not finish (phase %s, the merge asked of LVM): run snapshot-restore --name %s again first, which finishes it",
					s.Name, rr.Snapshot, rr.Phase, rr.Snapshot)
			}
			if err := run.rollback(ctx, rr); err != nil {
				return nil, err
			}
			run.out.Finished = rr.Snapshot
			return run.fresh(ctx)
		}
		run.out.Finished = rr.Snapshot
		run.tag = snapshotTag(s.UUID, rr.Snapshot)
		run.r = rr
		return run.loop(ctx)
	case errors.Is(err, os.ErrNotExist):
		return run.fresh(ctx)
	default:
		return nil, failed("state", err, "reading %s", run.path)
	}
}

// see reads lvs -a of the VG and what it shows of restore r.
func (x *lvmRun) see(ctx context.Context, r *restoreRecord) error {
	lvs, err := lvm.ListAll(ctx, x.vg)
	if err != nil {
		return failed("lvm", err, "reading the logical volumes of %s", x.vg)
	}
	x.lvs = lvs
	x.seen = lvmSee(lvs, r, snapshotTag(r.VolumeUUID, r.Snapshot))
	x.seen.CheckedValid = x.checkedValid
	return nil
}

func (x *lvmRun) byUUID(u string) *lvm.LV {
	for i := range x.lvs {
		if x.lvs[i].UUID == u {
			return &x.lvs[i]
		}
	}
	return nil
}

func (x *lvmRun) byName(n string) *lvm.LV {
	for i := range x.lvs {
		if x.lvs[i].Name == n {
			return &x.lvs[i]
		}
	}
	return nil
}

// fresh checks a new restore (every refusal changes nothing), records it
// and runs it.
func (x *lvmRun) fresh(ctx context.Context) (*SnapshotRestore, error) {
	s, name := x.o.s, x.out.Snapshot
	snapPath, _ := x.e.snapshotPaths(s.UUID, name)
	snap, err := readSnapshot(snapPath)
	if errors.Is(err, os.ErrNotExist) || (err == nil && snap.Phase != SnapshotTaken) {
		return nil, invalid("snapshot_not_found", "snapshot %s of volume %s is not on this node (salt-volume-exec snapshots lists them): nothing was changed", name, s.Name)
	}
	if err != nil {
		return nil, failed("state", err, "reading snapshot %s", name)
	}
	x.tag = snapshotTag(s.UUID, name)
	if x.lvs, err = lvm.ListAll(ctx, x.vg); err != nil {
		return nil, failed("lvm", err, "reading the logical volumes of %s", x.vg)
	}
	r, warnings, err := lvmRestorePlan(s, x.rec, snap, x.lvs)
	if err != nil {
		return nil, err
	}
	if origin := x.byUUID(x.rec.LVUUID); !origin.Active {
		// An LV not active (the boot did not, someone deactivated it):
		// active again, as salt-volume-exec restore does, to be read (a
		// thick snapshot's overflow shows only while it is active).
		if _, err := x.e.activateLV(ctx, x.o, x.rec); err != nil {
			return nil, err
		}
		if x.lvs, err = lvm.ListAll(ctx, x.vg); err != nil {
			return nil, failed("lvm", err, "reading the logical volumes of %s", x.vg)
		}
		if r, warnings, err = lvmRestorePlan(s, x.rec, snap, x.lvs); err != nil {
			return nil, err
		}
	}
	if err := x.refuseInUse(r.SnapshotLVUUID); err != nil {
		return nil, err
	}
	x.checked = true
	r.StartedAt, r.Device, r.Warnings = x.start.UTC(), deviceOf(x.rec), warnings
	if _, err := x.e.State.RestoresDir(); err != nil {
		return nil, failed("state", err, "the restore records")
	}
	if err := writeRecord(x.path, r); err != nil {
		return nil, failed("state", err, "recording the restore of %s", s.Name)
	}
	x.r = r
	x.o.step("restore-recorded", "snapshot", name, "lv", snap.LV, "method", string(r.Method))
	return x.loop(ctx)
}

// lvmRestorePlan checks a new restore of LVM volume s (its record rec)
// from snapshot snap against what lvs -a of its VG shows, and makes its
// record (phase recorded), with the warnings its result will carry; or
// refuses it, naming the fix. It changes nothing.
func lvmRestorePlan(s *spec.Spec, rec *nodestate.Record, snap *Snapshot, lvs []lvm.LV) (*restoreRecord, []string, error) {
	name, vgName := snap.Name, s.LVMLogicalVolume.VGName
	vg, snapName := splitLV(snap.LV)
	switch {
	case snap.VolumeUUID != s.UUID:
		return nil, nil, refused("snapshot_mismatch", "snapshot %s is of volume %s, not of %s (%s): nothing was changed", name, snap.VolumeUUID, s.Name, s.UUID)
	case snap.LV == "" || vg != vgName:
		return nil, nil, refused("snapshot_mismatch", "snapshot %s is not an LVM snapshot in volume group %s, where volume %s is: nothing was changed", name, vgName, s.Name)
	}
	var origin, sl *lvm.LV
	for i := range lvs {
		switch lv := &lvs[i]; {
		case lv.UUID == rec.LVUUID:
			origin = lv
		case lv.Name == snapName:
			sl = lv
		}
	}
	tag := snapshotTag(s.UUID, name)
	merging := ""
	for i := range lvs {
		if origin != nil && lvs[i].Origin == origin.Name && lvs[i].Merging {
			// LVM sets lv_merging on a thin snapshot, not on its origin.
			merging = vg + "/" + lvs[i].Name + " merging"
		}
	}
	if origin != nil && origin.Merging && merging == "" {
		merging = "lv_merging on the LV"
	}
	switch {
	case origin == nil:
		return nil, nil, failed("lv_missing", nil, "logical volume %s/%s (LVM UUID %s), which salt-volumes created for volume %s, is not on this node: nothing to restore", vg, s.Name, rec.LVUUID, s.Name)
	case origin.Name != s.Name || !origin.HasTag(lvTag(s)):
		return nil, nil, refused("lv_not_ours", "logical volume %s/%s (LVM UUID %s) is not named %s or lacks the tag %s any more: not restoring it; nothing was changed", vg, origin.Name, rec.LVUUID, s.Name, lvTag(s))
	case merging != "":
		return nil, nil, refused("merge_pending", "LVM is merging a snapshot into %s/%s already (%s; not a restore of salt-volumes): wait until it has finished (lvs -a -o+lv_merging %s), then restore again; nothing was changed", vg, s.Name, merging, vg)
	case sl == nil:
		return nil, nil, failed("snapshot_missing", nil, "snapshot %s of %s: its record is here, its logical volume %s is gone: nothing was changed; delete the snapshot", name, s.Name, snap.LV)
	case !sl.HasTag(tag) || (snap.LVUUID != "" && sl.UUID != snap.LVUUID):
		return nil, nil, refused("lv_not_ours", "logical volume %s is not snapshot %s of %s any more (its tag or LVM UUID changed): not touching it; nothing was changed", snap.LV, name, s.Name)
	case sl.Origin != origin.Name && sl.Pool != "":
		return nil, nil, refused("snapshot_unlinked", "snapshot %s (%s) is no longer linked to %s/%s in LVM (its origin is %q: an earlier restore from another snapshot gave the volume a new thin device, which unlinks the snapshots of the old one): LVM cannot merge it; clone it instead (salt-volumes create NEW --from snapshot/%s, or a new volume with source.snapshot %s): nothing was changed",
			name, snap.LV, vg, s.Name, sl.Origin, name, name)
	case sl.Origin != origin.Name:
		return nil, nil, refused("snapshot_mismatch", "snapshot %s (%s) is not a snapshot of %s/%s (its origin is %q): nothing was changed", name, snap.LV, vg, s.Name, sl.Origin)
	case (sl.Pool != "") != (snap.Method == MethodLVMThin):
		return nil, nil, refused("snapshot_mismatch", "snapshot %s (%s): its record says %s, LVM another kind: nothing was changed", name, snap.LV, snap.Method)
	}
	r := &restoreRecord{Version: 1, Snapshot: name, VolumeUUID: s.UUID, Phase: lvmRestoreRecorded,
		Method: MethodLVMThick, SnapshotTakenAt: snap.TakenAt, SnapshotLV: snap.LV, SnapshotLVUUID: sl.UUID,
		SnapshotSize: snap.Size, OriginLVUUID: origin.UUID}
	if sl.Pool == "" {
		// Its state is known only while it is active (with its origin).
		if sl.Invalid || sl.DataPercent >= 100 {
			return nil, nil, refused("snapshot_invalid", "snapshot %s (%s) overflowed: its copy-on-write space filled up and LVM dropped it, so it cannot be merged: nothing was changed; delete the snapshot", name, snap.LV)
		}
		if err := refuseSiblingsTooSmall(s, name, snap.LV, sl, origin, lvs); err != nil {
			return nil, nil, err
		}
		return r, nil, nil
	}
	r.Method, r.OriginThinID, r.SnapshotThinID = MethodLVMThin, origin.ThinID, sl.ThinID
	r.KeepLV = keepLVName(s.UUID, name)
	var thick, others []string
	prefix := spec.LVMTagPrefix + s.UUID + "/snapshot="
	for _, lv := range lvs {
		switch {
		case lv.Name == r.KeepLV && (!lv.HasTag(tag) || lv.Origin != snapName):
			return nil, nil, refused("lv_not_ours", "logical volume %s/%s is there and is not a copy of snapshot %s that salt-volumes made: the restore keeps the snapshot under that name first; not touching it; nothing was changed", vg, r.KeepLV, name)
		case lv.Origin != origin.Name || lv.UUID == sl.UUID:
		case lv.Pool == "":
			thick = append(thick, vg+"/"+lv.Name)
		default:
			for _, t := range lv.Tags {
				if n, ok := strings.CutPrefix(t, prefix); ok {
					others = append(others, n)
				}
			}
		}
	}
	if len(thick) > 0 {
		return nil, nil, refused("restore_unsupported", "%s/%s has thick snapshots (%s): LVM merges no thin snapshot into an LV that has thick ones; remove them first (lvremove), then restore again; nothing was changed", vg, s.Name, strings.Join(thick, ", "))
	}
	var warnings []string
	if len(others) > 0 {
		// Merged, the volume's LV takes the snapshot's thin device, and
		// LVM unlinks the snapshots taken of the old one.
		sort.Strings(others)
		warnings = append(warnings, fmt.Sprintf("snapshots %s of %s were taken of its thin device before this restore: LVM unlinked them from the volume as %s merged, so they can still be cloned (create --from snapshot/NAME) but no longer restored in place", strings.Join(others, ", "), s.Name, name))
	}
	return r, warnings, nil
}

// refuseSiblingsTooSmall refuses the thick merge of sl into origin while
// another thick snapshot of origin has less free copy-on-write space than
// sl uses: the merge writes back every chunk sl holds, and the kernel
// first copies the old contents of each into every other thick snapshot
// of the origin (dm-snap.c, origin_write_extent), which would overflow
// one too small and LVM drop it. sl's used space (data_percent of its
// size, with its own exception metadata) is an upper bound of that.
func refuseSiblingsTooSmall(s *spec.Spec, name, snapLV string, sl, origin *lvm.LV, lvs []lvm.LV) error {
	used := sl.Size
	if sl.DataPercent >= 0 {
		used = int64(math.Ceil(sl.DataPercent / 100 * float64(sl.Size)))
	}
	var short []string
	for _, lv := range lvs {
		if lv.Origin != origin.Name || lv.UUID == sl.UUID || lv.Pool != "" || lv.Invalid {
			continue
		}
		full := lv.VG + "/" + lv.Name
		if lv.DataPercent < 0 {
			short = append(short, fmt.Sprintf("%s (LVM shows not how full it is: activate %s/%s and try again, or delete it)", full, lv.VG, origin.Name))
			continue
		}
		free := int64((100 - lv.DataPercent) / 100 * float64(lv.Size))
		if free < used {
			short = append(short, fmt.Sprintf("%s has %s free (make room: lvextend -L +%s %s; or delete that snapshot)", full, spec.FormatSize(free), spec.FormatSize(roundUp(used-free, 1<<20)), full))
		}
	}
	if len(short) > 0 {
		return refused("cow_too_small", "snapshot %s (%s) holds up to %s of changed blocks, which its merge writes back into %s/%s, and LVM first copies the old contents of each into every other thick snapshot of it: %s would overflow and be dropped; nothing was changed",
			name, snapLV, spec.FormatSize(used), origin.VG, s.Name, strings.Join(short, "; "))
	}
	return nil
}

// refuseInUse refuses the restore while anything uses the volume's LV or,
// thick, one of its snapshots' (deactivating the LV deactivates them), or
// the thin snapshot's own LV (snapUUID) if active: merged while open,
// LVM would put the merge off to an activation that never comes.
func (x *lvmRun) refuseInUse(snapUUID string) error {
	s := x.o.s
	devs := []string{deviceOf(x.rec)}
	if origin := x.byUUID(x.rec.LVUUID); origin != nil && origin.Pool == "" {
		for _, lv := range x.lvs {
			if lv.Origin == origin.Name && lv.Pool == "" && lv.Active {
				devs = append(devs, dmByUUID(lv.DMUUID()))
			}
		}
	}
	if sl := x.byUUID(snapUUID); sl != nil && sl.Pool != "" && sl.Active {
		devs = append(devs, dmByUUID(sl.DMUUID()))
	}
	for _, n := range devs {
		if n == "" {
			continue
		}
		if err := refuseDeviceInUse(s, loopdev.Device{Name: n, Path: "/dev/" + n}, ""); err != nil {
			return err
		}
	}
	return nil
}

// save writes the record with phase p.
func (x *lvmRun) save(p string) error {
	x.r.Phase = p
	if err := writeRecord(x.path, x.r); err != nil {
		return failed("state", err, "recording the restore of %s", x.o.s.Name)
	}
	return nil
}

// loop runs the restore's steps until it is finished.
func (x *lvmRun) loop(ctx context.Context) (*SnapshotRestore, error) {
	out, err := x.steps(ctx)
	if err != nil {
		return nil, x.unfinished(err)
	}
	return out, nil
}

// unfinished: from merge-asked on, the volume holds (or is taking) the
// snapshot's data, so a failure is not "left as it was": its code is
// restore_unfinished, and its message says so first (the control plane
// and Salt see the message only).
func (x *lvmRun) unfinished(err error) error {
	if x.r == nil || (x.r.Phase != lvmRestoreMergeAsked && x.r.Phase != lvmRestoreMerged) {
		return err
	}
	e := AsError(err)
	if e.Code == "restore_unfinished" || e.Code == "restore_stuck" {
		return err
	}
	return &Error{KindFailed, "restore_unfinished", fmt.Sprintf("restore_unfinished: volume %s already holds (or is taking) the data of snapshot %s, whose merge was asked of LVM, but the restore did not finish: run it again to finish it (salt-volume-exec snapshot-restore --name %s, or the API's or Salt's restore; it is never run again by itself): %s",
		x.o.s.Name, x.r.Snapshot, x.r.Snapshot, e.Message)}
}

func (x *lvmRun) steps(ctx context.Context) (*SnapshotRestore, error) {
	s := x.o.s
	x.out.Method = x.r.Method
	// What this run read of LVM a moment ago, with nothing changed in
	// LVM since, is not read again (an lvs costs 0.1-0.5 s).
	current := x.lvs != nil
	for i := 0; i < 32; i++ {
		if current {
			x.seen = lvmSee(x.lvs, x.r, snapshotTag(x.r.VolumeUUID, x.r.Snapshot))
			x.seen.CheckedValid = x.checkedValid
		} else if err := x.see(ctx, x.r); err != nil {
			return nil, err
		}
		current = false
		step, why := lvmRestoreNext(x.r, x.seen)
		x.e.Log.Debug("restore step", "volume", s.Name, "phase", x.r.Phase, "next", string(step), "seen", fmt.Sprintf("%+v", x.seen))
		var err error
		switch step {
		case lvmFail:
			return nil, failed("restore_lvm", nil, "restoring %s from snapshot %s: %s; the restore's record %s stays, so growing the volume and deleting the snapshot stay refused until a run finishes it", s.Name, x.r.Snapshot, why, x.path)
		case lvmStuck:
			return nil, failed("restore_stuck", nil, "restoring %s from snapshot %s: %s; no run can finish or roll this restore back: once you have looked, remove its record by hand (rm %s), which lets the volume be grown, snapshotted and deleted again", s.Name, x.r.Snapshot, why, x.path)
		case lvmRollback:
			return nil, x.undo(ctx, why)
		case lvmKeep:
			err = x.keep(ctx)
		case lvmDropKeep:
			err = x.dropKeep(ctx)
		case lvmToMerging:
			// What the merge will copy back, read while the snapshot is
			// still active (deactivated with its origin, it says nothing).
			if x.seen.SnapshotPercent > 0 && x.seen.SnapshotThickSize > 0 {
				x.r.SnapshotUsed = int64(x.seen.SnapshotPercent / 100 * float64(x.seen.SnapshotThickSize))
			}
			if err = x.save(lvmRestoreMerging); err == nil {
				x.o.step("restore-merging", "snapshot", x.r.Snapshot)
			}
			current = true
		case lvmDeactivate:
			err = x.deactivate(ctx)
		case lvmDeactivateSnapshot:
			err = x.deactivateSnapshot(ctx)
		case lvmMerge:
			err = x.merge(ctx)
		case lvmToMergeAsked:
			if err = x.save(lvmRestoreMergeAsked); err == nil {
				x.o.step("restore-merge-asked", "snapshot", x.r.Snapshot, "by", "an earlier run")
			}
			current = true
		case lvmActivate:
			if err = lvm.ActivatePolling(ctx, x.vg, x.r.OriginLVUUID); err != nil {
				err = failed("lvchange", err, "activating %s/%s", x.vg, s.Name)
			} else {
				x.o.changed = true
				x.o.step("restore-activated", "lv", x.vg+"/"+s.Name)
			}
		case lvmWait:
			err = x.wait(ctx)
			current = true // it ends on what it read
		case lvmToInvalid:
			if err = x.save(lvmRestoreInvalid); err == nil {
				x.o.step("restore-invalid", "snapshot", x.r.Snapshot)
			}
			current = true
		case lvmToMerged:
			x.mergeProgress(0, true)
			if err = x.save(lvmRestoreMerged); err == nil {
				x.o.step("restore-merged", "snapshot", x.r.Snapshot)
			}
			current = true
		case lvmFinish:
			return x.finish(ctx)
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, failed("restore_lvm", nil, "restoring %s from snapshot %s: no end after 32 steps (last seen %+v in phase %s); run it again", s.Name, x.r.Snapshot, x.seen, x.r.Phase)
}

// keep takes KeepLV, a thin snapshot of the snapshot (inactive, as our
// thin snapshots are), and records its UUID. An LV under its name is
// never adopted (dropKeep removes one of ours first).
func (x *lvmRun) keep(ctx context.Context) error {
	_, snapName := splitLV(x.r.SnapshotLV)
	if k := x.byName(x.r.KeepLV); k != nil {
		return refused("lv_not_ours", "logical volume %s/%s is there and is not this restore's copy of the snapshot: not touching it", x.vg, x.r.KeepLV)
	}
	if sl := x.byUUID(x.r.SnapshotLVUUID); sl == nil || sl.Name != snapName {
		return failed("snapshot_missing", nil, "snapshot %s: its logical volume %s (LVM UUID %s) is not there to copy", x.r.Snapshot, x.r.SnapshotLV, x.r.SnapshotLVUUID)
	}
	if err := lvm.Snapshot(ctx, x.vg, snapName, x.r.KeepLV, 0, x.tag); err != nil {
		return failed("lvcreate", err, "copying snapshot %s (%s) as %s/%s before it merges", x.r.Snapshot, x.r.SnapshotLV, x.vg, x.r.KeepLV)
	}
	x.o.step("restore-keep-created", "lv", x.vg+"/"+x.r.KeepLV)
	k, err := lvm.GetLV(ctx, x.vg, x.r.KeepLV)
	if err != nil || k == nil {
		return failed("lvm", err, "reading %s/%s back", x.vg, x.r.KeepLV)
	}
	x.r.KeepLVUUID = k.UUID
	p := x.r.Phase
	if p == lvmRestoreRecorded {
		p = lvmRestoreKept
	}
	if err := x.save(p); err != nil {
		return err
	}
	x.o.step("restore-kept", "lv", x.vg+"/"+x.r.KeepLV)
	return nil
}

// dropKeep removes, by its LVM UUID, a KeepLV an earlier run made and did
// not record (ours: our tag, the snapshot its origin): it may have been
// activated and written since, so a fresh one is taken.
func (x *lvmRun) dropKeep(ctx context.Context) error {
	_, snapName := splitLV(x.r.SnapshotLV)
	k := x.byName(x.r.KeepLV)
	if k == nil || x.r.KeepLVUUID != "" || !k.HasTag(x.tag) || k.Origin != snapName {
		return failed("restore_lvm", nil, "%s/%s is not an unrecorded copy of snapshot %s: not removing it", x.vg, x.r.KeepLV, x.r.Snapshot)
	}
	if err := lvm.Remove(ctx, x.vg, k.UUID); err != nil {
		return failed("lvremove", err, "removing %s/%s, a copy of snapshot %s an earlier run left, to take it again", x.vg, x.r.KeepLV, x.r.Snapshot)
	}
	x.o.step("restore-keep-dropped", "lv", x.vg+"/"+x.r.KeepLV, "uuid", k.UUID)
	return nil
}

// deactivate deactivates the volume's LV: checked unused first (by this
// run, or now), a thick snapshot checked valid just before (the LV still
// active), and LVM refuses once more while it is open. Refused, the
// restore is rolled back: nothing was changed.
func (x *lvmRun) deactivate(ctx context.Context) error {
	s := x.o.s
	if !x.checked {
		if err := x.refuseInUse(x.r.SnapshotLVUUID); err != nil {
			return x.rollbackWith(ctx, err)
		}
	}
	if x.r.Method == MethodLVMThick {
		if err := x.see(ctx, x.r); err != nil {
			return err
		}
		if x.seen.SnapshotInvalid && rollbackable(x.r, x.seen) {
			return x.rollbackWith(ctx, refused("snapshot_invalid", "snapshot %s (%s) overflowed: its copy-on-write space filled up and LVM dropped it, so it cannot be merged: nothing was changed; delete the snapshot", x.r.Snapshot, x.r.SnapshotLV))
		}
	}
	if err := lvm.Deactivate(ctx, x.vg, x.r.OriginLVUUID); err != nil {
		if serr := x.see(ctx, x.r); serr == nil && x.seen.OriginActive && rollbackable(x.r, x.seen) {
			if !lvmInUse(err) {
				return x.rollbackWith(ctx, failed("lvchange", err, "deactivating %s/%s; nothing was changed", x.vg, s.Name))
			}
			// Opened after the check: named if it can be.
			why := refused("in_use", "volume %s: LVM refused to deactivate %s/%s, which is in use (%v): unmount it and stop what holds it, then restore again; nothing was changed", s.Name, x.vg, s.Name, err)
			if uerr := x.refuseInUse(x.r.SnapshotLVUUID); uerr != nil {
				why = uerr
			}
			return x.rollbackWith(ctx, why)
		}
		return failed("lvchange", err, "deactivating %s/%s", x.vg, s.Name)
	}
	x.checkedValid = x.r.Method == MethodLVMThick
	x.o.changed = true
	x.o.step("restore-deactivated", "lv", x.vg+"/"+s.Name)
	return nil
}

// lvmInUse: LVM refused to deactivate an LV because it is open.
func lvmInUse(err error) bool {
	m := err.Error()
	return strings.Contains(m, "in use") || strings.Contains(m, "is open") || strings.Contains(m, "open count")
}

// deactivateSnapshot deactivates the thin snapshot's own LV (by LVM
// UUID): merged while open, LVM would put the merge off. Refused, the
// restore is rolled back: nothing was changed.
func (x *lvmRun) deactivateSnapshot(ctx context.Context) error {
	if err := lvm.Deactivate(ctx, x.vg, x.r.SnapshotLVUUID); err != nil {
		if serr := x.see(ctx, x.r); serr == nil && x.seen.SnapshotActive && rollbackable(x.r, x.seen) {
			why := failed("lvchange", err, "deactivating snapshot %s's logical volume %s before its merge; nothing was changed", x.r.Snapshot, x.r.SnapshotLV)
			if lvmInUse(err) {
				why = refused("in_use", "volume %s: snapshot %s's logical volume %s is in use (%v): LVM would put its merge off while it is open; unmount it and stop what holds it, then restore again; nothing was changed", x.o.s.Name, x.r.Snapshot, x.r.SnapshotLV, err)
			}
			return x.rollbackWith(ctx, why)
		}
		return failed("lvchange", err, "deactivating %s", x.r.SnapshotLV)
	}
	x.o.step("restore-snapshot-deactivated", "lv", x.r.SnapshotLV)
	return nil
}

// merge asks LVM to merge the snapshot into the volume's LV, now
// inactive, and records that at once (merge-asked); refused, the restore
// is rolled back.
func (x *lvmRun) merge(ctx context.Context) error {
	s := x.o.s
	_, snapName := splitLV(x.r.SnapshotLV)
	if sl := x.byUUID(x.r.SnapshotLVUUID); sl == nil || sl.Name != snapName {
		return failed("snapshot_missing", nil, "snapshot %s: its logical volume %s (LVM UUID %s) is not there to merge", x.r.Snapshot, x.r.SnapshotLV, x.r.SnapshotLVUUID)
	}
	if err := lvm.Merge(ctx, x.vg, snapName); err != nil {
		if serr := x.see(ctx, x.r); serr == nil && rollbackable(x.r, x.seen) {
			return x.rollbackWith(ctx, failed("lvconvert", err, "merging snapshot %s (%s) into %s/%s: LVM refused; nothing was changed", x.r.Snapshot, x.r.SnapshotLV, x.vg, s.Name))
		}
		return failed("lvconvert", err, "merging snapshot %s (%s) into %s/%s", x.r.Snapshot, x.r.SnapshotLV, x.vg, s.Name)
	}
	x.o.changed = true
	if err := x.save(lvmRestoreMergeAsked); err != nil {
		return err
	}
	x.o.step("restore-merge-started", "snapshot", x.r.Snapshot, "lv", x.r.SnapshotLV)
	return nil
}

// How long a thick merge may show no progress, and wait at most in all
// (the exec's timeout may end it sooner).
const (
	mergeStallLimit = 5 * time.Minute
	mergeWaitLimit  = time.Hour
)

// wait waits while LVM merges a thick snapshot's blocks back, until it
// removed the snapshot's LV (or the snapshot shows invalid: the loop
// records that); LVM's poller is asked again if it seems not to run. It
// fails when the merge's data_percent has not moved for mergeStallLimit,
// or after mergeWaitLimit: the record stays, a run goes on waiting.
func (x *lvmRun) wait(ctx context.Context) error {
	s := x.o.s
	started := time.Now()
	polled := time.Time{}
	last, moved := x.seen.SnapshotPercent, time.Now()
	x.mergeProgress(-1, false)
	for {
		select {
		case <-ctx.Done():
			return failed("restore_lvm", ctx.Err(), "waiting for LVM to merge snapshot %s into %s/%s (it goes on)", x.r.Snapshot, x.vg, s.Name)
		case <-time.After(time.Second):
		}
		if err := x.see(ctx, x.r); err != nil {
			return err
		}
		if !x.seen.Merging || !x.seen.OriginActive || x.seen.MergeFailed || x.seen.SnapshotInvalid {
			x.o.step("restore-merge-done", "snapshot", x.r.Snapshot, "took", time.Since(started).Round(time.Second).String())
			return nil
		}
		if p := x.seen.SnapshotPercent; p != last {
			last, moved = p, time.Now()
		}
		if last >= 0 && x.seen.SnapshotThickSize > 0 {
			x.mergeProgress(int64(last/100*float64(x.seen.SnapshotThickSize)), false)
		}
		// (Not reported at all: no stall is told; an invalid snapshot
		// still is.)
		if stall := time.Since(moved); last >= 0 && stall > mergeStallLimit {
			return failed("restore_lvm", nil, "LVM's merge of snapshot %s into %s/%s has not moved for %s (data_percent %.2f): look at it (lvs -a -o+lv_merging,lv_merge_failed,data_percent %s, the system log)", x.r.Snapshot, x.vg, s.Name, stall.Round(time.Second), last, x.vg)
		}
		if time.Since(started) > mergeWaitLimit {
			return failed("restore_lvm", nil, "LVM's merge of snapshot %s into %s/%s goes on after %s (data_percent %.2f)", x.r.Snapshot, x.vg, s.Name, mergeWaitLimit, last)
		}
		if since := time.Since(started); since > 10*time.Second && time.Since(polled) > time.Minute {
			// LVM's poller (lvmpolld, or a process lvchange forked) did
			// not end it: started again; a second one finds it done.
			if err := lvm.Poll(ctx, x.vg, x.r.OriginLVUUID); err != nil {
				x.e.Log.Warn("asking LVM to poll the merge", "volume", s.Name, "error", err)
			}
			polled = time.Now()
		}
	}
}

// rollbackWith rolls the restore back (see rollback) and returns err, the
// reason, or the rollback's failure.
func (x *lvmRun) rollbackWith(ctx context.Context, err error) error {
	if rerr := x.rollback(ctx, x.r); rerr != nil {
		return failed("restore_lvm", rerr, "%s; rolling the restore back failed too (run it again)", AsError(err).Message)
	}
	return err
}

// rollback undoes a restore r whose merge was not asked for (rollbackable).
func (x *lvmRun) rollback(ctx context.Context, r *restoreRecord) error {
	if err := x.see(ctx, r); err != nil {
		return err
	}
	if !rollbackable(r, x.seen) {
		return failed("restore_lvm", nil, "the restore from %s cannot be rolled back: its merge was asked of LVM", r.Snapshot)
	}
	return x.unwind(ctx, r)
}

// unwind undoes restore r, which merged nothing: the volume's LV active
// again, KeepLV removed (by its LVM UUID), the record removed (last, so
// that a run killed meanwhile rolls back again).
func (x *lvmRun) unwind(ctx context.Context, r *restoreRecord) error {
	s := x.o.s
	if !x.seen.OriginActive {
		if err := lvm.Activate(ctx, x.vg, r.OriginLVUUID); err != nil {
			return failed("lvchange", err, "activating %s/%s again", x.vg, s.Name)
		}
	}
	var k *lvm.LV
	switch _, snapName := splitLV(r.SnapshotLV); {
	case r.KeepLVUUID != "":
		k = x.byUUID(r.KeepLVUUID)
	case r.KeepLV != "":
		if l := x.byName(r.KeepLV); l != nil && l.HasTag(snapshotTag(r.VolumeUUID, r.Snapshot)) && l.Origin == snapName {
			k = l
		}
	}
	if k != nil {
		if err := lvm.Remove(ctx, x.vg, k.UUID); err != nil {
			return failed("lvremove", err, "removing %s/%s, the restore's copy of the snapshot", x.vg, k.Name)
		}
	}
	if err := os.Remove(x.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return failed("state", err, "removing %s", x.path)
	}
	_ = syncDirOf(filepath.Dir(x.path))
	x.o.step("restore-rolled-back", "snapshot", r.Snapshot)
	return nil
}

// undo rolls back a restore that merged nothing and cannot go on
// (lvmRollback), and fails saying why.
func (x *lvmRun) undo(ctx context.Context, why string) error {
	s := x.o.s
	if err := x.unwind(ctx, x.r); err != nil {
		return failed("restore_lvm", err, "restoring %s from snapshot %s: %s; rolling the restore back failed (run it again; its record %s stays)", s.Name, x.r.Snapshot, why, x.path)
	}
	code := "snapshot_missing"
	if strings.Contains(why, "overflowed") {
		code = "snapshot_invalid"
	}
	return failed(code, nil, "restoring %s from snapshot %s: %s; the restore was rolled back (the volume's LV active again, the restore's copy of the snapshot and its record removed): the volume is as it was", s.Name, x.r.Snapshot, why)
}

// finish ends a merged restore; every part looks at what is there, so a
// run killed anywhere in here is finished by the next.
func (x *lvmRun) finish(ctx context.Context) (*SnapshotRestore, error) {
	s, r := x.o.s, x.r
	name := dmByUUID(x.rec.DMUUID)
	if name == "" {
		return nil, failed("lvm", nil, "logical volume %s/%s is active but no device-mapper device has UUID %s", x.vg, s.Name, x.rec.DMUUID)
	}
	// A thin merge leaves the LV the size the snapshot had: a volume
	// grown since keeps its size.
	origin := x.byUUID(r.OriginLVUUID)
	if origin != nil && origin.Name != s.Name {
		return nil, failed("lv_not_ours", nil, "the volume's logical volume (LVM UUID %s) is named %s/%s now, not %s: not extending or linking it; name it %s again (lvrename), then run the restore again", r.OriginLVUUID, x.vg, origin.Name, s.Name, s.Name)
	}
	if origin != nil && origin.Size < s.SizeBytes {
		g, err := lvm.GetVG(ctx, x.vg)
		if err != nil {
			return nil, failed("lvm", err, "reading volume group %s", x.vg)
		}
		want := roundUp(s.SizeBytes, g.ExtentSize)
		if origin.Pool == "" && want-origin.Size > g.Free {
			return nil, failed("size_too_large", nil, "%s/%s is %s after the merge, and growing it back to the volume's %s needs more than volume group %s has free (%s): extend the VG (vgextend), then run the restore again",
				x.vg, s.Name, spec.FormatSize(origin.Size), spec.FormatSize(s.SizeBytes), x.vg, spec.FormatSize(g.Free))
		}
		if err := lvm.Extend(ctx, x.vg, s.Name, s.SizeBytes); err != nil {
			return nil, failed("lvextend", err, "growing %s/%s back to the volume's size", x.vg, s.Name)
		}
		x.o.changed = true
		x.o.step("restore-lv-extended", "lv", x.vg+"/"+s.Name, "size", want)
	}
	// The snapshot's filesystem, taken before a growth, is grown to the
	// LV as a growth does (growing one grown already changes nothing).
	if s.Mode == spec.ModeFilesystem && (r.SnapshotSize == 0 || r.SnapshotSize < s.SizeBytes) {
		if err := x.e.growFS(ctx, x.o, name); err != nil {
			return nil, err
		}
	}
	res := baseResult(s)
	x.o.link = persistentPath(s, x.rec)
	res.PersistentPath = x.o.link
	if err := x.e.linkDevice(ctx, x.o, name, res); err != nil {
		return nil, err
	}
	snapPath, _ := x.e.snapshotPaths(s.UUID, r.Snapshot)
	snap, err := readSnapshot(snapPath)
	if errors.Is(err, os.ErrNotExist) {
		snap, err = nil, nil
	}
	if err != nil {
		return nil, failed("state", err, "reading snapshot %s", r.Snapshot)
	}
	x.out.Warnings = append(x.out.Warnings, r.Warnings...)
	consumed := r.Method != MethodLVMThin
	if !consumed {
		vg, snapName := splitLV(r.SnapshotLV)
		holder, keep := x.byName(snapName), x.byUUID(r.KeepLVUUID)
		switch {
		case r.KeepLVUUID != "" && holder != nil && holder.UUID == r.KeepLVUUID:
			// Renamed already.
		case holder != nil:
			return nil, refused("lv_not_ours", "the volume is restored, and logical volume %s took the name of snapshot %s's since it merged: not renaming the snapshot's copy %s/%s to it; rename or remove %s, then run the restore again", r.SnapshotLV, r.Snapshot, vg, r.KeepLV, r.SnapshotLV)
		case keep == nil || r.KeepLVUUID == "":
			consumed = true
			x.out.Warnings = append(x.out.Warnings, fmt.Sprintf("the copy of snapshot %s kept for it (%s/%s) is gone: the snapshot merged into the volume and is lost; its record is removed", r.Snapshot, vg, r.KeepLV))
		default:
			if err := lvm.Rename(ctx, vg, keep.Name, snapName); err != nil {
				return nil, failed("lvrename", err, "naming the copy of snapshot %s %s", r.Snapshot, r.SnapshotLV)
			}
			x.o.step("restore-renamed", "from", vg+"/"+keep.Name, "to", r.SnapshotLV)
		}
		if !consumed && snap != nil && snap.LVUUID != r.KeepLVUUID {
			snap.LVUUID = r.KeepLVUUID
			if err := writeSnapshot(snapPath, snap); err != nil {
				return nil, failed("state", err, "recording snapshot %s", r.Snapshot)
			}
		}
	}
	if consumed && snap != nil {
		if err := os.Remove(snapPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, failed("state", err, "removing %s", snapPath)
		}
		_ = os.Remove(x.e.snapshotDir(s.UUID)) // only when it is empty
		x.o.step("restore-snapshot-consumed", "snapshot", r.Snapshot)
	}
	if err := os.Remove(x.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, failed("state", err, "removing %s", x.path)
	}
	_ = syncDirOf(filepath.Dir(x.path))
	x.o.step("restored", "snapshot", r.Snapshot)
	res.State, res.Changed = StatePrepared, true
	x.out.Volume, x.out.Method = res, r.Method
	x.out.SameDevice = r.Device != "" && r.Device == name
	x.out.SnapshotConsumed = consumed
	if consumed && r.Method == MethodLVMThick {
		x.out.Warnings = append(x.out.Warnings, fmt.Sprintf("snapshot %s was a thick LVM snapshot: it merged into the volume and is gone (to keep a copy, clone a thick snapshot before restoring it: create --from snapshot/%s)", r.Snapshot, r.Snapshot))
	}
	x.out.Took = time.Since(x.start).Round(time.Millisecond).String()
	return x.out, nil
}
