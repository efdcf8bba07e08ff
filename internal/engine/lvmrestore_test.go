package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/lvm"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

func thickRecord(phase string) *restoreRecord {
	return &restoreRecord{Version: 1, Snapshot: "s1", VolumeUUID: volUUID, Phase: phase, Method: MethodLVMThick,
		SnapshotLV: "vg0/svsnap-3f2504e0-s1", SnapshotLVUUID: "snap", OriginLVUUID: "origin"}
}

func thinRecord(phase string, keepUUID string) *restoreRecord {
	r := thickRecord(phase)
	r.Method, r.OriginThinID, r.SnapshotThinID = MethodLVMThin, "1", "2"
	r.KeepLV, r.KeepLVUUID = keepLVName(volUUID, "s1"), keepUUID
	return r
}

// Every step of a restore, and every point a run can be killed at: what
// the next run does, from the record and what LVM shows.
func TestLVMRestoreNext(t *testing.T) {
	// What LVM shows, by the restore's progress.
	var (
		before       = lvmSeen{Origin: true, OriginActive: true, Snapshot: true, SnapshotActive: true, OriginThinID: "1"}
		kept         = lvmSeen{Origin: true, OriginActive: true, Snapshot: true, Keep: true, OriginThinID: "1"}
		down         = lvmSeen{Origin: true, Snapshot: true, OriginThinID: "1"}
		downChecked  = lvmSeen{Origin: true, Snapshot: true, CheckedValid: true}
		keptDown     = lvmSeen{Origin: true, Snapshot: true, Keep: true, OriginThinID: "1"}
		keptDownOpen = lvmSeen{Origin: true, Snapshot: true, SnapshotActive: true, Keep: true, OriginThinID: "1"}
		asked        = lvmSeen{Origin: true, Snapshot: true, Merging: true, SnapshotMerging: true}
		running      = lvmSeen{Origin: true, OriginActive: true, Snapshot: true, SnapshotActive: true, Merging: true, SnapshotMerging: true, SnapshotPercent: 40}
		merged       = lvmSeen{Origin: true, OriginActive: true}
		thinMerged   = lvmSeen{Origin: true, Keep: true, OriginThinID: "2"}
		thinUp       = lvmSeen{Origin: true, OriginActive: true, Keep: true, OriginThinID: "2"}
		thinGone     = lvmSeen{Origin: true, Keep: true, OriginThinID: "1"}
		noThinIDs    = lvmSeen{Origin: true, Keep: true}
	)
	with := func(o lvmSeen, f func(*lvmSeen)) lvmSeen { f(&o); return o }
	noIDs := func(r *restoreRecord) *restoreRecord { r.OriginThinID, r.SnapshotThinID = "", ""; return r }
	for _, tc := range []struct {
		name string
		r    *restoreRecord
		o    lvmSeen
		want lvmStep
		why  string
	}{
		// Thick: recorded → merging → (checked valid) deactivated →
		// merge asked, recorded → activated (merging) → merged → finished.
		{"thick: recorded (killed after restore-recorded)", thickRecord(lvmRestoreRecorded), before, lvmToMerging, ""},
		{"thick: merging recorded (killed after restore-merging)", thickRecord(lvmRestoreMerging), before, lvmDeactivate, ""},
		{"thick: deactivated by this run, the snapshot seen valid", thickRecord(lvmRestoreMerging), downChecked, lvmMerge, ""},
		{"thick: deactivated by an earlier run (killed after restore-deactivated): active again to look", thickRecord(lvmRestoreMerging), down, lvmActivate, ""},
		{"thick: merge asked, not recorded (killed inside lvconvert or before the record)", thickRecord(lvmRestoreMerging), asked, lvmToMergeAsked, ""},
		{"thick: merge asked, LV inactive (killed after restore-merge-started)", thickRecord(lvmRestoreMergeAsked), asked, lvmActivate, ""},
		{"thick: merge running (killed after restore-activated)", thickRecord(lvmRestoreMergeAsked), running, lvmWait, ""},
		{"thick: merge done, its snapshot LV removed (killed after restore-merge-done)", thickRecord(lvmRestoreMergeAsked), merged, lvmToMerged, ""},
		{"thick: merged recorded (killed after restore-merged, or in finish)", thickRecord(lvmRestoreMerged), merged, lvmFinish, ""},
		{"thick: merged, LV deactivated since", thickRecord(lvmRestoreMerged), lvmSeen{Origin: true}, lvmActivate, ""},
		{"thick: a reboot activated the LV mid-way: deactivated again", thickRecord(lvmRestoreMerging), before, lvmDeactivate, ""},

		// Thin: recorded → KeepLV → kept → merging → deactivated (and the
		// snapshot's LV) → merged at once, recorded → activated → finished.
		{"thin: recorded (killed after restore-recorded)", thinRecord(lvmRestoreRecorded, ""), before, lvmKeep, ""},
		{"thin: KeepLV made, not recorded (killed after restore-keep-created): removed, taken again", thinRecord(lvmRestoreRecorded, ""), with(before, func(o *lvmSeen) { o.KeepStale = true }), lvmDropKeep, ""},
		{"thin: kept (killed after restore-kept)", thinRecord(lvmRestoreKept, "k"), kept, lvmToMerging, ""},
		{"thin: kept, KeepLV removed by hand since", thinRecord(lvmRestoreKept, "k"), before, lvmKeep, ""},
		{"thin: merging recorded (killed after restore-merging)", thinRecord(lvmRestoreMerging, "k"), kept, lvmDeactivate, ""},
		{"thin: merging, KeepLV removed by hand before the merge", thinRecord(lvmRestoreMerging, "k"), down, lvmKeep, ""},
		{"thin: deactivated, the snapshot's LV active: deactivated too", thinRecord(lvmRestoreMerging, "k"), keptDownOpen, lvmDeactivateSnapshot, ""},
		{"thin: deactivated (killed after restore-deactivated)", thinRecord(lvmRestoreMerging, "k"), keptDown, lvmMerge, ""},
		{"thin: merged at once, not recorded (killed inside lvconvert or before the record)", thinRecord(lvmRestoreMerging, "k"), thinMerged, lvmToMergeAsked, ""},
		{"thin: merged at once (killed after restore-merge-started)", thinRecord(lvmRestoreMergeAsked, "k"), thinMerged, lvmToMerged, ""},
		{"thin: merged recorded, LV inactive (killed after restore-merged)", thinRecord(lvmRestoreMerged, "k"), thinMerged, lvmActivate, ""},
		{"thin: merged, active (killed after restore-activated, or in finish)", thinRecord(lvmRestoreMerged, "k"), thinUp, lvmFinish, ""},
		{"thin: merge delayed, not recorded", thinRecord(lvmRestoreMerging, "k"), lvmSeen{Origin: true, Snapshot: true, Merging: true, SnapshotMerging: true, Keep: true}, lvmToMergeAsked, ""},
		{"thin: merge delayed, LV inactive", thinRecord(lvmRestoreMergeAsked, "k"), lvmSeen{Origin: true, Snapshot: true, Merging: true, SnapshotMerging: true, Keep: true}, lvmActivate, ""},
		{"thin: merge delayed, LV active", thinRecord(lvmRestoreMergeAsked, "k"), lvmSeen{Origin: true, OriginActive: true, Snapshot: true, Merging: true, SnapshotMerging: true, Keep: true}, lvmWait, ""},
		{"thin: thin ids not reported, merge asked: gone counts as merged", noIDs(thinRecord(lvmRestoreMergeAsked, "k")), noThinIDs, lvmToMerged, ""},

		// Nothing merged and no run can go on: rolled back (#5, #8).
		{"thick: the snapshot's LV removed by hand after restore-deactivated (merge not asked)", thickRecord(lvmRestoreMerging), lvmSeen{Origin: true}, lvmRollback, "nothing was merged"},
		{"thick: the snapshot's LV removed by hand, LV active, merge not asked", thickRecord(lvmRestoreMerging), merged, lvmRollback, "nothing was merged"},
		{"the snapshot's LV was removed before anything", thickRecord(lvmRestoreRecorded), merged, lvmRollback, "nothing was merged"},
		{"thin: kept, the snapshot's LV removed by hand", thinRecord(lvmRestoreKept, "k"), lvmSeen{Origin: true, OriginActive: true, Keep: true, OriginThinID: "1"}, lvmRollback, "nothing was merged"},
		{"thin: the snapshot removed before it merged, merge not asked", thinRecord(lvmRestoreMerging, "k"), thinGone, lvmRollback, "nothing was merged"},
		{"thin: the snapshot removed while its merge was put off", thinRecord(lvmRestoreMergeAsked, "k"), thinGone, lvmRollback, "removed before it merged"},
		{"thick: overflowed before the merge, LV active (#6)", thickRecord(lvmRestoreMerging), with(before, func(o *lvmSeen) { o.SnapshotInvalid = true }), lvmRollback, "overflowed"},

		// Cannot tell, or cannot go on: never success.
		{"thin: gone, thin ids not reported, merge not recorded as asked", noIDs(thinRecord(lvmRestoreMerging, "k")), noThinIDs, lvmStuck, "cannot tell whether it merged"},
		{"thick: merge asked, the snapshot there and not merging", thickRecord(lvmRestoreMergeAsked), before, lvmStuck, "not merging"},
		{"thick: the merging snapshot is invalid: the kernel stopped the merge (#6)", thickRecord(lvmRestoreMergeAsked), with(running, func(o *lvmSeen) { o.SnapshotInvalid = true }), lvmToInvalid, ""},
		{"thick: phase invalid", thickRecord(lvmRestoreInvalid), running, lvmStuck, "lvremove vg0/svsnap-3f2504e0-s1"},
		{"the volume's LV is gone", thickRecord(lvmRestoreMerging), lvmSeen{}, lvmStuck, "is gone"},

		// Refusals and failures: the record stays, a later run goes on.
		{"LVM says the merge failed", thickRecord(lvmRestoreMergeAsked), lvmSeen{Origin: true, OriginActive: true, Merging: true, MergeFailed: true}, lvmFail, "merge"},
		{"someone else's merge into the LV", thickRecord(lvmRestoreRecorded), with(before, func(o *lvmSeen) { o.Merging = true }), lvmFail, "did not ask for"},
		{"thin: another thin snapshot of the LV merging (#12)", thinRecord(lvmRestoreKept, "k"), with(kept, func(o *lvmSeen) { o.OtherMerging = true }), lvmFail, "did not ask for"},
		{"thin: another merging, at the merge", thinRecord(lvmRestoreMerging, "k"), with(keptDown, func(o *lvmSeen) { o.OtherMerging = true }), lvmFail, "did not ask for"},
		{"thin: an LV not ours took KeepLV's name", thinRecord(lvmRestoreRecorded, ""), lvmSeen{Origin: true, OriginActive: true, Snapshot: true, KeepForeign: true}, lvmFail, "not this restore's copy"},
		{"an unknown phase", thickRecord("swapping"), before, lvmFail, "not one this salt-volume-exec knows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := lvmRestoreNext(tc.r, tc.o)
			assert.Equal(t, tc.want, got, why)
			if tc.why != "" {
				assert.Contains(t, why, tc.why)
			}
		})
	}
}

