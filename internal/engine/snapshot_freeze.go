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

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
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
		if _, err := filecopy.Update(ctx, file, part); err != nil {
			return &stepError{err}
		}
		return nil
	}
	if filecopy.CanReflink(file, part+".probe") {
		// A reflink's time grows with the file's extents (xfs holds the
		// file's locks, and writers wait, meanwhile): one made unfrozen
		// first must fit half the limit, as a pass must.
		if err := e.trialClone(o, snap, file, part, limit); err != nil {
			return "", err
		}
		method, step = filecopy.Reflink, func(context.Context) error {
			// No fallback to a copy while frozen; synced after the thaw.
			if err := cloneUnsynced(file, part); err != nil {
				return &stepError{err}
			}
			return nil
		}
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
	if err := filecopy.SyncFile(part); err != nil {
		return "", failed("snapshot_copy", err, "syncing %s", part)
	}
	return method, nil
}

// stepError: the frozen step itself failed (the copy or the reflink),
// not the freeze.
type stepError struct{ err error }

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// trialClone reflinks file to part unfrozen, timed, and removes it: a
// reflink that takes more than half the limit would not fit it frozen,
// and the snapshot is refused before anything is frozen.
func (e *Engine) trialClone(o *op, snap *Snapshot, file, part string, limit time.Duration) error {
	start := time.Now()
	err := cloneUnsynced(file, part)
	took := time.Since(start)
	os.Remove(part)
	if err != nil {
		return failed("snapshot_copy", err, "reflinking %s for snapshot %s (unfrozen trial): nothing frozen", file, snap.Name)
	}
	o.step("snapshot-reflink-trial", "snapshot", snap.Name, "took", took.Round(time.Millisecond).String())
	if failpoint.Enabled {
		if d, err := time.ParseDuration(os.Getenv("SALT_VOLUMES_TEST_REFLINK_TRIAL")); err == nil {
			took = d
		}
	}
	if took > limit/2 {
		data, _ := filecopy.Allocated(file)
		return refused("freeze_limit", "snapshot %s of %s: a reflink of its %s of data took %s unfrozen, more than half of --freeze-limit %s: it would not fit the limit frozen. Refused before anything was frozen. "+
			"With an LVM volume a snapshot takes an instant; else unmount the volume (its copy needs no freeze) or raise --freeze-limit",
			snap.Name, snap.Volume, spec.Approx(data), took.Round(time.Millisecond), limit)
	}
	return nil
}

