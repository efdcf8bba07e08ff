package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/salt-volumes/salt-volumes/internal/filecopy"
	"github.com/salt-volumes/salt-volumes/internal/freeze"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// A mounted sparse volume's snapshot freezes its filesystem (FIFREEZE) so
// that the copy is of one instant; writers wait meanwhile, so the freeze
// is held only around a step known to be short, and never past a limit:
//
//   - where the state dir shares extents (xfs with reflink, btrfs): the
//     reflink, which costs no time per byte;
//   - elsewhere: the copy is made unfrozen first, then brought up to date
//     by passes that read the volume's file and the copy and rewrite the
//     blocks that differ (filecopy.Update), timed: once a pass over the
//     whole data takes at most half the limit, one more pass is made
//     frozen, which is expected to take no longer; after
//     maxUnfrozenPasses without one, the snapshot is refused before
//     anything is frozen. A frozen pass that overruns anyway is abandoned
//     at the limit and the filesystem thawed.
//
// The freeze itself is made by a watchdog process (internal/freeze) that
// thaws when this run dies, so that no kill leaves a filesystem frozen.

// The freeze limit's default and bounds.
const (
	DefaultFreezeLimit = 10 * time.Second
	MinFreezeLimit     = 100 * time.Millisecond
	MaxFreezeLimit     = 10 * time.Minute
)

const (
	// freezeMargin: how long after the limit the watchdog thaws by
	// itself. The run thaws at the limit; the watchdog's own thaw is for
	// a run that cannot (stopped, stuck in the kernel).
	freezeMargin = 500 * time.Millisecond
	// maxUnfrozenPasses bounds the work spent finding out that a copy
	// does not fit: each pass rereads all the data.
	maxUnfrozenPasses = 3
	// compareCeiling (bytes a second) is faster than any machine reads
	// two files through the page cache and compares them: used only to
	// refuse at once a volume whose data could not be compared within
	// the limit even at that rate, instead of copying it to find out.
	compareCeiling = 16 << 30
	// staleWait: how long a run waits for an earlier run's watchdog,
	// which thaws as soon as its run is gone.
	staleWait = 5 * time.Second
)

// CheckFreezeLimit parses the value of --freeze-limit.
func CheckFreezeLimit(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, invalid("invalid_freeze_limit", "--freeze-limit %q: not a duration: give one from %s to %s, e.g. 2s (the longest a snapshot may hold a mounted volume's filesystem frozen)", v, MinFreezeLimit, MaxFreezeLimit)
	}
	return freezeLimit(d)
}

func freezeLimit(d time.Duration) (time.Duration, error) {
	if d == 0 {
		return DefaultFreezeLimit, nil
	}
	if d < MinFreezeLimit || d > MaxFreezeLimit {
		return 0, invalid("invalid_freeze_limit", "--freeze-limit %s: give a duration from %s to %s, e.g. 2s (the longest a snapshot may hold a mounted volume's filesystem frozen)", d, MinFreezeLimit, MaxFreezeLimit)
	}
	return d, nil
}

func (e *Engine) freezePath(u, name string) string {
	return filepath.Join(e.snapshotDir(u), name+".freeze")
}

// copyFrozen copies file into part for snapshot snap of a volume mounted
// at m, in this run's mount namespace or another's, frozen only as the
// rule above says. m's root was opened by descriptor and checked to be
// that mount of the volume's device (findMount): a path read from a mount
// table could name another filesystem by now.
func (e *Engine) copyFrozen(ctx context.Context, o *op, snap *Snapshot, m *volumeMount, file, part string, limit time.Duration) (filecopy.Method, error) {
	root, mp, dev := m.root, m.path, m.dev
	// The freeze's record is written while the filesystem is frozen: on
	// that very filesystem it would wait for the thaw it is there for.
	var st unix.Stat_t
	if unix.Stat(e.snapshotDir(snap.VolumeUUID), &st) == nil && st.Dev == unix.Mkdev(dev.Major, dev.Minor) {
		return "", refused("state_dir_on_volume", "snapshot %s of %s: the state dir %s is on the volume's own filesystem, which the snapshot would freeze: move the state dir", snap.Name, snap.Volume, e.State.Root)
	}
	method, step := filecopy.Sparse, func(ctx context.Context) error {
		_, err := filecopy.Update(ctx, file, part)
		return err
	}
	if filecopy.CanReflink(file, part+".probe") {
		method, step = filecopy.Reflink, func(context.Context) error { return filecopy.Clone(file, part) }
	} else if err := e.precopy(ctx, o, snap, file, part, limit); err != nil {
		return "", err
	}
	// What the filesystem still holds unwritten goes out now, unfrozen:
	// FIFREEZE writes it before it returns, with writers waiting.
	_ = unix.Syncfs(int(root.Fd()))
	recPath, _ := e.snapshotPaths(snap.VolumeUUID, snap.Name)
	if err := writeSnapshot(recPath, snap); err != nil {
		return "", failed("state", err, "recording snapshot %s", snap.Name)
	}
	frozenFor, err := freeze.Hold(ctx, root, freeze.Options{Limit: limit, Margin: freezeMargin,
		Record: e.freezePath(snap.VolumeUUID, snap.Name), Mountpoint: mp,
		Frozen: func() { o.step("frozen", "mountpoint", mp, "limit", limit.String()) }}, step)
	if err != nil {
		return "", freezeFailed(snap, mp, limit, err)
	}
	snap.Frozen, snap.FrozenFor = true, frozenFor.Round(time.Millisecond).String()
	o.step("thawed", "mountpoint", mp, "frozenFor", snap.FrozenFor)
	if method == filecopy.Sparse {
		if err := filecopy.SyncFile(part); err != nil {
			return "", failed("snapshot_copy", err, "syncing %s", part)
		}
	}
	return method, nil
}

