package snapshots

// Snapshot schedules made through the API: one per volume, kept in the
// store (kind "snapshot-schedules", keyed by the volume's name) and run by
// the leading replica inside Run's term, so every write is fenced on its
// leadership like the snapshots' own.
//
// A schedule's time is cut into slots of its interval; each slot's
// snapshot has a name made from the volume, the slot's start and a tag
// keyed by the schedule's identity (SlotName), so a replayed pass, a
// restarted leader or a new one asks again for the same snapshot, which
// Take answers, instead of taking a second; and nobody without the
// schedule's identity (which the API never shows) can tell a future
// slot's name to take it first. Slots missed while no leader ran are not
// made up: the current one is taken, once.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// ScheduleKind is the schedule records' kind in the store.
const ScheduleKind = "snapshot-schedules"

// Bounds of a schedule.
const (
	// DefaultMinScheduleEvery is the shortest interval users may give.
	DefaultMinScheduleEvery = time.Minute
	MaxScheduleEvery        = 365 * 24 * time.Hour
	MaxKeep                 = 1000
	MaxMaxAge               = 3650 * 24 * time.Hour
	// overdueMargin is added to twice the interval before a schedule
	// without a success counts as overdue: a take's own time.
	overdueMargin = time.Minute
	// keepFailed is how many Failed records of its own a failing
	// schedule keeps (they hold nothing on the node; the newest say why).
	keepFailed = 3
	// slotStamp is the slot's start in a snapshot's name (UTC).
	slotStamp = "20060102150405"
	// slotTag is how many hex characters of the schedule's tag end a
	// slot's name; slotPrefix is what is left of 63 for the volume's part.
	slotTag    = 6
	slotPrefix = 63 - 1 - len(slotStamp) - 1 - slotTag
	// slotTries is how many names a slot tries when one is taken by a
	// snapshot that is not the schedule's (a name leaked, or chance).
	slotTries = 3
	// cloneHold bounds how long a clone in the making holds one of the
	// schedule's snapshots from pruning (as cloned() bounds a clone's
	// own snapshot): a clone Pending for good never holds keep off.
	cloneHold = time.Hour
)

// ScheduleSpec is what an operator asks of a schedule.
type ScheduleSpec struct {
	Every  time.Duration
	Keep   int
	MaxAge time.Duration // 0: no age limit
}

// scheduleRecord is what the store keeps of a schedule: the operator's
// spec and what the leader did with it.
type scheduleRecord struct {
	Volume     string        `json:"volume"`
	VolumeUUID string        `json:"volumeUUID"`
	Node       string        `json:"node"`
	Every      time.Duration `json:"every"`
	Keep       int           `json:"keep"`
	MaxAge     time.Duration `json:"maxAge,omitempty"`
	// ID is this schedule's identity, made with it and kept while it
	// stays (a change of interval or retention keeps it): a snapshot is
	// the schedule's when its record carries the ID, so one removed and
	// made again never prunes what the first took.
	ID        string    `json:"id"`
	CreatedBy string    `json:"createdBy,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`

	// LastSlot is the start of the last slot taken (or tried); Taking
	// the snapshot of that slot while its job runs.
	LastSlot     time.Time  `json:"lastSlot"`
	Taking       string     `json:"taking,omitempty"`
	LastSuccess  *time.Time `json:"lastSuccess,omitempty"`
	LastSnapshot string     `json:"lastSnapshot,omitempty"`
	LastError    string     `json:"lastError,omitempty"`
	LastErrorAt  *time.Time `json:"lastErrorAt,omitempty"`
	Failures     int        `json:"failures,omitempty"`
	// Held: when pruning first passed over each of its snapshots a clone
	// was being made from (cloneHold bounds it).
	Held map[string]time.Time `json:"held,omitempty"`
}

