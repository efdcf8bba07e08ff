// Package snapshots keeps the control plane's snapshots of volumes: a
// record per snapshot in the store beside the volumes (kind "snapshots"),
// and, on the replica that leads, the Salt jobs that take and delete them
// on the volumes' nodes.
//
// A snapshot is the node's (salt-volume-exec snapshot): a frozen,
// reflinked or sparse copy of a sparse volume's backing file in its state
// dir. The record is what the control plane asked for and what the node
// answered. Like the reconciler's, a job's return on the bus only says
// when to look: the outcome is read from the job cache.
package snapshots

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	saltvolumes "github.com/salt-volumes/salt-volumes"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Kind is the records' kind in the store.
const Kind = "snapshots"

// FunApply takes or deletes one snapshot on a node with fixed arguments
// (action, volume spec, snapshot name): the function the control plane's
// Salt account is allowed for snapshots.
const FunApply = "salt_volumes.apply_snapshot"

// Phases of a snapshot.
const (
	Pending  = "Pending"  // asked for; its job runs (or is about to)
	Ready    = "Ready"    // on its node
	Failed   = "Failed"   // the node refused or failed: Message says why
	Deleting = "Deleting" // its deletion runs
)

// Snapshot is one snapshot as the API shows it.
type Snapshot = saltvolumes.Snapshot

// record is what the store keeps: the snapshot and what its jobs need.
type record struct {
	Snapshot
	// Spec is the volume's spec when the snapshot was asked for: the node
	// finds the volume by its uuid and kind, also once the volume record
	// has changed.
	Spec         spec.Spec  `json:"spec"`
	JobStartedAt *time.Time `json:"jobStartedAt,omitempty"`
	// Synced: the node's modules were synced once for this snapshot (its
	// minion did not know apply_snapshot yet).
	Synced bool `json:"synced,omitempty"`
	// Owner is the Kubernetes object the snapshot belongs to (nil: taken
	// through the API, or a record older than owners).
	Owner *Owner `json:"owner,omitempty"`
	// RestoreSpec is the volume's spec when its last restore was asked
	// for, and RestoreJobStartedAt when that restore's job was launched.
	RestoreSpec         *spec.Spec `json:"restoreSpec,omitempty"`
	RestoreJobStartedAt *time.Time `json:"restoreJobStartedAt,omitempty"`
	// NodeID is this record's identity on the node (apply_snapshot's
	// owner, salt-volume-exec --owner): random, made with the record and
	// the same on every retry, so that the node answers the snapshot this
	// record took and refuses one of that name Salt (or another record)
	// took (name_taken). Empty in a record older than it: no owner passed.
	NodeID string `json:"nodeID,omitempty"`
	// ScheduleID is the identity of the API schedule that took it
	// (schedules.go): only that schedule prunes it.
	ScheduleID string `json:"scheduleID,omitempty"`
}

// nameTaken prefixes apply_snapshot's message when the node refused a
// snapshot of that name that is not this record's.
const nameTaken = "name_taken: "

func newNodeID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return "sv-" + hex.EncodeToString(b)
}

// Owner is the namespaced object (a VolumeSnapshot of salt-volumes.io)
// a snapshot belongs to: only that object, by namespace, name and uid,
// changes or deletes it, and only claims of its namespace restore it.
type Owner struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Bound: the snapshot was there before the object named it
	// (pre-provisioned): deleting the object releases it and keeps it.
	Bound bool `json:"bound,omitempty"`
}

func (o *Owner) String() string {
	if o == nil {
		return "no object"
	}
	return fmt.Sprintf("VolumeSnapshot %s/%s (uid %s)", o.Namespace, o.Name, o.UID)
}

// Is tells whether o is the object p (namespace, name and uid).
func (o *Owner) Is(p *Owner) bool {
	return o != nil && p != nil && o.Namespace == p.Namespace && o.Name == p.Name && o.UID == p.UID
}

