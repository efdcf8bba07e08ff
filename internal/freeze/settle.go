package freeze

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// What Settle found and did about an earlier run's freeze record.
const (
	// SettledWatchdogThawed: that run died (or overran) and its watchdog
	// thawed the filesystem on its own.
	SettledWatchdogThawed = "thawed-by-watchdog"
	// SettledStaleThawed: its watchdog was gone too, the filesystem still
	// frozen: thawed now.
	SettledStaleThawed = "stale-freeze-thawed"
	// SettledStaleNotFrozen: its watchdog was gone, but FITHAW found the
	// filesystem not frozen (somebody thawed it).
	SettledStaleNotFrozen = "stale-freeze-not-frozen"
	// SettledStaleLeft: its watchdog was gone, and the time in which a
	// freeze of that mount could only be ours is over: nothing thawed
	// (the freeze there may be somebody else's by now), the record kept
	// for the listing until an operator asks for ThawStale.
	SettledStaleLeft = "stale-freeze-left"
	// SettledNotSame: the mountpoint holds another filesystem or mount
	// now: nothing thawed, since that freeze would not be ours; the
	// record is kept (another mount of the filesystem may still be
	// frozen) unless an operator asked for ThawStale.
	SettledNotSame = "stale-freeze-not-the-same-mount"
	// SettledOtherBoot: the record is from before a reboot, which thawed
	// everything.
	SettledOtherBoot = "freeze-record-of-another-boot"
)

// Settled is what Settle did; Kept: the record stays.
type Settled struct {
	Path   string
	Record *Record
	What   string
	Kept   bool
}

// Records lists the freeze records in dir (a volume's snapshot dir).
func Records(dir string) []string {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.freeze"))
	sort.Strings(paths)
	return paths
}

// Settle deals with the freeze record at path that an earlier run left:
// the caller holds the volume's lock, so that run is over. A watchdog
// still running is thawing (its parent is gone): Settle waits for it, up
// to wait. A stale freeze (watchdog gone, freeze not known thawed) is
// thawed only on the same filesystem and mount the record names, and
// only while it can be nobody's but ours (Record.OnlyOurs), unless force
// (an operator's ThawStale). The record is removed once nothing of ours
// can hold; an error leaves it, and so does a freeze left alone.
func Settle(path string, wait time.Duration, force bool) (*Settled, error) {
	rec, err := ReadRecord(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
		alive := rec.watchdogAlive()
		// Read after the check: what the watchdog wrote before it
		// exited (how it thawed) is in this reading.
		if rec, err = ReadRecord(path); errors.Is(err, os.ErrNotExist) {
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		if !alive {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the freeze watchdog of an earlier run (pid %d) still holds %s frozen", rec.WatchdogPID, rec.Mountpoint)
		}
	}
	s := &Settled{Path: path, Record: rec}
	switch {
	case rec.BootID != BootID():
		s.What = SettledOtherBoot
	case !rec.Stale():
		s.What = SettledWatchdogThawed
	case !force && !rec.OnlyOurs(time.Now()):
		s.What, s.Kept = SettledStaleLeft, true
		return s, nil
	default:
		if s.What, err = thawStale(rec); err != nil {
			return s, err
		}
		if s.What == SettledNotSame && !force {
			s.Kept = true
			return s, nil
		}
	}
	return s, RemoveRecord(path)
}

// thawStale thaws the record's filesystem if the mountpoint still holds
// the same filesystem and mount.
func thawStale(rec *Record) (string, error) {
	f, err := OpenRoot(rec.Mountpoint)
	if err != nil {
		return SettledNotSame, nil
	}
	defer f.Close()
	id, err := Identify(f)
	if err != nil || !id.Same(rec.Identity) {
		return SettledNotSame, nil
	}
	err = Thaw(f)
	switch {
	case errors.Is(err, ErrNotFrozen):
		return SettledStaleNotFrozen, nil
	case err != nil:
		return "", err
	}
	return SettledStaleThawed, nil
}

// Inspect reads the freeze record at path, if any, and says whether it
// is stale, without changing anything (for listings).
func Inspect(path string) (rec *Record, stale bool) {
	rec, err := ReadRecord(path)
	if err != nil {
		return nil, false
	}
	return rec, rec.Stale()
}