// precopy makes part a copy of file unfrozen and brings it up to date
// until a pass fits half the limit; otherwise the snapshot is refused.
func (e *Engine) precopy(ctx context.Context, o *op, snap *Snapshot, file, part string, limit time.Duration) error {
	data, err := filecopy.Allocated(file)
	if err != nil {
		return failed("snapshot_copy", err, "reading %s", file)
	}
	if floor := time.Duration(float64(2*data) / compareCeiling * float64(time.Second)); floor > limit/2 {
		return tooSlow(snap, data, limit, fmt.Sprintf("a frozen pass reads it and its copy (%s), which takes %s even at %s/s", spec.Approx(2*data), floor.Round(time.Millisecond), spec.Approx(compareCeiling)))
	}
	o.step("snapshot-copying", "snapshot", snap.Name, "frozen", false)
	if err := filecopy.CopySparse(ctx, file, part); err != nil {
		return copyFailed(ctx, snap, file, err)
	}
	if err := filecopy.SyncFile(part); err != nil {
		return failed("snapshot_copy", err, "syncing %s", part)
	}
	o.step("snapshot-precopied", "snapshot", snap.Name)
	why := ""
	for i := 0; i < maxUnfrozenPasses; i++ {
		p, took, cut, err := unfrozenPass(ctx, file, part, limit)
		if err != nil {
			return copyFailed(ctx, snap, file, err)
		}
		if cut {
			// Reading is the floor of a pass: one that outlasts the
			// limit will not shrink below half of it.
			why = "a pass over it unfrozen (reading it and its copy, rewriting what changed) did not finish within the limit"
			break
		}
		o.step("snapshot-pass", "snapshot", snap.Name, "took", took.Round(time.Millisecond).String(), "rewritten", p.Rewritten)
		if took <= limit/2 {
			return nil
		}
		why = fmt.Sprintf("the last of %d passes over it unfrozen (reading it and its copy, rewriting what changed) took %s, more than half the limit", i+1, took.Round(time.Millisecond))
	}
	return tooSlow(snap, data, limit, why)
}

// unfrozenPass is one timed Update of part, synced (as the frozen pass's
// data must be before FIFREEZE, which would wait for it), cut at limit.
func unfrozenPass(ctx context.Context, file, part string, limit time.Duration) (p filecopy.Pass, took time.Duration, cut bool, err error) {
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	p, err = filecopy.Update(pctx, file, part)
	if err == nil {
		err = filecopy.SyncFile(part)
	}
	took = time.Since(start)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return p, took, true, nil
	}
	return p, took, false, err
}

func copyFailed(ctx context.Context, snap *Snapshot, file string, err error) error {
	if ctx.Err() != nil {
		return failed("cancelled", err, "snapshot %s of %s: stopped while copying, nothing frozen", snap.Name, snap.Volume)
	}
	return failed("snapshot_copy", err, "copying %s for snapshot %s", file, snap.Name)
}

func tooSlow(snap *Snapshot, data int64, limit time.Duration, why string) error {
	return refused("freeze_limit", "snapshot %s of %s: its %s of data cannot be copied within --freeze-limit %s of its filesystem frozen: %s. Refused before anything was frozen. "+
		"This state dir's filesystem shares no extents with the volume's file: on one that does (xfs with reflink, btrfs) or with an LVM volume a snapshot takes an instant; "+
		"else unmount the volume (its copy needs no freeze) or raise --freeze-limit",
		snap.Name, snap.Volume, spec.Approx(data), limit, why)
}