// Rolled back only while the merge was not asked for.
func TestLVMRestoreRollbackable(t *testing.T) {
	assert.True(t, rollbackable(thickRecord(lvmRestoreRecorded), lvmSeen{Origin: true, OriginActive: true, Snapshot: true}))
	assert.True(t, rollbackable(thickRecord(lvmRestoreMerging), lvmSeen{Origin: true, Snapshot: true}), "deactivated, not merged")
	assert.False(t, rollbackable(thickRecord(lvmRestoreMerging), lvmSeen{Origin: true, Snapshot: true, Merging: true}), "merge asked")
	assert.False(t, rollbackable(thickRecord(lvmRestoreMerging), lvmSeen{Origin: true, OriginActive: true}), "merged")
	assert.False(t, rollbackable(thickRecord(lvmRestoreMergeAsked), lvmSeen{Origin: true, Snapshot: true}), "phase merge-asked")
	assert.False(t, rollbackable(thinRecord(lvmRestoreMerged, "k"), lvmSeen{Origin: true, Snapshot: true}), "phase merged")
}

// lvs -a as lvm2 2.03 prints it while a thick snapshot merges (origin
// attr O, the snapshot hidden, lv_merging on both), and for a thin
// restore once merged (KeepLV's origin is the volume's LV then).
func TestLVMSee(t *testing.T) {
	lvs, err := lvm.ParseAll([]byte(`{"report":[{"lv":[
	  {"lv_name":"data-1","vg_name":"vg0","lv_uuid":"origin","lv_active":"active","origin":"","pool_lv":"","lv_attr":"Owi-a-s---","lv_merging":"merging","lv_merge_failed":"","thin_id":""},
	  {"lv_name":"[svsnap-3f2504e0-s1]","vg_name":"vg0","lv_uuid":"snap","lv_active":"active","origin":"data-1","pool_lv":"","lv_attr":"Swi-a-s---","lv_merging":"merging","lv_merge_failed":"","thin_id":""}]}]}`))
	require.NoError(t, err)
	assert.Equal(t, lvmSeen{Origin: true, OriginActive: true, Merging: true, Snapshot: true, SnapshotMerging: true, SnapshotActive: true, SnapshotPercent: -1},
		lvmSee(lvs, thickRecord(lvmRestoreMergeAsked), snapshotTag(volUUID, "s1")))
	lvs[1].Invalid = true
	assert.True(t, lvmSee(lvs, thickRecord(lvmRestoreMergeAsked), snapshotTag(volUUID, "s1")).SnapshotInvalid, "an invalid merging snapshot")
	lvs[1].Invalid, lvs[1].DataPercent = false, 100
	assert.True(t, lvmSee(lvs, thickRecord(lvmRestoreMergeAsked), snapshotTag(volUUID, "s1")).SnapshotInvalid, "a full one")
	lvs[1].Active, lvs[1].DataPercent = false, -1
	assert.False(t, lvmSee(lvs, thickRecord(lvmRestoreMergeAsked), snapshotTag(volUUID, "s1")).SnapshotInvalid, "inactive: not known")

	tag := snapshotTag(volUUID, "s1")
	keep := keepLVName(volUUID, "s1")
	lvs, err = lvm.ParseAll([]byte(`{"report":[{"lv":[
	  {"lv_name":"data-1","vg_name":"vg0","lv_uuid":"origin","lv_active":"","origin":"","pool_lv":"pool","lv_merging":"","thin_id":"2"},
	  {"lv_name":"` + keep + `","vg_name":"vg0","lv_uuid":"k","lv_active":"","origin":"svsnap-3f2504e0-s1","pool_lv":"pool","lv_tags":"` + tag + `","lv_merging":"","thin_id":"3"}]}]}`))
	require.NoError(t, err)
	assert.Equal(t, lvmSeen{Origin: true, OriginThinID: "2", KeepStale: true, SnapshotPercent: -1}, lvmSee(lvs, thinRecord(lvmRestoreRecorded, ""), tag), "ours by name, tag and origin, its UUID not recorded: stale, never adopted (#15)")
	assert.Equal(t, lvmSeen{Origin: true, OriginThinID: "2", Keep: true, SnapshotPercent: -1}, lvmSee(lvs, thinRecord(lvmRestoreKept, "k"), tag), "by its UUID once recorded")
	assert.Equal(t, lvmSeen{Origin: true, OriginThinID: "2", KeepForeign: true, SnapshotPercent: -1}, lvmSee(lvs, thinRecord(lvmRestoreKept, "other"), tag), "another LV under its name")
	lvs[1].Tags = nil
	assert.Equal(t, lvmSeen{Origin: true, OriginThinID: "2", KeepForeign: true, SnapshotPercent: -1}, lvmSee(lvs, thinRecord(lvmRestoreRecorded, ""), tag), "untagged: not ours")

	// Another thin snapshot of the volume merging: LVM sets lv_merging on
	// it, not on the thin origin (#12).
	lvs = append(lvs, lvm.LV{Name: "hand", VG: "vg0", UUID: "h", Origin: "data-1", Pool: "pool", Merging: true})
	assert.True(t, lvmSee(lvs, thinRecord(lvmRestoreKept, "k"), tag).OtherMerging)
}