// ErrNotOwner: the snapshot belongs to another object, or to none.
var ErrNotOwner = errors.New("the snapshot is not this object's")

// Error is a refusal that names the field at fault and the fix.
type Error struct {
	Status int // HTTP status the API answers with
	Field  string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// ErrNotFound: no snapshot of that name.
var ErrNotFound = errors.New("no such snapshot")

// names are the store's record keys: a DNS label, so that every backend
// (Kubernetes Secrets too) can hold it, and the node accepts it.
var names = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Service keeps the records and, while it leads, runs their jobs.
type Service struct {
	Records store.Records
	Salt    saltapi.Jobs
	Log     *slog.Logger
	// JobTimeout: a job with no return after this long is started again
	// (taking and deleting a snapshot are idempotent on the node).
	JobTimeout time.Duration
	// Every is how often the leader looks up jobs no event announced
	// (default 5 s); a job's return on the bus looks it up at once.
	Every time.Duration
	// Volumes, when set, lets the leader delete the snapshots taken for a
	// clone (a claim's dataSource) once the clone is Available.
	Volumes store.Reader
	// MinScheduleEvery is the shortest interval a snapshot schedule may
	// have (default a minute; tests set seconds).
	MinScheduleEvery time.Duration

	// mu orders the leader's read-modify-write of a record with the
	// API's (requests that change snapshots are passed to the leader).
	mu sync.Mutex
	// term, while Run leads, writes the records fenced on this replica's
	// leadership (nil: Records as they are).
	term   store.Records
	termMu sync.Mutex
	wake   chan struct{}
	once   sync.Once

	Taken, Deleted, Failures atomic.Int64

	// schedMu orders the changes to schedule records (schedules.go).
	schedMu sync.Mutex

	// hintMu guards the steps of looking again after a hint (Hint).
	hintMu     sync.Mutex
	hintUntil  time.Time
	hintStep   uint
	hintKicked time.Time

	// progMu guards the last progress report per node and volume, and
	// the volumes with a job of ours (progress.go).
	progMu  sync.Mutex
	prog    map[string]progressNote
	running map[string]int
}

func (s *Service) init() {
	s.once.Do(func() {
		s.wake = make(chan struct{}, 1)
		if s.Log == nil {
			s.Log = slog.New(slog.DiscardHandler)
		}
		if s.JobTimeout <= 0 {
			s.JobTimeout = 10 * time.Minute
		}
		if s.Every <= 0 {
			s.Every = 5 * time.Second
		}
	})
}

// Kick makes the leader's loop look at every unfinished snapshot now.
func (s *Service) Kick() {
	s.init()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Hint is a snapshot job's return seen on the bus: look it up. The
// master fires the event before it writes the job cache, so the first
// look can come too early: while a hint is fresh, the loop looks again
// after 25 ms, 50 ms, 100 ms, ... instead of after Every (5 s), as the
// reconciler does with its own hints. A flood of forged hints (any
// minion can fire a job return's tag in Salt's batched form) cannot make
// it look more often than that and once each hintKickEvery: the steps
// restart only once a window has passed, and a hint wakes the loop at
// once only if the last one that did is that old.
func (s *Service) Hint(string) {
	s.init()
	now := time.Now()
	s.hintMu.Lock()
	if now.After(s.hintUntil) {
		s.hintStep = 0
	}
	s.hintUntil = now.Add(hintWindow)
	kick := now.Sub(s.hintKicked) >= hintKickEvery
	if kick {
		s.hintKicked = now
	}
	s.hintMu.Unlock()
	if kick {
		s.Kick()
	}
}

// hintKickEvery spaces the passes hints start at once; the window's
// looks (25 ms, 50 ms, ...) find a return that came between.
const hintKickEvery = 250 * time.Millisecond

// hintWindow is how long after a hint the loop looks again soon.
const hintWindow = 4 * time.Second

// nextLook is how long the loop waits after a pass that left work.
func (s *Service) nextLook() time.Duration {
	s.hintMu.Lock()
	defer s.hintMu.Unlock()
	if time.Now().After(s.hintUntil) {
		return s.Every
	}
	d := 25 * time.Millisecond << s.hintStep
	if d >= s.Every {
		return s.Every
	}
	s.hintStep++
	return d
}

func (s *Service) read(ctx context.Context, name string) (*record, error) {
	return readOne[record](ctx, s.Records, Kind, name, "snapshot", ErrNotFound)
}

// readOne reads the record kind/key (what names it in an error) as a T;
// notFound when there is none.
func readOne[T any](ctx context.Context, recs store.Records, kind, key, what string, notFound error) (*T, error) {
	b, err := recs.GetRecord(ctx, kind, key)
	if errors.Is(err, store.ErrNoRecord) {
		return nil, notFound
	}
	if err != nil {
		return nil, err
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, key, err)
	}
	return &v, nil
}

// readAll reads every record of kind as a T; one it cannot read is
// logged and skipped, so that one bad record stops nothing else.
func readAll[T any](ctx context.Context, recs store.Records, kind, what string, log *slog.Logger) ([]*T, error) {
	list, err := recs.ListRecords(ctx, kind)
	if err != nil {
		return nil, err
	}
	out := make([]*T, 0, len(list))
	for _, rec := range list {
		var v T
		if err := json.Unmarshal(rec.Data, &v); err != nil {
			log.Warn("unreadable "+what+" record skipped", "key", rec.Key, "error", err)
			continue
		}
		out = append(out, &v)
	}
	return out, nil
}

func (s *Service) write(ctx context.Context, r *record) error {
	r.UpdatedAt = time.Now().UTC()
	dropEndedProgress(r)
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.writer().PutRecord(ctx, Kind, r.Name, b)
}

func (s *Service) writer() store.Records {
	s.termMu.Lock()
	defer s.termMu.Unlock()
	if s.term != nil {
		return s.term
	}
	return s.Records
}

func (s *Service) all(ctx context.Context) ([]*record, error) {
	s.init() // its Log may be read before Run starts
	return readAll[record](ctx, s.Records, Kind, "snapshot", s.Log)
}

// Get returns one snapshot.
func (s *Service) Get(ctx context.Context, name string) (Snapshot, error) {
	r, err := s.read(ctx, name)
	if err != nil {
		return Snapshot{}, err
	}
	return r.Snapshot, nil
}

// Lookup returns one snapshot and the object it belongs to (nil: none).
func (s *Service) Lookup(ctx context.Context, name string) (Snapshot, *Owner, error) {
	r, err := s.read(ctx, name)
	if err != nil {
		return Snapshot{}, nil, err
	}
	return r.Snapshot, r.Owner, nil
}

// OwnedBy returns the snapshots that belong to an object named ns/name
// (whatever its uid), by name.
func (s *Service) OwnedBy(ctx context.Context, ns, name string) ([]Snapshot, error) {
	rs, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	var out []Snapshot
	for _, r := range rs {
		if r.Owner != nil && r.Owner.Namespace == ns && r.Owner.Name == name {
			out = append(out, r.Snapshot)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Bind makes snapshot name o's: it must have no owner yet (or be o's
// already), and be neither a clone's nor being deleted. adopt, when set,
// says whether a snapshot without an owner may be taken (nil: any).
func (s *Service) Bind(ctx context.Context, name string, o Owner, adopt func(Snapshot) bool) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.read(ctx, name)
	if err != nil {
		return Snapshot{}, err
	}
	switch {
	case r.Owner.Is(&o):
		return r.Snapshot, nil
	case r.Owner != nil:
		return r.Snapshot, fmt.Errorf("%w: snapshot %s belongs to %s", ErrNotOwner, name, r.Owner)
	case r.For != "":
		return r.Snapshot, fmt.Errorf("%w: snapshot %s was taken for the clone %s and goes with it", ErrNotOwner, name, r.For)
	case r.Phase == Deleting:
		return r.Snapshot, fmt.Errorf("%w: snapshot %s is being deleted", ErrNotOwner, name)
	case adopt != nil && !adopt(r.Snapshot):
		return r.Snapshot, fmt.Errorf("%w: snapshot %s belongs to no object", ErrNotOwner, name)
	}
	r.Owner = &o
	// Handed to the object, a scheduled snapshot leaves its schedule's
	// retention for good (released later, it is kept: schedules.go).
	r.ScheduleID = ""
	if err := s.write(ctx, r); err != nil {
		return Snapshot{}, err
	}
	return r.Snapshot, nil
}

// Release drops o's ownership of a snapshot bound to it and keeps the
// snapshot; a snapshot that is not o's is left as it is.
func (s *Service) Release(ctx context.Context, name string, o Owner) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.read(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if !r.Owner.Is(&o) {
		return nil
	}
	r.Owner = nil
	return s.write(ctx, r)
}

// DeleteOwned is Delete of a snapshot that belongs to o: one of another
// object's, or of none, is refused with ErrNotOwner.
func (s *Service) DeleteOwned(ctx context.Context, name, by string, o Owner) (Snapshot, error) {
	return s.remove(ctx, name, by, &o)
}

// List returns the snapshots of one volume ("" for all), by name.
func (s *Service) List(ctx context.Context, vol string) ([]Snapshot, error) {
	rs, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	out := []Snapshot{}
	for _, r := range rs {
		if vol == "" || r.Volume == vol {
			out = append(out, r.Snapshot)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Take asks for snapshot name of volume v. Asking again for the same one
// answers it (and starts a failed one again); created says whether a new
// record was written.
func (s *Service) Take(ctx context.Context, v *volume.Volume, name, by string) (snap Snapshot, created bool, err error) {
	return s.TakeFor(ctx, v, name, by, "", 0)
}

// TakeFor is Take of a snapshot that exists only to be cloned as volume
// clone: the leader deletes it once that volume is Available (or, an hour
// on, when no such volume was ever made).
//
// cow is a thick LVM snapshot's copy-on-write space (0: the node's
// default, a quarter of the LV); other volumes take none.
func (s *Service) TakeFor(ctx context.Context, v *volume.Volume, name, by, clone string, cow int64) (snap Snapshot, created bool, err error) {
	return s.take(ctx, v, name, by, clone, cow, nil, nil)
}

// TakeOwned is Take of a snapshot that belongs to object o from the
// start: a record of that name that is not o's is refused (409, field
// name), never taken over.
func (s *Service) TakeOwned(ctx context.Context, v *volume.Volume, name, by string, cow int64, o Owner) (snap Snapshot, created bool, err error) {
	return s.take(ctx, v, name, by, "", cow, &o, nil)
}

func (s *Service) take(ctx context.Context, v *volume.Volume, name, by, clone string, cow int64, owner *Owner, sched *scheduleRecord) (snap Snapshot, created bool, err error) {
	s.init()
	if clone != "" && !names.MatchString(clone) {
		return Snapshot{}, false, &Error{400, "for", fmt.Sprintf("for: %q is not a volume name", clone)}
	}
	if !names.MatchString(name) {
		return Snapshot{}, false, &Error{400, "name", fmt.Sprintf("name: %q is not a snapshot name: lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit", name)}
	}
	switch {
	case cow < 0 || (cow > 0 && v.Spec.SparseLoopDevice != nil):
		return Snapshot{}, false, &Error{400, "size", fmt.Sprintf("size: only a thick LVM snapshot sets space aside; volume %s takes no size (leave it out)", v.Spec.Name)}
	case cow > 0 && v.Spec.LVMLogicalVolume != nil && v.Spec.LVMLogicalVolume.ThinPool != "":
		return Snapshot{}, false, &Error{400, "size", fmt.Sprintf("size: volume %s is a thin LV: its snapshots share its pool and take no size (leave it out)", v.Spec.Name)}
	case v.DeleteRequested:
		return Snapshot{}, false, &Error{409, "volume", fmt.Sprintf("volume %s is being deleted: nothing to take a snapshot of", v.Spec.Name)}
	case v.Spec.Encryption != nil:
		return Snapshot{}, false, &Error{422, "volume", fmt.Sprintf("volume %s is encrypted: snapshots of encrypted volumes are not in this release", v.Spec.Name)}
	case v.Status.Phase != volume.Available:
		return Snapshot{}, false, &Error{409, "volume", fmt.Sprintf("volume %s is %s: take its snapshot once it is Available (salt-volumes wait %s --for Available)", v.Spec.Name, v.Status.Phase, v.Spec.Name)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.restoring(ctx, v.Spec.UUID, "take its snapshot"); err != nil {
		return Snapshot{}, false, err
	}
	r, err := s.read(ctx, name)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return Snapshot{}, false, err
	case owner != nil && !r.Owner.Is(owner):
		return Snapshot{}, false, &Error{409, "name", fmt.Sprintf("name: snapshot %s exists and is not this object's (it belongs to %s): nothing was taken", name, r.Owner)}
	case r.VolumeUUID != v.Spec.UUID:
		return Snapshot{}, false, &Error{409, "name", fmt.Sprintf("name: snapshot %s is volume %s's: pick another name", name, r.Volume)}
	case sched != nil && r.ScheduleID != sched.ID:
		return Snapshot{}, false, &Error{409, "name", fmt.Sprintf("name: snapshot %s exists and is not this schedule's (asked by %s): nothing was taken for this slot", name, or(r.RequestedBy, "someone else"))}
	case r.Phase == Failed:
		r.Phase, r.Message, r.JobID, r.JobStartedAt = Pending, "", "", nil
		if err := s.write(ctx, r); err != nil {
			return Snapshot{}, false, err
		}
		s.Kick()
		return r.Snapshot, false, nil
	default:
		return r.Snapshot, false, nil
	}
	now := time.Now().UTC()
	r = &record{Snapshot: Snapshot{Name: name, Volume: v.Spec.Name, VolumeUUID: v.Spec.UUID, Node: v.Spec.Node,
		Phase: Pending, RequestedBy: by, CreatedAt: now, For: clone, COWSize: cow}, Spec: v.Spec, Owner: owner, NodeID: newNodeID()}
	if sched != nil {
		r.Schedule, r.ScheduleID = sched.Volume, sched.ID
	}
	if err := s.write(ctx, r); err != nil {
		return Snapshot{}, false, err
	}
	s.Kick()
	return r.Snapshot, true, nil
}

// Delete asks for a snapshot's deletion on its node.
func (s *Service) Delete(ctx context.Context, name, by string) (Snapshot, error) {
	return s.remove(ctx, name, by, nil)
}

func (s *Service) remove(ctx context.Context, name, by string, owner *Owner) (Snapshot, error) {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.read(ctx, name)
	if err != nil {
		return Snapshot{}, err
	}
	if owner != nil && !r.Owner.Is(owner) {
		return r.Snapshot, fmt.Errorf("%w: snapshot %s belongs to %s", ErrNotOwner, name, r.Owner)
	}
	if r.Restore != nil && r.Restore.Phase == Restoring {
		return r.Snapshot, &Error{409, "name", fmt.Sprintf("snapshot %s: volume %s is being restored from it: delete it once that has finished", name, r.Volume)}
	}
	if r.Phase != Deleting {
		r.Phase, r.Message, r.JobID, r.JobStartedAt = Deleting, "", "", nil
		if by != "" {
			r.RequestedBy = by
		}
		if err := s.write(ctx, r); err != nil {
			return Snapshot{}, err
		}
	}
	s.Kick()
	return r.Snapshot, nil
}

// Forget drops the records of the named volumes' snapshots without
// touching any node (node forget: the node is gone).
func (s *Service) Forget(ctx context.Context, vols []string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	var gone []string
	for _, r := range rs {
		for _, v := range vols {
			if r.Volume == v {
				if err := s.writer().DeleteRecord(ctx, Kind, r.Name); err != nil {
					return gone, err
				}
				gone = append(gone, r.Name)
			}
		}
	}
	return gone, nil
}

// Run takes and deletes snapshots on their nodes until ctx ends: on the
// replica that leads, for one term, writing through fenced (nil: Records)
// meanwhile.
func (s *Service) Run(ctx context.Context, fenced store.Records) {
	s.init()
	s.termMu.Lock()
	s.term = fenced
	s.termMu.Unlock()
	defer func() {
		s.termMu.Lock()
		s.term = nil
		s.termMu.Unlock()
	}()
	// Schedules take snapshots in the same term, through the same
	// fenced writer; Run returns once they stopped too.
	sched := make(chan struct{})
	defer func() { <-sched }()
	go func() { defer close(sched); s.runSchedules(ctx) }()
	for {
		busy := s.pass(ctx)
		every := s.nextLook()
		if !busy {
			// Nothing unfinished: a request here kicks; one through
			// another replica is seen within this.
			every = 6 * s.Every
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// pass acts on every unfinished snapshot; it says whether any is left.
func (s *Service) pass(ctx context.Context) bool {
	rs, err := s.all(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.Log.Warn("reading snapshots", "error", err)
		}
		return true
	}
	s.noteRunning(rs)
	busy := false
	for _, r := range rs {
		if r.Phase == Ready && r.For != "" && s.cloned(r) {
			// Its clone has its own copy now.
			s.Log.Info("snapshot taken for a clone deleted: the clone is Available", "snapshot", r.Name, "clone", r.For)
			if _, err := s.Delete(ctx, r.Name, ""); err != nil {
				s.Log.Warn("deleting a clone's snapshot", "snapshot", r.Name, "error", err)
			}
			busy = true
			continue
		}
		if r.For != "" && r.Phase != Failed {
			busy = true // its clone is on its way: look again soon
		}
		s.saveProgress(ctx, r)
		if r.Restore != nil && r.Restore.Phase == Restoring {
			if !s.stepRestore(ctx, r) {
				busy = true
			}
			continue
		}
		if r.Phase != Pending && r.Phase != Deleting {
			continue
		}
		if consumedLately(r) {
			busy = true // its deletion starts in a moment
			continue
		}
		if r.JobID == "" {
			s.launch(ctx, r)
			busy = true
			continue
		}
		info, err := s.Salt.ListJob(ctx, r.JobID)
		if err != nil {
			if ctx.Err() == nil {
				s.Log.Warn("looking up a snapshot's job", "snapshot", r.Name, "job", r.JobID, "error", err)
			}
			busy = true
			continue
		}
		if !s.settle(ctx, r, info) {
			busy = true
		}
	}
	return busy
}

func (s *Service) launch(ctx context.Context, r *record) {
	action := "taken"
	if r.Phase == Deleting {
		action = "deleted"
	}
	jctx := ctx
	if r.RequestedBy != "" {
		jctx = saltapi.WithMetadata(ctx, map[string]any{"salt-volumes": map[string]any{"requestedBy": map[string]any{"snapshot/" + r.Name: r.RequestedBy}}})
	}
	kw := map[string]any{}
	if action == "taken" && r.COWSize > 0 {
		kw["size"] = strconv.FormatInt(r.COWSize, 10)
	}
	if r.NodeID != "" {
		kw["owner"] = r.NodeID
	}
	if len(kw) == 0 {
		kw = nil
	}
	job, err := s.Salt.LocalAsync(jctx, r.Node, FunApply, []any{action, r.Spec, r.Name}, kw)
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, rerr := s.read(ctx, r.Name)
	if rerr != nil || cur.Phase != r.Phase || cur.JobID != "" {
		// Changed meanwhile (a deletion asked for while this took it):
		// the next pass acts on what it is now.
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			cur.Message = fmt.Sprintf("could not start the job on %s: %v; trying again", r.Node, err)
			_ = s.write(ctx, cur)
			s.Log.Warn("starting a snapshot job", "snapshot", r.Name, "node", r.Node, "error", err)
		}
		return
	}
	now := time.Now().UTC()
	cur.JobID, cur.JobStartedAt, cur.Message = job.JID, &now, ""
	if err := s.write(ctx, cur); err != nil {
		s.Log.Warn("saving a snapshot's job", "snapshot", r.Name, "job", job.JID, "error", err)
		return
	}
	s.Log.Info("snapshot job started", "snapshot", r.Name, "volume", r.Volume, "node", r.Node, "action", action, "job", job.JID)
}

// cloned tells whether the clone a snapshot was taken for no longer needs
// it: Available, or never made within an hour of the snapshot.
func (s *Service) cloned(r *record) bool {
	if s.Volumes == nil {
		return false
	}
	v, err := s.Volumes.Get(r.For)
	if errors.Is(err, store.ErrNotFound) {
		return time.Since(r.CreatedAt) > time.Hour
	}
	return err == nil && v.Status.Phase == volume.Available && v.Spec.Source != nil && v.Spec.Source.Snapshot == r.Name
}

// nodeAnswer is the part of the node's answer a snapshot record keeps.
type nodeAnswer struct {
	Name       string     `json:"name"`
	VolumeUUID string     `json:"volumeUUID"`
	Method     string     `json:"method"`
	Frozen     bool       `json:"frozen"`
	Size       int64      `json:"size"`
	Allocated  int64      `json:"allocated"`
	COWSize    int64      `json:"cowSize"`
	LV         string     `json:"lv"`
	TakenAt    *time.Time `json:"takenAt"`
	Deleted    string     `json:"deleted"`
}

// settle applies the job cache's answer; it says whether the snapshot
// is finished (Ready, Failed or deleted).
func (s *Service) settle(ctx context.Context, r *record, info saltapi.JobInfo) bool {
	ret, returned := info.Returns[r.Node]
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.read(ctx, r.Name)
	if err != nil || cur.JobID != r.JobID || cur.Phase != r.Phase {
		return false
	}
	if !returned {
		started := time.Time{}
		if cur.JobStartedAt != nil {
			started = *cur.JobStartedAt
		}
		switch age := time.Since(started); {
		case !info.Known && age > 30*time.Second, age > s.JobTimeout:
			// Lost (the master never ran it, or its cache expired) or
			// stuck: start it again.
			s.Log.Warn("snapshot job without a return; starting it again", "snapshot", cur.Name, "job", cur.JobID, "age", age.Round(time.Second))
			cur.JobID, cur.JobStartedAt = "", nil
			cur.Message = fmt.Sprintf("job %s had no return from %s after %s; started again", r.JobID, r.Node, age.Round(time.Second))
			_ = s.write(ctx, cur)
			s.Kick()
		}
		return false
	}
	var ans nodeAnswer
	okAnswer := ret.Retcode == 0 && json.Unmarshal(ret.Return, &ans) == nil
	if okAnswer && cur.Phase == Pending && (ans.Name != cur.Name || ans.VolumeUUID != cur.VolumeUUID) {
		okAnswer = false
	}
	if !okAnswer {
		msg := failure(ret.Return)
		if !cur.Synced && (strings.Contains(msg, "is not available") || (cur.NodeID != "" && strings.Contains(msg, "owner") && (strings.Contains(msg, "not valid") || strings.Contains(msg, "unexpected keyword")))) {
			// The minion's modules predate apply_snapshot: sync them
			// from base once and run it again.
			cur.Synced, cur.JobID, cur.JobStartedAt = true, "", nil
			cur.Message = r.Node + " did not know " + FunApply + ": its modules are synced (saltutil.sync_all base), running again"
			if _, err := s.Salt.LocalAsync(ctx, r.Node, "saltutil.sync_all", []any{"base"}, nil); err != nil {
				s.Log.Warn("syncing a node's modules", "node", r.Node, "error", err)
			}
			_ = s.write(ctx, cur)
			return false
		}
		if strings.HasPrefix(msg, nameTaken) && cur.Phase == Deleting {
			// The node's snapshot of that name is not this record's
			// (this record's was never taken): it is left there, and
			// only the record goes.
			if err := s.writer().DeleteRecord(ctx, Kind, cur.Name); err != nil {
				s.Log.Warn("removing a snapshot's record", "snapshot", cur.Name, "error", err)
				return false
			}
			s.Log.Info("snapshot record deleted; the node's snapshot of that name is not its own and stays", "snapshot", cur.Name, "node", r.Node, "job", r.JobID)
			return true
		}
		s.Failures.Add(1)
		if strings.HasPrefix(msg, nameTaken) {
			cur.Phase, cur.JobID, cur.JobStartedAt = Failed, "", nil
			cur.Message = fmt.Sprintf("not taken: %s already has a snapshot named %s that this request did not take (job %s): %s. Nothing on the node was changed; deleting this Failed snapshot removes only this record. Take the snapshot under another name", r.Node, cur.Name, r.JobID, strings.TrimPrefix(msg, nameTaken))
			s.Log.Warn("snapshot name taken on the node", "snapshot", cur.Name, "node", r.Node, "job", r.JobID)
			_ = s.write(ctx, cur)
			return true
		}
		verb := "taking"
		if cur.Phase == Deleting {
			verb = "deleting"
		}
		cur.Phase, cur.JobID, cur.JobStartedAt = Failed, "", nil
		cur.Message = fmt.Sprintf("%s it on %s failed (job %s): %s", verb, r.Node, r.JobID, msg)
		s.Log.Warn("snapshot job failed", "snapshot", cur.Name, "node", r.Node, "job", r.JobID, "message", msg)
		_ = s.write(ctx, cur)
		return true
	}
	if cur.Phase == Deleting {
		if err := s.writer().DeleteRecord(ctx, Kind, cur.Name); err != nil {
			s.Log.Warn("removing a deleted snapshot's record", "snapshot", cur.Name, "error", err)
			return false
		}
		s.Deleted.Add(1)
		s.Log.Info("snapshot deleted", "snapshot", cur.Name, "volume", cur.Volume, "node", cur.Node, "job", r.JobID)
		return true
	}
	s.Taken.Add(1)
	cur.Phase, cur.Message, cur.JobStartedAt = Ready, "", nil
	cur.Method, cur.Frozen, cur.Size, cur.Allocated, cur.TakenAt = ans.Method, ans.Frozen, ans.Size, ans.Allocated, ans.TakenAt
	cur.COWSize, cur.LV = ans.COWSize, ans.LV
	if err := s.write(ctx, cur); err != nil {
		s.Log.Warn("saving a snapshot", "snapshot", cur.Name, "error", err)
		return false
	}
	s.Log.Info("snapshot taken", "snapshot", cur.Name, "volume", cur.Volume, "node", cur.Node, "method", ans.Method, "job", r.JobID)
	return true
}

// failure reads a failed return: Salt's "ERROR: ..." string, or whatever
// else the minion answered.
func failure(raw json.RawMessage) string {
	var msg string
	if json.Unmarshal(raw, &msg) != nil {
		msg = string(raw)
	}
	msg = strings.TrimPrefix(strings.TrimSpace(msg), "ERROR: ")
	if len(msg) > 2000 {
		msg = msg[:2000] + "..."
	}
	return msg
}

// NodeUse is a node's snapshots: how many, and the bytes they use.
type NodeUse struct {
	Count     int
	Allocated int64
}

// PerNode sums the Ready snapshots per node (for metrics).
func (s *Service) PerNode(ctx context.Context) (map[string]NodeUse, error) {
	rs, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]NodeUse{}
	for _, r := range rs {
		if r.Phase != Ready {
			continue
		}
		u := out[r.Node]
		u.Count++
		u.Allocated += r.Allocated
		out[r.Node] = u
	}
	return out, nil
}