// freezeFailed turns Hold's error into the snapshot's.
func freezeFailed(snap *Snapshot, mp string, limit time.Duration, err error) error {
	switch {
	case errors.Is(err, freeze.ErrBusy):
		return refused("frozen_by_someone_else", "snapshot %s of %s: %s is frozen by someone else (fsfreeze, a guest agent, a backup tool): snapshot refused, nothing thawed; take it once they have thawed it",
			snap.Name, snap.Volume, mp)
	case errors.Is(err, freeze.ErrOverrun):
		return failed("freeze_limit_overrun", err, "snapshot %s of %s: the copy did not finish within --freeze-limit %s: %s was thawed at the bound and the snapshot abandoned (its partial image removed); "+
			"a reflink-capable state dir (xfs with reflink, btrfs) or an LVM volume snapshots in an instant", snap.Name, snap.Volume, limit, mp)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return failed("cancelled", err, "snapshot %s of %s: stopped while %s was frozen: thawed, snapshot abandoned", snap.Name, snap.Volume, mp)
	}
	return failed("freeze", err, "snapshot %s of %s: the freeze of %s did not hold for the whole copy: snapshot abandoned", snap.Name, snap.Volume, mp)
}

// abandonSnapshot removes what a failed take left: its partial image, and
// its taking record unless a freeze record still needs it (the listing
// shows a stale freeze through the snapshot it belongs to).
func (e *Engine) abandonSnapshot(u, name, part string) {
	os.Remove(part)
	os.Remove(part + ".probe")
	if _, err := os.Stat(e.freezePath(u, name)); err == nil {
		return
	}
	recPath, _ := e.snapshotPaths(u, name)
	if old, err := readSnapshot(recPath); err == nil && old.Phase == SnapshotTaking {
		// Never taken: an image an earlier, killed try named is nobody's.
		os.Remove(strings.TrimSuffix(part, ".part"))
		os.Remove(recPath)
	}
}

// settleFreeze deals with a freeze an earlier run of snapshot name left
// (freeze.Settle) and reports what it found.
func (e *Engine) settleFreeze(o *op, u, name string) error {
	st, err := freeze.Settle(e.freezePath(u, name), staleWait)
	if err != nil {
		return failed("freeze", err, "settling the freeze an earlier run of snapshot %s left", name)
	}
	if st == nil {
		return nil
	}
	r := st.Record
	attrs := []any{"snapshot", name, "mountpoint", r.Mountpoint, "frozenAt", r.FrozenAt, "watchdogPID", r.WatchdogPID}
	switch st.What {
	case freeze.SettledWatchdogThawed:
		e.Log.Warn("an earlier run ended while it held the filesystem frozen; its watchdog thawed it", append(attrs, "why", r.Thawed, "frozenFor", r.ThawedAt.Sub(r.FrozenAt).Round(time.Millisecond).String())...)
	case freeze.SettledStaleThawed:
		e.Log.Warn("a stale freeze: an earlier run and its watchdog both ended with the filesystem frozen; thawed now", attrs...)
	case freeze.SettledStaleNotFrozen:
		e.Log.Warn("a stale freeze: an earlier run and its watchdog both ended with the filesystem frozen, but it was not frozen any more (somebody thawed it)", attrs...)
	case freeze.SettledNotSame:
		e.Log.Warn("a stale freeze record names a mountpoint that holds another filesystem or mount now: nothing thawed (that freeze would not be ours)", attrs...)
	}
	o.step(st.What, "snapshot", name, "mountpoint", r.Mountpoint)
	return nil
}

// reportOldFreezing: a record of salt-volume-exec 0.3 says it was freezing
// mp. It wrote that before FIFREEZE, and kept it when FIFREEZE failed, so
// it cannot tell its freeze from somebody else's: reported, not thawed.
func (e *Engine) reportOldFreezing(o *op, mp string) {
	e.Log.Warn("an earlier salt-volume-exec (0.3) recorded a freeze of this filesystem that it may not have made: not thawed; if writes there hang, fsfreeze -u it",
		"volume", o.s.Name, "mountpoint", mp)
}

// staleFreezes marks the snapshots whose freeze record is stale: the
// node's report carries the warning until a run thaws it.
func (e *Engine) staleFreezes(snaps []*Snapshot) {
	for _, s := range snaps {
		if s.LV != "" {
			continue
		}
		r, stale := freeze.Inspect(e.freezePath(s.VolumeUUID, s.Name))
		if !stale {
			continue
		}
		s.StaleFreeze = r.Mountpoint
		s.Warning = fmt.Sprintf("stale freeze: the run taking it and its watchdog (pid %d) ended with %s frozen (since %s): writes there wait until the next snapshot or snapshot-delete of it thaws it, or fsfreeze -u %s",
			r.WatchdogPID, r.Mountpoint, r.FrozenAt.Format(time.RFC3339), r.Mountpoint)
	}
}