func lvmSpec(t *testing.T) (*spec.Spec, *nodestate.Record) {
	t.Helper()
	s := &spec.Spec{Name: "data-1", UUID: volUUID, Mode: spec.ModeFilesystem, FSType: spec.FSExt4,
		LVMLogicalVolume: &spec.LVMLogicalVolume{VGName: "vg0", Size: "32Mi"}}
	require.NoError(t, s.Validate())
	return s, &nodestate.Record{Spec: s, Phase: nodestate.PhasePrepared, LVUUID: "origin"}
}

// The checks of a new restore, from what lvs -a shows: each refusal names
// the fix and changes nothing (lvmRestorePlan only reads).
func TestLVMRestorePlan(t *testing.T) {
	s, rec := lvmSpec(t)
	tag := snapshotTag(volUUID, "s1")
	vtag := lvTag(s)
	thick := &Snapshot{Name: "s1", VolumeUUID: volUUID, Phase: SnapshotTaken, LV: "vg0/svsnap-3f2504e0-s1", LVUUID: "snap", Method: MethodLVMThick, Size: 32 << 20}
	thin := *thick
	thin.Method = MethodLVMThin
	origin := lvm.LV{Name: "data-1", VG: "vg0", UUID: "origin", Tags: []string{vtag}, Active: true, DataPercent: -1}
	snapLV := lvm.LV{Name: "svsnap-3f2504e0-s1", VG: "vg0", UUID: "snap", Tags: []string{tag}, Origin: "data-1", Active: true, DataPercent: 10}
	thinOrigin := origin
	thinOrigin.Pool, thinOrigin.ThinID = "pool", "1"
	thinSnap := snapLV
	thinSnap.Pool, thinSnap.ThinID, thinSnap.Active, thinSnap.DataPercent = "pool", "2", false, -1
	with := func(lvs ...lvm.LV) []lvm.LV { return lvs }
	mod := func(l lvm.LV, f func(*lvm.LV)) lvm.LV { f(&l); return l }

	r, warn, err := lvmRestorePlan(s, rec, thick, with(origin, snapLV))
	require.NoError(t, err)
	assert.Empty(t, warn)
	assert.Equal(t, MethodLVMThick, r.Method)
	assert.Equal(t, lvmRestoreRecorded, r.Phase)
	assert.Equal(t, "snap", r.SnapshotLVUUID)
	assert.Equal(t, "origin", r.OriginLVUUID)
	assert.Equal(t, int64(32<<20), r.SnapshotSize)
	assert.Empty(t, r.KeepLV, "a thick snapshot is used up: nothing kept")

	other := mod(thinSnap, func(l *lvm.LV) {
		l.Name, l.UUID, l.Tags = "svsnap-3f2504e0-t2", "t2", []string{snapshotTag(volUUID, "t2")}
	})
	r, warn, err = lvmRestorePlan(s, rec, &thin, with(thinOrigin, thinSnap, other))
	require.NoError(t, err)
	assert.Equal(t, MethodLVMThin, r.Method)
	assert.Equal(t, "1", r.OriginThinID)
	assert.Equal(t, "2", r.SnapshotThinID)
	assert.Equal(t, "svkeep-3f2504e0-s1", r.KeepLV)
	require.Len(t, warn, 1)
	assert.Contains(t, warn[0], "snapshots t2 of data-1", "the volume's other thin snapshots: unlinked by the merge")

	// A KeepLV of an earlier run (ours, of the snapshot) does not stop
	// the restore: it is removed and taken again (lvmDropKeep).
	leftover := mod(thinSnap, func(l *lvm.LV) { l.Name, l.UUID, l.Origin = r.KeepLV, "k", thinSnap.Name })
	_, _, err = lvmRestorePlan(s, rec, &thin, with(thinOrigin, thinSnap, leftover))
	require.NoError(t, err)

	for _, tc := range []struct {
		name       string
		snap       *Snapshot
		lvs        []lvm.LV
		kind       int
		code, with string
	}{
		{"the snapshot of another volume", func() *Snapshot { x := *thick; x.VolumeUUID = "9b2f0c1e-1111-4222-8333-444455556666"; return &x }(), with(origin, snapLV), KindRefused, "snapshot_mismatch", "not of data-1"},
		{"a sparse volume's snapshot", func() *Snapshot { x := *thick; x.LV = ""; return &x }(), with(origin, snapLV), KindRefused, "snapshot_mismatch", "not an LVM snapshot"},
		{"the volume's LV gone", thick, with(snapLV), KindFailed, "lv_missing", "is not on this node"},
		{"the volume's LV lost our tag", thick, with(mod(origin, func(l *lvm.LV) { l.Tags = nil }), snapLV), KindRefused, "lv_not_ours", "lacks the tag"},
		{"another merge into the LV", thick, with(mod(origin, func(l *lvm.LV) { l.Merging = true }), snapLV), KindRefused, "merge_pending", "wait until it has finished"},
		{"thin: another thin snapshot of the LV merging (lv_merging on it, #12)", &thin, with(thinOrigin, thinSnap, lvm.LV{Name: "hand", VG: "vg0", UUID: "h", Origin: "data-1", Pool: "pool", Merging: true}), KindRefused, "merge_pending", "vg0/hand merging"},
		{"the snapshot's LV gone", thick, with(origin), KindFailed, "snapshot_missing", "delete the snapshot"},
		{"the snapshot's LV lost its tag", thick, with(origin, mod(snapLV, func(l *lvm.LV) { l.Tags = nil })), KindRefused, "lv_not_ours", "not touching it"},
		{"another LV under the snapshot's name", thick, with(origin, mod(snapLV, func(l *lvm.LV) { l.UUID = "x" })), KindRefused, "lv_not_ours", "LVM UUID changed"},
		{"thick, overflowed", thick, with(origin, mod(snapLV, func(l *lvm.LV) { l.Invalid = true })), KindRefused, "snapshot_invalid", "overflowed"},
		{"thick, full", thick, with(origin, mod(snapLV, func(l *lvm.LV) { l.DataPercent = 100 })), KindRefused, "snapshot_invalid", "delete the snapshot"},
		{"thin, unlinked by an earlier restore", &thin, with(thinOrigin, mod(thinSnap, func(l *lvm.LV) { l.Origin = "" })), KindRefused, "snapshot_unlinked", "clone it instead"},
		{"thin, the LV has thick snapshots", &thin, with(thinOrigin, thinSnap, lvm.LV{Name: "hand", VG: "vg0", UUID: "h", Origin: "data-1"}), KindRefused, "restore_unsupported", "vg0/hand"},
		{"thin, an LV not ours has KeepLV's name", &thin, with(thinOrigin, thinSnap, lvm.LV{Name: "svkeep-3f2504e0-s1", VG: "vg0", UUID: "h"}), KindRefused, "lv_not_ours", "svkeep-3f2504e0-s1"},
		{"the record says thick, LVM thin", thick, with(thinOrigin, thinSnap), KindRefused, "snapshot_mismatch", "its record says lvm-thick"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := lvmRestorePlan(s, rec, tc.snap, tc.lvs)
			wantErr(t, err, tc.kind, tc.code, tc.with)
			if tc.kind == KindRefused {
				assert.Contains(t, AsError(err).Message, "nothing was changed")
			}
		})
	}
}