// SlotName is the snapshot the schedule id of volume vol takes for the
// slot starting at slot: "<vol>-<UTC yyyymmddhhmmss>-<tag>", a DNS label
// of at most 63. The tag is 6 hex characters of an HMAC of the volume,
// the slot and try (0 first) keyed by the schedule's id: the same on
// every pass and replica, another for each slot, and not to be told from
// the names already taken without the id. A volume name longer than 41
// is cut to 31 and given 8 hex characters of a hash of the whole and a
// '-' ("<cut>-<hash>--<stamp>-<tag>"): no volume name ends with '-', so
// no other volume's slot names take that form.
func SlotName(vol, id string, slot time.Time, try int) string {
	stamp := slot.UTC().Format(slotStamp)
	prefix := vol
	if len(vol) > slotPrefix {
		sum := sha256.Sum256([]byte(vol))
		prefix = strings.TrimRight(vol[:slotPrefix-10], "-") + "-" + hex.EncodeToString(sum[:4]) + "-"
	}
	mac := hmac.New(sha256.New, []byte(id))
	fmt.Fprintf(mac, "salt-volumes snapshot slot v1\n%s\n%s\n%d", vol, stamp, try)
	return prefix + "-" + stamp + "-" + hex.EncodeToString(mac.Sum(nil))[:slotTag]
}

// slotOf is the start of the slot now falls in: slots are aligned on the
// interval (whole hours for 1h), the same on every replica.
func slotOf(now time.Time, every time.Duration) time.Time {
	return now.UTC().Truncate(every)
}

// ParseInterval reads an interval as a user writes it: 30s, 15m, 1h or
// 7d (whole days).
func ParseInterval(field, v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if days, ok := strings.CutSuffix(v, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n > 0 && n <= 3650 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	} else if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	return 0, &Error{400, field, fmt.Sprintf("%s: %q is not an interval: use a whole number and a unit, e.g. 30s, 15m, 1h or 7d", field, v)}
}

