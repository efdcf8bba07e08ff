package freeze

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/nodestate"
)

// Record is what a freeze of ours leaves in the state dir: written by the
// watchdog once FIFREEZE returned 0 (never for a freeze it did not make),
// removed once it thawed on its parent's word, and rewritten with how it
// thawed when it did so on its own (its parent dead, or the bound), for
// the next run to report.
type Record struct {
	Version    int    `json:"version"`
	Mountpoint string `json:"mountpoint"`
	Identity
	// The watchdog that holds the freeze: its pid and its start time (in
	// clock ticks since boot, /proc/PID/stat), so that a pid reused by
	// another process is not taken for it; BootID, so that a record from
	// before a reboot (which thawed everything) is known for one.
	WatchdogPID   int       `json:"watchdogPID"`
	WatchdogStart uint64    `json:"watchdogStart"`
	BootID        string    `json:"bootID"`
	FrozenAt      time.Time `json:"frozenAt"`
	Limit         string    `json:"limit"`
	// ThawBy is when the watchdog thaws at the latest (the limit plus
	// its margin): until then plus StaleGrace a stale freeze of the
	// mount can only be ours; after, it may be somebody else's.
	ThawBy time.Time `json:"thawBy,omitzero"`
	// Thawed says why the watchdog thawed without being asked
	// (ThawedParentGone, ThawedAtBound, ThawedSignal), ThawError what
	// FITHAW answered if it failed.
	Thawed    string    `json:"thawed,omitempty"`
	ThawedAt  time.Time `json:"thawedAt,omitzero"`
	ThawError string    `json:"thawError,omitempty"`
}

// Why a watchdog thawed on its own.
const (
	ThawedParentGone = "parent-gone"
	ThawedAtBound    = "at-bound"
	ThawedSignal     = "signal"
)

// StaleGrace: how long past its ThawBy a stale freeze is still thawed by
// the next run on its own. Later, an operator may have thawed it by hand
// and somebody else (a backup tool) frozen the same mount since: such a
// freeze is reported, and thawed only when asked (ThawStale).
const StaleGrace = 30 * time.Second

// thawBy is the record's ThawBy, or for a record of a watchdog that did
// not write one its frozenAt plus its limit and the default margin.
func (r *Record) thawBy() time.Time {
	if !r.ThawBy.IsZero() {
		return r.ThawBy
	}
	d, _ := time.ParseDuration(r.Limit)
	return r.FrozenAt.Add(d + 500*time.Millisecond)
}

// OnlyOurs says whether a stale freeze of the record's mount can at now
// only be ours still: in this boot, before its ThawBy plus StaleGrace.
func (r *Record) OnlyOurs(now time.Time) bool {
	return r.BootID == BootID() && now.Before(r.thawBy().Add(StaleGrace))
}

// ReadRecord reads the freeze record at path (os.ErrNotExist: none).
func ReadRecord(path string) (*Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Version > 1 {
		return nil, fmt.Errorf("%s: record version %d is newer than this salt-volume-exec reads (1)", path, r.Version)
	}
	return &r, nil
}

// WriteRecord writes r at path atomically.
func WriteRecord(path string, r *Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return nodestate.WriteFileAtomic(path, append(b, '\n'), 0o600)
}

// RemoveRecord removes the record at path; none is fine.
func RemoveRecord(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// BootID is this boot's random id.
func BootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// processStart is pid's start time in clock ticks since boot, 0 when it
// is gone or a zombie (which holds no file any more).
func processStart(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing one (state is field 3, starttime 22).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// watchdogAlive says whether the record's watchdog still runs.
func (r *Record) watchdogAlive() bool {
	return r.WatchdogPID > 0 && r.WatchdogStart != 0 && processStart(r.WatchdogPID) == r.WatchdogStart
}

// Stale says whether the record is a freeze that may still hold with no
// watchdog left to thaw it: its watchdog gone without saying it thawed,
// or its thaw failed, in this boot.
func (r *Record) Stale() bool {
	if r.BootID != BootID() || r.watchdogAlive() {
		return false
	}
	return r.Thawed == "" || (r.ThawError != "" && !strings.Contains(r.ThawError, ErrNotFrozen.Error()))
}