// While an LVM restore is unfinished, growing the volume, taking a
// snapshot of it and deleting the snapshot restored from are refused
// (restore_pending), naming how to finish it; other snapshots are deleted.
func TestLVMRestorePendingRefusals(t *testing.T) {
	e := New(t.TempDir(), nil)
	s, rec := lvmSpec(t)
	require.NoError(t, e.State.Init())
	require.NoError(t, e.State.Save(rec))
	_, err := e.State.RestoresDir()
	require.NoError(t, err)
	r := thickRecord(lvmRestoreMerging)
	r.StartedAt = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	require.NoError(t, writeRecord(e.lvmRestorePath(volUUID), r))
	st, err := os.Stat(filepath.Join(e.State.Root, "restores"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "root's only")

	err = e.refuseRestorePending(s, "", "growing it to 64Mi")
	wantErr(t, err, KindRefused, "restore_pending", "growing it to 64Mi is refused: finish it by running the restore again (salt-volume-exec snapshot-restore --name s1")
	assert.Contains(t, AsError(err).Message, "phase merging")
	err = e.DeleteSnapshot(context.Background(), s, "s1")
	wantErr(t, err, KindRefused, "restore_pending", "deleting snapshot s1 is refused")
	require.NoError(t, e.refuseRestorePending(s, "s2", "deleting snapshot s2"), "another snapshot is not held")
	require.NoError(t, e.DeleteSnapshot(context.Background(), s, "s2"), "nothing of s2 here: done")
	_, err = e.TakeSnapshot(context.Background(), s, "s3", SnapshotOptions{})
	wantErr(t, err, KindRefused, "restore_pending", "taking snapshot s3 is refused")

	_, err = e.Unprepare(context.Background(), s, UnprepareOptions{Wipe: true})
	wantErr(t, err, KindRefused, "restore_pending", "deleting the volume is refused")

	// A record this build cannot read is not passed over.
	require.NoError(t, os.WriteFile(e.lvmRestorePath(volUUID), []byte(`{"version":2,"snapshot":"s1","volumeUUID":"`+volUUID+`"}`), 0o600))
	wantErr(t, e.refuseRestorePending(s, "", "growing it"), KindFailed, "state", "newer than this salt-volume-exec reads")
}

// A thick merge writes back every chunk the snapshot holds, and the kernel
// first copies the old contents of each into every other thick snapshot
// of the volume: one with less free copy-on-write space than the merging
// snapshot uses would overflow and be dropped, so the restore is refused
// naming it and how to make room (#1).
func TestLVMRestorePlanThickSiblings(t *testing.T) {
	s, rec := lvmSpec(t)
	thick := &Snapshot{Name: "s1", VolumeUUID: volUUID, Phase: SnapshotTaken, LV: "vg0/svsnap-3f2504e0-s1", LVUUID: "snap", Method: MethodLVMThick, Size: 32 << 20}
	origin := lvm.LV{Name: "data-1", VG: "vg0", UUID: "origin", Tags: []string{lvTag(s)}, Active: true, DataPercent: -1}
	// 8Mi of copy-on-write space, half used: up to 4Mi written back.
	snapLV := lvm.LV{Name: "svsnap-3f2504e0-s1", VG: "vg0", UUID: "snap", Tags: []string{snapshotTag(volUUID, "s1")}, Origin: "data-1", Active: true, Size: 8 << 20, DataPercent: 50}
	sib := func(size int64, pct float64, f ...func(*lvm.LV)) lvm.LV {
		l := lvm.LV{Name: "svsnap-3f2504e0-s2", VG: "vg0", UUID: "s2", Origin: "data-1", Active: true, Size: size, DataPercent: pct}
		for _, g := range f {
			g(&l)
		}
		return l
	}
	for _, tc := range []struct {
		name  string
		lvs   []lvm.LV
		with  []string // "" : accepted
		notIn string
	}{
		{"no other snapshot", []lvm.LV{origin, snapLV}, nil, ""},
		{"a sibling with room (8Mi free)", []lvm.LV{origin, snapLV, sib(16<<20, 50)}, nil, ""},
		{"a sibling with just the room", []lvm.LV{origin, snapLV, sib(8<<20, 50)}, nil, ""},
		{"a sibling too small: named, with lvextend", []lvm.LV{origin, snapLV, sib(8<<20, 75)},
			[]string{"vg0/svsnap-3f2504e0-s2 has 2Mi free", "lvextend -L +2Mi vg0/svsnap-3f2504e0-s2", "or delete that snapshot", "up to 4Mi", "nothing was changed"}, ""},
		{"an operator's thick snapshot too small", []lvm.LV{origin, snapLV, sib(4<<20, 10, func(l *lvm.LV) { l.Name, l.UUID = "backup", "b" })},
			[]string{"vg0/backup has", "lvextend -L +"}, ""},
		{"how full a sibling is does not show", []lvm.LV{origin, snapLV, sib(64<<20, -1)}, []string{"LVM shows not how full it is"}, ""},
		{"an invalid sibling is dropped already: not counted", []lvm.LV{origin, snapLV, sib(1<<20, 100, func(l *lvm.LV) { l.Invalid = true })}, nil, ""},
		{"a thin LV is no thick sibling", []lvm.LV{origin, snapLV, sib(1<<20, 99, func(l *lvm.LV) { l.Pool = "pool" })}, nil, ""},
		{"the merging snapshot's fill unknown: its whole size counts", []lvm.LV{origin, mod2(snapLV, func(l *lvm.LV) { l.DataPercent = -1 }), sib(16<<20, 60)},
			[]string{"up to 8Mi", "lvextend -L +2Mi"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := lvmRestorePlan(s, rec, thick, tc.lvs)
			if tc.with == nil {
				require.NoError(t, err)
				return
			}
			wantErr(t, err, KindRefused, "cow_too_small", tc.with[0])
			for _, w := range tc.with[1:] {
				assert.Contains(t, AsError(err).Message, w)
			}
		})
	}
}

func mod2(l lvm.LV, f func(*lvm.LV)) lvm.LV { f(&l); return l }

// From merge-asked on, a failure is restore_unfinished, saying the volume
// holds the snapshot's data and to run the restore again; before, it is
// what it was (#4).
func TestLVMRestoreUnfinished(t *testing.T) {
	s, rec := lvmSpec(t)
	e := New(t.TempDir(), nil)
	for _, tc := range []struct {
		phase string
		code  string
	}{
		{lvmRestoreRecorded, "lvchange"},
		{lvmRestoreMerging, "lvchange"},
		{lvmRestoreMergeAsked, "restore_unfinished"},
		{lvmRestoreMerged, "restore_unfinished"},
	} {
		t.Run(tc.phase, func(t *testing.T) {
			x := &lvmRun{e: e, o: opFor(e, s), rec: rec, r: thickRecord(tc.phase)}
			err := AsError(x.unfinished(failed("lvchange", nil, "activating vg0/data-1")))
			assert.Equal(t, tc.code, err.Code)
			assert.Equal(t, KindFailed, err.Kind)
			assert.Contains(t, err.Message, "activating vg0/data-1")
			if tc.code == "restore_unfinished" {
				assert.True(t, strings.HasPrefix(err.Message, "restore_unfinished: volume data-1 already holds"), err.Message)
				assert.Contains(t, err.Message, "run it again to finish it")
				assert.Equal(t, err, AsError(x.unfinished(err)), "not wrapped twice")
			}
		})
	}
}

// A snapshot an unfinished LVM restore merges is listed as being
// restored, not lost (#14).
func TestLVMRestoreSnapshotIsRestoringNotLost(t *testing.T) {
	e := New(t.TempDir(), nil)
	require.NoError(t, e.State.Init())
	_, err := e.State.RestoresDir()
	require.NoError(t, err)
	require.NoError(t, writeRecord(e.lvmRestorePath(volUUID), thickRecord(lvmRestoreMergeAsked)))
	snaps := []*Snapshot{
		{Name: "s1", VolumeUUID: volUUID, Phase: SnapshotTaken, LV: "vg0/svsnap-3f2504e0-s1", LVUUID: "snap"},
		{Name: "s2", VolumeUUID: volUUID, Phase: SnapshotTaken, LV: "vg0/svsnap-3f2504e0-s2", LVUUID: "s2"},
	}
	fillFrom(snaps, []lvm.LV{{Name: "data-1", VG: "vg0", UUID: "origin"}})
	e.restoringNotLost(snaps)
	assert.False(t, snaps[0].Lost)
	assert.Contains(t, snaps[0].Warning, "being restored into its volume")
	assert.True(t, snaps[1].Lost, "another snapshot gone is lost")
}
