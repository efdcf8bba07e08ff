package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/freeze"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
)

// RestoreReport is restore's output.
type RestoreReport struct {
	// ID tells one run from another: the beacon reports each run once.
	ID      string    `json:"id"`
	At      time.Time `json:"at"`
	Boot    string    `json:"boot,omitempty"`
	Volumes []*Result `json:"volumes"`
	Orphans []*Result `json:"orphans"`
	// Restored counts the volumes this run rebuilt something of (a loop
	// device, a partition, a link, an opened container); Intact those it
	// found whole. A run after the boot's (the beacon's, one by hand)
	// must not count a volume rebuilt twice.
	Restored int `json:"restored"`
	Intact   int `json:"intact"`
	Failed   int `json:"failed"`
	// Locked counts encrypted volumes left closed: their key is the
	// master's (provider master), which a boot without Salt has not got.
	Locked int `json:"locked,omitempty"`
	// Earlier holds the counts of the runs before this one, oldest first:
	// a run may follow another before the control plane has read the
	// first (the beacon opens a master-key volume right after the boot's
	// run), and each run's counts must reach it.
	Earlier []RestoreCounts `json:"earlier,omitempty"`
}

// RestoreCounts is what the control plane counts of one restore run.
type RestoreCounts struct {
	ID       string    `json:"id"`
	At       time.Time `json:"at"`
	Boot     string    `json:"boot,omitempty"`
	Restored int       `json:"restored"`
	Intact   int       `json:"intact"`
	Failed   int       `json:"failed"`
	Locked   int       `json:"locked,omitempty"`
}

// keptRestores bounds Earlier: runs come from a boot, the beacon and an
// operator, and the control plane reads them within a heartbeat; older
// ones are long counted.
const keptRestores = 8

// bootID names this boot; a variable so tests can stage a reboot.
var bootID = freeze.BootID

// Restore rebuilds, from the node state alone, what a reboot takes away:
// loop devices, partition nodes and persistent links. It needs neither the
// network nor Salt, changes no volume content, and deletes nothing.
func (e *Engine) Restore(ctx context.Context) (*RestoreReport, error) {
	now := time.Now().UTC()
	rep := &RestoreReport{ID: strconv.FormatInt(now.UnixNano(), 36), At: now, Boot: bootID(), Volumes: []*Result{}, Orphans: []*Result{}}
	recs, errs := e.State.All()
	for _, err := range errs {
		rep.Failed++
		rep.Volumes = append(rep.Volumes, &Result{State: StateMissing, Error: err.Error()})
	}
	known := map[string]bool{}
	for _, rec := range recs {
		known[rec.Spec.UUID] = true
		res, withheld := e.restoreOne(ctx, rec)
		switch {
		case withheld && res.State == StateLocked:
			rep.Locked++ // as a boot without Salt must leave it
		case res.Error != "":
			rep.Failed++
		case res.State == StatePrepared && res.Changed:
			rep.Restored++
		case res.State == StatePrepared:
			rep.Intact++
		}
		rep.Volumes = append(rep.Volumes, res)
	}
	rep.Orphans = append(rep.Orphans, e.orphans(known)...)
	// Kept for the beacon, which tells the control plane what the last
	// restore (at boot, outside Salt) rebuilt and what it could not.
	if err := e.saveRestore(rep); err != nil {
		e.Log.Warn("restore report not saved", "error", err)
	}
	return rep, nil
}

