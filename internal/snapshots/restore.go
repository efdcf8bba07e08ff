package snapshots

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// restoreJobLimit is how long a restore job the master knows is waited
// for: the node's module stops salt-volume-exec after its exec_timeout
// (3600 s by default), a little after which no answer will come.
const restoreJobLimit = 65 * time.Minute

// Phases of a restore (Snapshot.Restore.Phase).
const (
	Restoring = "Restoring" // its job runs (or is about to)
	Restored  = "Restored"
	// A failed restore's phase is Failed, like a snapshot's.
)

// Restore asks for volume v to be put back to snapshot name in place
// (salt-volume-exec snapshot-restore on its node). Asking while a restore
// from that snapshot runs answers it (started false). Refused (409) unless
// the snapshot is Ready, of v as it is now, and v is a sparse or LVM volume
// that is Available, not being deleted, with no other job of its snapshots
// running. The restore is kept on the snapshot's record, last one only; a
// snapshot the restore used up (a thick LVM snapshot merges into its
// volume) goes afterwards (consumed).
func (s *Service) Restore(ctx context.Context, v *volume.Volume, name, by string) (snap Snapshot, started bool, err error) {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.read(ctx, name)
	if err != nil {
		return Snapshot{}, false, err
	}
	if r.Restore != nil && r.Restore.Phase == Restoring {
		return r.Snapshot, false, nil
	}
	vol := v.Spec.Name
	switch {
	case r.Phase != Ready:
		return r.Snapshot, false, &Error{409, "name", fmt.Sprintf("snapshot %s is %s: only a Ready snapshot is restored", name, r.Phase)}
	case r.For != "":
		// It goes once its clone is Available, which a restore running
		// from it would hold up for good.
		return r.Snapshot, false, &Error{409, "name", fmt.Sprintf("snapshot %s was taken for the clone %s alone and is deleted once that is Available: restore from a snapshot of your own", name, r.For)}
	case v.Spec.UUID != r.VolumeUUID:
		return r.Snapshot, false, &Error{409, "volume", fmt.Sprintf("snapshot %s is of volume %s (%s), which is gone: volume %s is another one", name, r.Volume, r.VolumeUUID, vol)}
	case v.Spec.SparseLoopDevice == nil && v.Spec.LVMLogicalVolume == nil:
		// A raw volume on a disk has no snapshots; one on an operator's
		// LV has LVM's, which salt-volumes does not merge into that LV.
		return r.Snapshot, false, &Error{409, "volume", fmt.Sprintf("volume %s is a raw volume: only sparse and LVM volumes are restored in place (a raw volume on an operator's LV: lvconvert --merge by hand, or clone the snapshot: salt-volumes create NEW --from snapshot/%s)", vol, name)}
	case v.DeleteRequested:
		return r.Snapshot, false, &Error{409, "volume", fmt.Sprintf("volume %s is being deleted: nothing to restore", vol)}
	case v.Status.Phase != volume.Available:
		return r.Snapshot, false, &Error{409, "volume", fmt.Sprintf("volume %s is %s: restore it once it is Available (salt-volumes wait %s --for Available)", vol, v.Status.Phase, vol)}
	}
	if busy, err := s.busyWith(ctx, r.VolumeUUID, name); err != nil {
		return Snapshot{}, false, err
	} else if busy != "" {
		return r.Snapshot, false, &Error{409, "volume", fmt.Sprintf("volume %s: %s: restore it once that has finished", vol, busy)}
	}
	now := time.Now().UTC()
	r.Restore = &saltvolumes.SnapshotRestore{Phase: Restoring, RequestedBy: by, RequestedAt: now}
	// The volume's spec as it is now: one grown since the snapshot would
	// be refused by its node under the snapshot's older, smaller spec.
	sp := v.Spec
	r.RestoreSpec = &sp
	r.RestoreJobStartedAt = nil
	if err := s.write(ctx, r); err != nil {
		return Snapshot{}, false, err
	}
	s.Kick()
	return r.Snapshot, true, nil
}