// cloneUnsynced reflinks file to a new part, not synced (the caller syncs
// it once the filesystem is thawed); neither is followed if a symlink.
func cloneUnsynced(file, part string) error {
	in, err := os.OpenFile(file, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	if st, err := in.Stat(); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", file)
	}
	out, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(part)
		return fmt.Errorf("reflink %s: %w", file, err)
	}
	return nil
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
	if err := filecopy.CopySparseProgress(ctx, file, part, o.progress("copying", "snapshot", snap.Name)); err != nil {
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
	case errors.As(err, new(*stepError)):
		return failed("snapshot_copy", err, "snapshot %s of %s: the copy made while %s was frozen failed: thawed, snapshot abandoned", snap.Name, snap.Volume, mp)
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

// settleFreezes deals with every freeze an earlier run of a snapshot of
// volume u left (freeze.Settle; the caller holds the volume's lock), any
// snapshot's: a bind mount of the same filesystem frozen by a run of
// another name holds this run's mount frozen too. It reports what it
// found. A stale freeze it leaves alone (freeze.SettledStaleLeft,
// SettledNotSame) keeps its record and is warned of; one of snapshot
// name refuses this run (a new freeze record would replace its trace)
// unless thawStale, an operator's snapshot-delete --thaw-stale, which
// thaws any stale freeze of the volume after the device and mount
// checks, however old.
func (e *Engine) settleFreezes(o *op, u, name string, thawStale bool) error {
	var left error
	for _, p := range freeze.Records(e.snapshotDir(u)) {
		snap := strings.TrimSuffix(filepath.Base(p), ".freeze")
		st, err := freeze.Settle(p, staleWait, thawStale)
		if err != nil {
			return failed("freeze", err, "settling the freeze an earlier run of snapshot %s left", snap)
		}
		if st == nil {
			continue
		}
		r := st.Record
		attrs := []any{"snapshot", snap, "mountpoint", r.Mountpoint, "frozenAt", r.FrozenAt, "watchdogPID", r.WatchdogPID}
		switch st.What {
		case freeze.SettledWatchdogThawed:
			e.Log.Warn("an earlier run ended while it held the filesystem frozen; its watchdog thawed it", append(attrs, "why", r.Thawed, "frozenFor", r.ThawedAt.Sub(r.FrozenAt).Round(time.Millisecond).String())...)
		case freeze.SettledStaleThawed:
			e.Log.Warn("a stale freeze: an earlier run and its watchdog both ended with the filesystem frozen; thawed now", attrs...)
		case freeze.SettledStaleNotFrozen:
			e.Log.Warn("a stale freeze: an earlier run and its watchdog both ended with the filesystem frozen, but it was not frozen any more (somebody thawed it)", attrs...)
		case freeze.SettledStaleLeft:
			e.Log.Warn("a stale freeze: an earlier run and its watchdog both ended with the filesystem frozen, long enough ago that a freeze there now may be somebody else's: nothing thawed; "+thawStaleHint(o, snap), attrs...)
		case freeze.SettledNotSame:
			if st.Kept {
				e.Log.Warn("a stale freeze record names a mountpoint that holds another filesystem or mount now: nothing thawed (that freeze would not be ours), record kept (another mount of the filesystem may still be frozen); "+thawStaleHint(o, snap), attrs...)
			} else {
				e.Log.Warn("a stale freeze record names a mountpoint that holds another filesystem or mount now: nothing thawed, record removed as asked (--thaw-stale)", attrs...)
			}
		}
		o.step(st.What, "snapshot", snap, "mountpoint", r.Mountpoint)
		if !st.Kept && snap != name {
			// Its last freeze record gone, a take that was abandoned
			// with it is finished now (this run holds the lock).
			e.dropAbandoned(u, snap)
		}
		if st.Kept && snap == name {
			left = refused("stale_freeze", "snapshot %s of %s: a stale freeze of its earlier run is left at %s (since %s), which this run does not thaw: it may be somebody else's freeze by now. %s",
				snap, o.s.Name, r.Mountpoint, r.FrozenAt.Format(time.RFC3339), thawStaleHint(o, snap))
		}
	}
	return left
}

// dropAbandoned removes snapshot name of volume u if a take abandoned it
// (still taking, with no freeze record left): its record, partial copy
// and image, which are nobody's. The caller holds the volume's lock.
func (e *Engine) dropAbandoned(u, name string) bool {
	if _, err := os.Stat(e.freezePath(u, name)); err == nil {
		return false
	}
	recPath, img := e.snapshotPaths(u, name)
	old, err := readSnapshot(recPath)
	if err != nil || old.Phase != SnapshotTaking || old.LV != "" {
		return false
	}
	for _, p := range []string{img + ".part", img + ".part.probe", img} {
		os.Remove(p)
	}
	return os.Remove(recPath) == nil
}

// dropAbandonedUnlocked is dropAbandoned for a listing, which holds no
// lock: only when no run holds volume u's lock (one taking the snapshot
// right now does).
func (e *Engine) dropAbandonedUnlocked(u, name string) bool {
	f, err := os.OpenFile(filepath.Join(e.State.Root, "locks", u+".lock"), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false
	}
	return e.dropAbandoned(u, name)
}

// thawStaleHint names the operator's action for a stale freeze left.
func thawStaleHint(o *op, snap string) string {
	return fmt.Sprintf("if nobody else froze it, thaw it with: salt-volume-exec snapshot-delete --spec - --name %s --thaw-stale (with volume %s's spec)", snap, o.s.Name)
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
		if r.OnlyOurs(time.Now()) {
			s.Warning = fmt.Sprintf("stale freeze: the run taking it and its watchdog (pid %d) ended with %s frozen (since %s): writes there wait until the next snapshot, snapshot-delete or snapshot-restore of %s thaws it",
				r.WatchdogPID, r.Mountpoint, r.FrozenAt.Format(time.RFC3339), s.Volume)
		} else {
			s.Warning = fmt.Sprintf("stale freeze: the run taking it and its watchdog (pid %d) ended with %s frozen (since %s); no run thaws it on its own any more (it may be somebody else's freeze by now): if nobody else froze it, salt-volume-exec snapshot-delete --spec - --name %s --thaw-stale",
				r.WatchdogPID, r.Mountpoint, r.FrozenAt.Format(time.RFC3339), s.Name)
		}
	}
}