// FormatInterval writes an interval the way ParseInterval reads it.
func FormatInterval(d time.Duration) string {
	switch {
	case d == 0:
		return ""
	case d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}

func (s *Service) minEvery() time.Duration {
	if s.MinScheduleEvery > 0 {
		return s.MinScheduleEvery
	}
	return DefaultMinScheduleEvery
}

// check refuses a spec out of bounds, naming the field and the fix.
func (s *Service) check(sp ScheduleSpec) error {
	minEvery := s.minEvery()
	switch {
	case sp.Every < minEvery:
		return &Error{400, "every", fmt.Sprintf("every: %s is shorter than the shortest interval, %s: give %s or more", FormatInterval(sp.Every), FormatInterval(minEvery), FormatInterval(minEvery))}
	case sp.Every > MaxScheduleEvery:
		return &Error{400, "every", fmt.Sprintf("every: %s is longer than a year: give 365d or less", FormatInterval(sp.Every))}
	case sp.Every%time.Second != 0:
		return &Error{400, "every", fmt.Sprintf("every: %s is not a whole number of seconds (snapshot names carry the second): give e.g. %s", sp.Every, FormatInterval(sp.Every.Round(time.Second)))}
	case sp.Keep < 1 || sp.Keep > MaxKeep:
		return &Error{400, "keep", fmt.Sprintf("keep: %d is out of bounds: give how many of its own snapshots the schedule keeps, 1 to %d", sp.Keep, MaxKeep)}
	case sp.MaxAge < 0:
		return &Error{400, "maxAge", "maxAge: give a positive age, e.g. 7d, or leave it out"}
	case sp.MaxAge > 0 && sp.MaxAge < sp.Every:
		return &Error{400, "maxAge", fmt.Sprintf("maxAge: %s is shorter than every (%s): each snapshot would be pruned at the next; give at least %s, or leave it out", FormatInterval(sp.MaxAge), FormatInterval(sp.Every), FormatInterval(sp.Every))}
	case sp.MaxAge > maxAgeLimit(sp.Every):
		return &Error{400, "maxAge", fmt.Sprintf("maxAge: %s: at most 1000 times the interval and at most 3650d, here %s: give a shorter maxAge, or a longer every", FormatInterval(sp.MaxAge), FormatInterval(maxAgeLimit(sp.Every)))}
	}
	return nil
}

// maxAgeLimit is the longest maxAge of an interval: 1000 times it, at
// most MaxMaxAge; without overflow (1000 times 365d is past int64's
// nanoseconds).
func maxAgeLimit(every time.Duration) time.Duration {
	if every > MaxMaxAge/MaxKeep {
		return MaxMaxAge
	}
	return min(MaxMaxAge, MaxKeep*every)
}

func (s *Service) readSchedule(ctx context.Context, vol string) (*scheduleRecord, error) {
	return readOne[scheduleRecord](ctx, s.Records, ScheduleKind, vol, "snapshot schedule", ErrNoSchedule)
}

func (s *Service) writeSchedule(ctx context.Context, sc *scheduleRecord) error {
	b, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	return s.writer().PutRecord(ctx, ScheduleKind, sc.Volume, b)
}

func (s *Service) allSchedules(ctx context.Context) ([]*scheduleRecord, error) {
	s.init()
	return readAll[scheduleRecord](ctx, s.Records, ScheduleKind, "snapshot schedule", s.Log)
}

// ErrNoSchedule: the volume has no API schedule.
var ErrNoSchedule = errors.New("no snapshot schedule")

// SetSchedule makes (or changes) volume v's schedule. A change keeps the
// schedule's identity and what it took; the first snapshot is the next
// slot's. created says whether it is new.
func (s *Service) SetSchedule(ctx context.Context, v *volume.Volume, sp ScheduleSpec, by string) (saltvolumes.SnapshotSchedule, bool, error) {
	s.init()
	if err := s.check(sp); err != nil {
		return saltvolumes.SnapshotSchedule{}, false, err
	}
	if v.DeleteRequested {
		return saltvolumes.SnapshotSchedule{}, false, &Error{409, "volume", fmt.Sprintf("volume %s is being deleted: nothing to schedule snapshots of", v.Spec.Name)}
	}
	if v.Spec.Encryption != nil {
		return saltvolumes.SnapshotSchedule{}, false, &Error{422, "volume", fmt.Sprintf("volume %s is encrypted: snapshots of encrypted volumes are not in this release, so neither are their schedules", v.Spec.Name)}
	}
	s.schedMu.Lock()
	defer s.schedMu.Unlock()
	now := time.Now().UTC()
	sc, err := s.readSchedule(ctx, v.Spec.Name)
	created := errors.Is(err, ErrNoSchedule)
	switch {
	case created:
	case err != nil:
		return saltvolumes.SnapshotSchedule{}, false, err
	case sc.VolumeUUID != v.Spec.UUID:
		// Left by a volume of that name since deleted: the new volume's
		// schedule starts afresh and owns nothing of the old one's.
		created = true
	}
	if created {
		sc = &scheduleRecord{Volume: v.Spec.Name, VolumeUUID: v.Spec.UUID, Node: v.Spec.Node, ID: newNodeID(),
			CreatedBy: by, CreatedAt: now, LastSlot: slotOf(now, sp.Every)}
	} else if sp.Every != sc.Every {
		// A new interval starts with its next slot.
		sc.LastSlot = slotOf(now, sp.Every)
	}
	sc.Every, sc.Keep, sc.MaxAge, sc.UpdatedAt = sp.Every, sp.Keep, sp.MaxAge, now
	if err := s.writeSchedule(ctx, sc); err != nil {
		return saltvolumes.SnapshotSchedule{}, false, err
	}
	return sc.view(now), created, nil
}

// Unschedule removes volume vol's schedule; its snapshots stay, and no
// schedule prunes them any more (not one made again under the name).
func (s *Service) Unschedule(ctx context.Context, vol string) (saltvolumes.SnapshotSchedule, error) {
	s.init()
	s.schedMu.Lock()
	defer s.schedMu.Unlock()
	sc, err := s.readSchedule(ctx, vol)
	if err != nil {
		return saltvolumes.SnapshotSchedule{}, err
	}
	if err := s.writer().DeleteRecord(ctx, ScheduleKind, vol); err != nil {
		return saltvolumes.SnapshotSchedule{}, err
	}
	return sc.view(time.Now()), nil
}

// Schedules lists the API's schedules: one volume's ("" for all).
func (s *Service) Schedules(ctx context.Context, vol string) ([]saltvolumes.SnapshotSchedule, error) {
	all, err := s.allSchedules(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := []saltvolumes.SnapshotSchedule{}
	for _, sc := range all {
		if vol == "" || sc.Volume == vol {
			out = append(out, sc.view(now))
		}
	}
	return out, nil
}

func (sc *scheduleRecord) view(now time.Time) saltvolumes.SnapshotSchedule {
	next := sc.LastSlot.Add(sc.Every)
	created := sc.CreatedAt
	return saltvolumes.SnapshotSchedule{Source: "api", Schedule: sc.Volume, Volume: sc.Volume, VolumeUUID: sc.VolumeUUID, Node: sc.Node,
		Every: FormatInterval(sc.Every), Keep: sc.Keep, MaxAge: FormatInterval(sc.MaxAge),
		LastSuccess: sc.LastSuccess, LastSnapshot: sc.LastSnapshot, Failing: sc.Failures > 0, Failures: sc.Failures,
		LastError: sc.LastError, LastErrorAt: sc.LastErrorAt, Taking: sc.Taking, NextAt: &next,
		Overdue: sc.overdue(now), CreatedBy: sc.CreatedBy, CreatedAt: &created}
}

// overdue: no success within twice the interval and a margin, counted
// from the last success or, before the first, from when it was made.
func (sc *scheduleRecord) overdue(now time.Time) bool {
	since := sc.CreatedAt
	if sc.LastSuccess != nil {
		since = *sc.LastSuccess
	}
	return now.Sub(since) > 2*sc.Every+overdueMargin
}

// scheduleTick is how often the leader looks at its schedules: a quarter
// of the shortest interval allowed, between 250 ms and 5 s.
func (s *Service) scheduleTick() time.Duration {
	return min(max(s.minEvery()/4, 250*time.Millisecond), 5*time.Second)
}

// runSchedules runs the schedules until ctx ends (Run's term).
func (s *Service) runSchedules(ctx context.Context) {
	for {
		s.schedulePass(ctx, time.Now())
		t := time.NewTimer(s.scheduleTick())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// schedulePass takes each due schedule's snapshot, and notes how those
// under way ended.
func (s *Service) schedulePass(ctx context.Context, now time.Time) {
	all, err := s.allSchedules(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.Log.Warn("reading snapshot schedules", "error", err)
		}
		return
	}
	for _, sc := range all {
		if ctx.Err() != nil {
			return
		}
		s.stepSchedule(ctx, sc.Volume, now)
	}
}

// stepSchedule moves one schedule on, read afresh under schedMu so that
// an operator's change in between is not lost.
func (s *Service) stepSchedule(ctx context.Context, vol string, now time.Time) {
	s.schedMu.Lock()
	defer s.schedMu.Unlock()
	sc, err := s.readSchedule(ctx, vol)
	if err != nil {
		return // removed meanwhile
	}
	if why := s.volumeLeft(sc); why != "" {
		// The schedule is the volume's: it goes with it, rather than
		// failing every slot (and raising the alert) for good. Its
		// snapshots stay, and so does the rule that a volume is deleted
		// only once its snapshots are.
		if err := s.writer().DeleteRecord(ctx, ScheduleKind, sc.Volume); err != nil {
			if ctx.Err() == nil {
				s.Log.Warn("removing the snapshot schedule of a volume gone", "schedule", sc.Volume, "error", err)
			}
			return
		}
		s.Log.Info("snapshot schedule removed: "+why, "schedule", sc.Volume, "volumeUUID", sc.VolumeUUID, "lastSnapshot", sc.LastSnapshot)
		return
	}
	changed := false
	if sc.Taking != "" {
		changed = s.follow(ctx, sc, now)
	}
	if sc.Taking == "" {
		if slot := slotOf(now, sc.Every); slot.After(sc.LastSlot) {
			s.takeSlot(ctx, sc, slot, now)
			changed = true
		}
	}
	if !changed {
		return
	}
	if err := s.writeSchedule(ctx, sc); err != nil && ctx.Err() == nil {
		// A fenced write refused (the term is over) or a store error:
		// the next pass (here or on the new leader) asks again for the
		// same slot's snapshot, which is answered, not taken twice.
		s.Log.Warn("saving a snapshot schedule", "schedule", sc.Volume, "error", err)
	}
}

// volumeLeft says why the schedule's volume is gone for it ("": it is
// not): no volume of the store has its uuid any more (deleted, forgotten
// with its node or by rm --forget, or made again under the name, which
// has another uuid), or it is being deleted or forgotten.
func (s *Service) volumeLeft(sc *scheduleRecord) string {
	if s.Volumes == nil {
		return ""
	}
	v, err := s.Volumes.Get(sc.Volume)
	switch {
	case err == nil && v.Spec.UUID == sc.VolumeUUID:
		if v.DeleteRequested || v.ForgetRequested || v.NodeForgotten {
			return "its volume is being deleted"
		}
		return ""
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return "" // a read error: the slot says so
	}
	for _, o := range s.Volumes.List() {
		if o.Spec.UUID == sc.VolumeUUID {
			return "" // under another name: the slot says so
		}
	}
	if err == nil {
		return fmt.Sprintf("its volume is gone (volume %s is another one now, uuid %s)", sc.Volume, v.Spec.UUID)
	}
	return "its volume is gone"
}

// takeSlot asks for the slot's snapshot. A volume gone, replaced or not
// Available fails the slot (the next slot tries again). A name taken by
// a snapshot that is not the schedule's is passed over for the slot's
// next name.
func (s *Service) takeSlot(ctx context.Context, sc *scheduleRecord, slot, now time.Time) {
	sc.LastSlot = slot
	if s.Volumes == nil {
		s.scheduleFailed(ctx, sc, now, "this control plane reads no volumes: nothing to take")
		return
	}
	v, err := s.Volumes.Get(sc.Volume)
	switch {
	case errors.Is(err, store.ErrNotFound):
		s.scheduleFailed(ctx, sc, now, fmt.Sprintf("volume %s is gone: remove its schedule (salt-volumes snapshot unschedule %s)", sc.Volume, sc.Volume))
		return
	case err != nil:
		s.scheduleFailed(ctx, sc, now, fmt.Sprintf("reading volume %s: %v", sc.Volume, err))
		return
	case v.Spec.UUID != sc.VolumeUUID:
		s.scheduleFailed(ctx, sc, now, fmt.Sprintf("volume %s was made again (uuid %s, the schedule's is %s): set its schedule again (salt-volumes snapshot schedule %s ...)", sc.Volume, v.Spec.UUID, sc.VolumeUUID, sc.Volume))
		return
	}
	var taken []string
	for try := range slotTries {
		name := SlotName(sc.Volume, sc.ID, slot, try)
		_, _, err := s.take(ctx, v, name, "schedule/"+sc.Volume, "", 0, nil, sc)
		var refused *Error
		if errors.As(err, &refused) && refused.Status == 409 && refused.Field == "name" {
			taken = append(taken, name)
			continue
		}
		if err != nil {
			s.scheduleFailed(ctx, sc, now, fmt.Sprintf("snapshot %s not taken: %v", name, err))
			return
		}
		if len(taken) > 0 {
			s.Log.Warn("a scheduled snapshot's name was taken by another: the slot's next name is used", "schedule", sc.Volume, "taken", taken, "snapshot", name)
		}
		sc.Taking = name
		s.Log.Info("scheduled snapshot asked for", "schedule", sc.Volume, "snapshot", name, "slot", slot)
		return
	}
	s.scheduleFailed(ctx, sc, now, fmt.Sprintf("the slot's names (%s) are all taken by snapshots that are not this schedule's: nothing was taken for this slot", strings.Join(taken, ", ")))
}

// follow notes how the slot's snapshot ended; it says whether sc changed.
// Only the schedule's own record of the name counts: one of another
// volume or schedule (the slot's went, and another took the name) is not
// this slot's success.
func (s *Service) follow(ctx context.Context, sc *scheduleRecord, now time.Time) bool {
	r, err := s.read(ctx, sc.Taking)
	switch {
	case errors.Is(err, ErrNotFound):
		s.scheduleFailed(ctx, sc, now, fmt.Sprintf("snapshot %s was deleted before it was taken", sc.Taking))
	case err != nil:
		return false
	case r.ScheduleID != sc.ID || r.VolumeUUID != sc.VolumeUUID:
		s.scheduleFailed(ctx, sc, now, fmt.Sprintf("snapshot %s was deleted before it was taken, or handed to a VolumeSnapshot object; the snapshot now of that name is not this schedule's", sc.Taking))
	case r.Phase == Pending:
		// Its job's return may be on the bus before the job cache has
		// it: look again at this loop's pace rather than the snapshot
		// loop's (the same 5 s unless serve's floor is lowered).
		s.Kick()
		return false
	case r.Phase == Ready:
		at := now.UTC()
		if r.TakenAt != nil {
			at = r.TakenAt.UTC()
		}
		sc.LastSuccess, sc.LastSnapshot, sc.Failures, sc.LastError, sc.LastErrorAt, sc.Taking = &at, r.Name, 0, "", nil, ""
		s.prune(ctx, sc, r.Name, now)
	default:
		s.scheduleFailed(ctx, sc, now, fmt.Sprintf("snapshot %s: %s", r.Name, or(r.Message, r.Phase)))
	}
	return true
}

// scheduleFailed notes a failed slot. It never prunes a snapshot: only
// Failed records of its own past the newest few go (they hold nothing).
func (s *Service) scheduleFailed(ctx context.Context, sc *scheduleRecord, now time.Time, msg string) {
	at := now.UTC()
	sc.Failures++
	sc.LastError, sc.LastErrorAt, sc.Taking = msg, &at, ""
	s.Log.Warn("scheduled snapshot failed", "schedule", sc.Volume, "failures", sc.Failures, "error", msg)
	own, err := s.owned(ctx, sc)
	if err != nil {
		return
	}
	failed := 0
	for _, r := range own {
		if r.Phase != Failed {
			continue
		}
		if failed++; failed > keepFailed {
			s.drop(ctx, sc, r, "a failed take's record", now)
		}
	}
}

// owned returns the schedule's own snapshots, newest first: taken by it
// (its id, its volume's uuid) and bound to no VolumeSnapshot object (one
// handed to a tenant is the object's, out of the schedule's retention).
func (s *Service) owned(ctx context.Context, sc *scheduleRecord) ([]*record, error) {
	rs, err := s.all(ctx)
	if err != nil {
		s.Log.Warn("reading snapshots to prune", "schedule", sc.Volume, "error", err)
		return nil, err
	}
	var own []*record
	for _, r := range rs {
		if sc.owns(r) {
			own = append(own, r)
		}
	}
	sort.Slice(own, func(i, j int) bool {
		if !own[i].CreatedAt.Equal(own[j].CreatedAt) {
			return own[i].CreatedAt.After(own[j].CreatedAt)
		}
		return own[i].Name > own[j].Name
	})
	return own, nil
}

// owns tells whether r is the schedule's to count and prune.
func (sc *scheduleRecord) owns(r *record) bool {
	return sc.ID != "" && r.ScheduleID == sc.ID && r.VolumeUUID == sc.VolumeUUID && r.Owner == nil && r.For == ""
}

// prune deletes the schedule's own Ready snapshots past keep or older
// than maxAge, never the one just taken, never one a clone is being made
// from (for cloneHold at most), never anyone else's; and its Failed
// records (nothing on the node).
func (s *Service) prune(ctx context.Context, sc *scheduleRecord, just string, now time.Time) {
	own, err := s.owned(ctx, sc)
	if err != nil {
		return
	}
	ready := 0
	for _, r := range own {
		switch r.Phase {
		case Failed:
			s.drop(ctx, sc, r, "a failed take's record", now)
			continue
		case Ready:
		default:
			continue // being taken or deleted
		}
		ready++
		if r.Name == just {
			continue
		}
		taken := r.CreatedAt
		if r.TakenAt != nil {
			taken = *r.TakenAt
		}
		switch {
		case ready > sc.Keep:
			s.drop(ctx, sc, r, fmt.Sprintf("past keep %d", sc.Keep), now)
		case sc.MaxAge > 0 && now.Sub(taken) > sc.MaxAge:
			s.drop(ctx, sc, r, "older than maxAge "+FormatInterval(sc.MaxAge), now)
		}
	}
	// Forget the holds of snapshots gone, no longer its own, or no clone
	// is being made from any more (a clone made later holds anew).
	for name := range sc.Held {
		i := slices.IndexFunc(own, func(r *record) bool { return r.Name == name && r.Phase == Ready })
		if i < 0 || s.cloning(own[i]) == "" {
			delete(sc.Held, name)
		}
	}
}

// drop deletes one of the schedule's snapshots, unless a clone is being
// made from it (its turn comes at a later pass, cloneHold at most after
// the first pass that held it). It reads the record again under the
// snapshots' lock so that one bound to an object meanwhile stays.
func (s *Service) drop(ctx context.Context, sc *scheduleRecord, r *record, why string, now time.Time) {
	if clone := s.cloning(r); clone != "" {
		since, ok := sc.Held[r.Name]
		if !ok {
			if sc.Held == nil {
				sc.Held = map[string]time.Time{}
			}
			sc.Held[r.Name] = now.UTC()
			since = now
		}
		if now.Sub(since) <= cloneHold {
			s.Log.Info("scheduled snapshot not pruned: a clone is being made from it", "schedule", sc.Volume, "snapshot", r.Name, "clone", clone, "heldSince", since)
			return
		}
		s.Log.Warn("scheduled snapshot pruned though a clone is being made from it: held for longer than "+cloneHold.String(), "schedule", sc.Volume, "snapshot", r.Name, "clone", clone, "heldSince", since)
	}
	if _, err := s.removeOwn(ctx, r.Name, "schedule/"+sc.Volume, sc); err != nil {
		s.Log.Warn("pruning a scheduled snapshot", "schedule", sc.Volume, "snapshot", r.Name, "error", err)
		return
	}
	delete(sc.Held, r.Name)
	s.Log.Info("scheduled snapshot pruned", "schedule", sc.Volume, "snapshot", r.Name, "why", why)
}

// removeOwn is remove of a snapshot the schedule owns as it stands now:
// checked in the same hold of the snapshots' lock as the deletion is
// asked for, so that one bound to an object (Bind takes that lock) or of
// the name taken by another since owned() read it is left alone.
func (s *Service) removeOwn(ctx context.Context, name, by string, sc *scheduleRecord) (Snapshot, error) {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.read(ctx, name)
	if err != nil {
		return Snapshot{}, err
	}
	switch {
	case !sc.owns(r):
		return r.Snapshot, fmt.Errorf("%w: snapshot %s is no longer this schedule's", ErrNotOwner, name)
	case r.Restore != nil && r.Restore.Phase == Restoring:
		return r.Snapshot, &Error{409, "name", fmt.Sprintf("snapshot %s: volume %s is being restored from it: delete it once that has finished", name, r.Volume)}
	case r.Phase == Deleting:
		return r.Snapshot, nil
	}
	r.Phase, r.Message, r.JobID, r.JobStartedAt, r.RequestedBy = Deleting, "", "", nil, by
	if err := s.write(ctx, r); err != nil {
		return Snapshot{}, err
	}
	s.Kick()
	return r.Snapshot, nil
}

// cloning names a volume being made from snapshot r ("": none): one whose
// source is r, that is not Available yet, and not Failed, nor being
// deleted or forgotten (those never become Available: they hold nothing).
func (s *Service) cloning(r *record) string {
	if s.Volumes == nil {
		return ""
	}
	for _, v := range s.Volumes.List() {
		src := v.Spec.Source
		if src == nil || src.Snapshot != r.Name || src.VolumeUUID != r.VolumeUUID {
			continue
		}
		if v.Status.Phase == volume.Available || v.Status.Phase == volume.Failed || v.DeleteRequested || v.ForgetRequested || v.NodeForgotten {
			continue
		}
		return v.Spec.Name
	}
	return ""
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