// busyWith names a job of volume uuid's snapshots other than a restore
// from except that runs: a snapshot taken or deleted, or a restore.
// Called with s.mu held.
func (s *Service) busyWith(ctx context.Context, uuid, except string) (string, error) {
	rs, err := s.all(ctx)
	if err != nil {
		return "", err
	}
	for _, o := range rs {
		if o.VolumeUUID != uuid {
			continue
		}
		if o.Phase == Deleting && o.Restore != nil && o.Restore.Phase == Restored && o.Restore.SnapshotConsumed {
			// Gone on the node already: its deletion changes nothing
			// there, and holds nothing up.
			continue
		}
		switch {
		case o.Restore != nil && o.Restore.Phase == Restoring && o.Name != except:
			return fmt.Sprintf("it is being restored from snapshot %s", o.Name), nil
		case o.Phase == Pending:
			return fmt.Sprintf("snapshot %s of it is being taken", o.Name), nil
		case o.Phase == Deleting:
			return fmt.Sprintf("snapshot %s of it is being deleted", o.Name), nil
		}
	}
	return "", nil
}

// Restoring names the snapshot volume vol is being restored from ("" when
// none): while that runs, the volume is not deleted, grown or snapshotted.
func (s *Service) Restoring(ctx context.Context, vol string) (string, error) {
	rs, err := s.all(ctx)
	if err != nil {
		return "", err
	}
	for _, r := range rs {
		if r.Volume == vol && r.Restore != nil && r.Restore.Phase == Restoring {
			return r.Name, nil
		}
	}
	return "", nil
}

// restoring refuses a change to a snapshot's volume while a restore of it
// runs (409). Called with s.mu held.
func (s *Service) restoring(ctx context.Context, uuid, what string) error {
	rs, err := s.all(ctx)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if r.VolumeUUID == uuid && r.Restore != nil && r.Restore.Phase == Restoring {
			return &Error{409, "volume", fmt.Sprintf("volume %s is being restored from snapshot %s: %s once that has finished", r.Volume, r.Name, what)}
		}
	}
	return nil
}

// stepRestore launches or looks up a restore's job; it says whether the
// restore is finished.
func (s *Service) stepRestore(ctx context.Context, r *record) bool {
	if r.Restore.JobID == "" {
		s.launchRestore(ctx, r)
		return false
	}
	info, err := s.Salt.ListJob(ctx, r.Restore.JobID)
	if err != nil {
		if ctx.Err() == nil {
			s.Log.Warn("looking up a restore's job", "snapshot", r.Name, "job", r.Restore.JobID, "error", err)
		}
		return false
	}
	return s.settleRestore(ctx, r, info)
}

func (s *Service) launchRestore(ctx context.Context, r *record) {
	sp := r.Spec
	if r.RestoreSpec != nil {
		sp = *r.RestoreSpec
	}
	if why := s.stillRestorable(r); why != "" {
		// Changed between the request and its job (another replica's
		// request, a node report): nothing was run.
		s.endRestore(ctx, r, Failed, why+": nothing was run, the volume is as it was", nil)
		return
	}
	jctx := ctx
	if r.Restore.RequestedBy != "" {
		jctx = saltapi.WithMetadata(ctx, map[string]any{"salt-volumes": map[string]any{"requestedBy": map[string]any{"restore/" + r.Name: r.Restore.RequestedBy}}})
	}
	job, err := s.Salt.LocalAsync(jctx, r.Node, FunApply, []any{"restored", sp, r.Name}, nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, rerr := s.read(ctx, r.Name)
	if rerr != nil || cur.Restore == nil || cur.Restore.Phase != Restoring || cur.Restore.JobID != "" {
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			cur.Restore.Message = fmt.Sprintf("could not start the job on %s: %v; trying again", r.Node, err)
			_ = s.write(ctx, cur)
			s.Log.Warn("starting a restore job", "snapshot", r.Name, "node", r.Node, "error", err)
		}
		return
	}
	now := time.Now().UTC()
	cur.Restore.JobID, cur.Restore.Message, cur.RestoreJobStartedAt = job.JID, "", &now
	if err := s.write(ctx, cur); err != nil {
		s.Log.Warn("saving a restore's job", "snapshot", r.Name, "job", job.JID, "error", err)
		return
	}
	s.Log.Info("restore job started", "snapshot", r.Name, "volume", r.Volume, "node", r.Node, "job", job.JID, "requestedBy", r.Restore.RequestedBy)
}