// saveRestore writes rep as the last report, carrying the counts of the
// runs before it; the lock keeps two runs from each dropping
// the other's counts.
func (e *Engine) saveRestore(rep *RestoreReport) error {
	if err := e.State.Init(); err != nil {
		return err
	}
	l, err := e.State.Lock("restore-report")
	if err != nil {
		return err
	}
	defer l.Unlock()
	// An unreadable last report only loses the earlier counts. They are
	// kept across a reboot too: a node may reboot before the control
	// plane read its last run, and it skips by id the runs it counted.
	if prev, err := e.LastRestore(); err == nil && prev != nil {
		rep.Earlier = append(rep.Earlier[:0], prev.Earlier...)
		if prev.ID != rep.ID {
			rep.Earlier = append(rep.Earlier, prev.counts())
		}
		if n := len(rep.Earlier); n > keptRestores {
			rep.Earlier = rep.Earlier[n-keptRestores:]
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	return nodestate.WriteFileAtomic(e.State.RestoreReport(), append(b, '\n'), 0o600)
}

func (r *RestoreReport) counts() RestoreCounts {
	return RestoreCounts{ID: r.ID, At: r.At, Boot: r.Boot, Restored: r.Restored, Intact: r.Intact, Failed: r.Failed, Locked: r.Locked}
}

// LastRestore reads the report of the last restore run (nil if none).
func (e *Engine) LastRestore() (*RestoreReport, error) {
	b, err := os.ReadFile(e.State.RestoreReport())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rep RestoreReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", e.State.RestoreReport(), err)
	}
	return &rep, nil
}

// restoreOne restores one volume; withheld says its container was left
// closed for want of a key the master keeps (a wrong key is a failure).
func (e *Engine) restoreOne(ctx context.Context, rec *nodestate.Record) (*Result, bool) {
	s := rec.Spec
	lock, err := e.lockVolume(s.UUID)
	if err != nil {
		res := baseResult(s)
		res.Error = err.Error()
		return res, false
	}
	defer lock.Unlock()
	// Re-read under the lock: a prepare or unprepare may have just finished.
	if rec, err = e.State.Load(s.UUID); err != nil || rec == nil {
		res := baseResult(s)
		res.State = StateAbsent
		return res, false
	}
	o := &op{e: e, s: s}
	res := e.inspect(s, rec)
	switch res.State {
	case StateDamaged:
		e.dropStaleLink(o, res)
		return res, false
	case StateIncomplete:
		// Finishing a half-done prepare is prepare's job, with its checks.
		res.Warnings = append(res.Warnings, "a prepare of this volume did not finish: run prepare again")
		return res, false
	case StateMissing:
		if s.LVMLogicalVolume != nil {
			res.Error = "" // an LV the boot did not activate: restoreLVM does
			break
		}
		if s.RawBlockDevice == nil {
			e.dropStaleLink(o, res)
			return res, false
		}
		// A Block volume whose table is there but whose partition the kernel
		// never learned of (no GPT parser) is found and added here.
		name := e.locateRaw(rec, true)
		if name == "" {
			e.dropStaleLink(o, res)
			return res, false
		}
		// Missing a moment ago, there now: rebuilt by this run.
		o.changed = true
		res.Error = ""
	}
	// A restore in place that a crash or a reboot cut short is finished
	// only by running it again (never by itself): say so with the result,
	// so the beacon carries it to the operator.
	pending := e.pendingRestoreWarning(s.UUID)
	var err2 error
	switch {
	case s.SparseLoopDevice != nil:
		err2 = e.restoreSparse(ctx, o, res)
	case s.LVMLogicalVolume != nil:
		err2 = e.restoreLVM(ctx, o, rec, res)
	default:
		err2 = e.restoreRaw(ctx, o, rec, res)
	}
	if err2 != nil {
		res.Error = AsError(err2).Message
		res.Warnings = append(res.Warnings, pending...)
		return res, false
	}
	fresh := e.inspect(s, rec)
	fresh.Changed = o.changed
	fresh.Warnings = append(fresh.Warnings, pending...)
	return fresh, o.keyWithheld
}

// pendingRestoreWarning names a restore of volume u that did not finish
// (its record still there), and how to finish it.
func (e *Engine) pendingRestoreWarning(u string) []string {
	sparse, _ := e.restorePaths(u)
	for _, p := range []string{e.lvmRestorePath(u), sparse} {
		rr, err := readRestore(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return []string{fmt.Sprintf("a restore record of this volume is unreadable (%v): look at %s", err, p)}
		}
		return []string{fmt.Sprintf("a restore from snapshot %s (started %s, phase %s) did not finish: run it again to finish it (salt-volume-exec snapshot-restore --name %s, or the API's or Salt's restore); until then growing and deleting the volume are refused",
			rr.Snapshot, rr.StartedAt.Format(time.RFC3339), rr.Phase, rr.Snapshot)}
	}
	return nil
}

func (e *Engine) restoreSparse(ctx context.Context, o *op, res *Result) error {
	dev, err := e.ensureLoop(ctx, o, e.State.SparseFile(o.s.UUID), false)
	if err != nil {
		return err
	}
	if encrypted(o.s) {
		// Opened, never written: restore changes no volume content.
		dm, err := e.openContainer(ctx, o, dev.Name)
		if err != nil && AsError(err).Code == "key_needed" {
			// Attached, left closed: the volume is Locked until the
			// master hands its key over (a restore or a state run from
			// Salt). Not a failure of the boot's restore.
			o.keyWithheld = true
			return nil
		}
		if err != nil {
			return err
		}
		return e.linkOpened(ctx, o, dm, res)
	}
	return e.finishDevice(ctx, o, dev.Name, res)
}

func (e *Engine) restoreRaw(ctx context.Context, o *op, rec *nodestate.Record, res *Result) error {
	name := e.locateRaw(rec, false)
	if name == "" {
		// A Block partition the kernel was not told of: added from the
		// table, which this run's report counts as rebuilt.
		if name = e.locateRaw(rec, true); name != "" {
			o.changed = true
		}
	}
	if name == "" {
		return failed("device", nil, "no device on this node matches the record of volume %s", o.s.UUID)
	}
	// findRaw returned the device that is the volume (the partition in
	// Block mode, added to the kernel if it was missing): link it.
	o.link = persistentPath(o.s, rec)
	return e.linkDevice(ctx, o, name, res)
}

// dropStaleLink removes the persistent link of a volume restore cannot
// bring back, when it dangles or names a device that does not carry the
// volume (a loop number reused after a reboot): a stale link would hand
// someone else's device to whatever opens the path.
func (e *Engine) dropStaleLink(o *op, res *Result) {
	if err := e.removeLink(o, ""); err != nil {
		res.Warnings = append(res.Warnings, err.Error())
	}
}