// stillRestorable says why the volume may not be restored now ("": it
// may), when the service reads volumes.
func (s *Service) stillRestorable(r *record) string {
	if s.Volumes == nil {
		return ""
	}
	v, err := s.Volumes.Get(r.Volume)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Sprintf("volume %s is gone", r.Volume)
	case err != nil:
		return "" // the node checks the volume itself
	case v.Spec.UUID != r.VolumeUUID:
		return fmt.Sprintf("volume %s is another volume now", r.Volume)
	case v.DeleteRequested:
		return fmt.Sprintf("volume %s is being deleted", r.Volume)
	case v.Status.Phase != volume.Available:
		return fmt.Sprintf("volume %s is %s", r.Volume, v.Status.Phase)
	}
	return ""
}

// restoreAnswer is the part of snapshot-restore's answer a restore keeps.
type restoreAnswer struct {
	Snapshot   string   `json:"snapshot"`
	Method     string   `json:"method"`
	SameDevice bool     `json:"sameDevice"`
	Took       string   `json:"took"`
	Warnings   []string `json:"warnings"`
	// SnapshotConsumed: the restore used the snapshot up (a thick LVM
	// snapshot merged into its volume): on the node it is gone.
	SnapshotConsumed bool `json:"snapshotConsumed"`
	Volume           *struct {
		UUID string `json:"uuid"`
	} `json:"volume"`
}

func (s *Service) settleRestore(ctx context.Context, r *record, info saltapi.JobInfo) bool {
	ret, returned := info.Returns[r.Node]
	if !returned {
		started := time.Time{}
		if r.RestoreJobStartedAt != nil {
			started = *r.RestoreJobStartedAt
		}
		// Never started again by itself: a second run would put the
		// volume back once more, over whatever was written after the
		// first one finished (its return lost, or late). A job the master
		// knows is waited for as long as the node may run it (its
		// exec_timeout, an hour); one it does not know is said lost.
		age := time.Since(started)
		lost := !info.Known && age > 30*time.Second
		if !lost && age <= restoreJobLimit {
			return false
		}
		msg := fmt.Sprintf("job %s has no return from %s after %s: the restore may have run, or may be running still; look at the volume's data before asking again (salt-volumes snapshot restore %s)", r.Restore.JobID, r.Node, age.Round(time.Second), r.Name)
		if lost {
			msg = fmt.Sprintf("job %s is not known to the master after %s: it was lost before or after it ran on %s; look at the volume's data before asking again (salt-volumes snapshot restore %s)", r.Restore.JobID, age.Round(time.Second), r.Node, r.Name)
		}
		s.Log.Warn("restore job without a return: ended, not started again", "snapshot", r.Name, "job", r.Restore.JobID, "age", age.Round(time.Second), "known", info.Known)
		s.endRestore(ctx, r, Failed, msg, nil)
		return true
	}
	var ans restoreAnswer
	if ret.Retcode != 0 || json.Unmarshal(ret.Return, &ans) != nil || ans.Snapshot != r.Name ||
		(ans.Volume != nil && ans.Volume.UUID != "" && ans.Volume.UUID != r.VolumeUUID) {
		msg := failure(ret.Return)
		s.Failures.Add(1)
		s.Log.Warn("restore job failed", "snapshot", r.Name, "volume", r.Volume, "node", r.Node, "job", r.Restore.JobID, "message", msg)
		text := fmt.Sprintf("restoring volume %s on %s failed (job %s): %s", r.Volume, r.Node, r.Restore.JobID, msg)
		if _, unfinished, ok := strings.Cut(msg, RestoreUnfinished+": "); ok {
			// Past an LVM merge: not "left as it was". Still never run
			// again by itself: whoever asked runs it again.
			text = fmt.Sprintf("restoring volume %s on %s did not finish (job %s): the volume already holds the data of snapshot %s (LVM merged it, or is merging it), so it was NOT left as it was; ask the restore again to finish it (salt-volumes snapshot restore %s): %s", r.Volume, r.Node, r.Restore.JobID, r.Name, r.Name, unfinished)
		}
		s.endRestore(ctx, r, Failed, text, nil)
		return true
	}
	s.Log.Info("volume restored from its snapshot", "snapshot", r.Name, "volume", r.Volume, "node", r.Node, "job", r.Restore.JobID, "method", ans.Method, "sameDevice", ans.SameDevice, "snapshotConsumed", ans.SnapshotConsumed)
	s.endRestore(ctx, r, Restored, "", &ans)
	return true
}

// endRestore writes a restore's outcome, if the record still has the
// restore r had.
func (s *Service) endRestore(ctx context.Context, r *record, phase, msg string, ans *restoreAnswer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.read(ctx, r.Name)
	if err != nil || cur.Restore == nil || cur.Restore.Phase != Restoring || cur.Restore.JobID != r.Restore.JobID {
		return
	}
	now := time.Now().UTC()
	cur.Restore.Phase, cur.Restore.Message, cur.Restore.FinishedAt = phase, msg, &now
	cur.RestoreJobStartedAt = nil
	if ans != nil {
		cur.Restore.Method, cur.Restore.SameDevice, cur.Restore.Took, cur.Restore.Warnings = ans.Method, ans.SameDevice, ans.Took, ans.Warnings
		cur.Restore.SnapshotConsumed = ans.SnapshotConsumed
	}
	if ans != nil && ans.SnapshotConsumed {
		// Gone on the node: the record goes too, through a deletion its
		// node confirms (nothing left to remove there), after a moment
		// in which the restore's outcome is still read here (a CLI's
		// --wait, a claim's restore): see pass.
		cur.Phase, cur.JobID, cur.JobStartedAt = Deleting, "", nil
		if cur.Restore.RequestedBy != "" {
			// The deletion's job says who caused it: the restorer.
			cur.RequestedBy = cur.Restore.RequestedBy
		}
		cur.Message = fmt.Sprintf("used up by the restore of volume %s (a thick LVM snapshot merges into its volume and is gone): its record goes", cur.Volume)
	}
	if err := s.write(ctx, cur); err != nil {
		s.Log.Warn("saving a restore", "snapshot", cur.Name, "error", err)
	}
	if ans != nil && ans.SnapshotConsumed {
		s.Kick()
	}
}

// RestoreUnfinished starts the node's message of an LVM restore that
// failed after its merge was asked for (code restore_unfinished): the
// volume holds the snapshot's data, and the restore must be asked again
// to finish.
const RestoreUnfinished = "restore_unfinished"

// consumedGrace is how long a snapshot a restore used up keeps its record,
// showing the restore's outcome, before its deletion starts.
const consumedGrace = 10 * time.Second

// consumedLately: r is a snapshot a restore used up less than
// consumedGrace ago, whose deletion waits.
func consumedLately(r *record) bool {
	rs := r.Restore
	return r.Phase == Deleting && r.JobID == "" && rs != nil && rs.Phase == Restored && rs.SnapshotConsumed &&
		rs.FinishedAt != nil && time.Since(*rs.FinishedAt) < consumedGrace
}
