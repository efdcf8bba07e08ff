package snapshots

import (
	"context"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// A snapshot's copy and a restore's tell their bytes as they go, as
// progress events on their volume (the origin; the one restored). Those
// events carry no job id: the latest report per volume is kept here (in
// memory: a report is worth seconds), and the leader's loop saves it on
// the snapshot whose job runs on that volume, on that node, when the
// report came after the job started. A volume has one such job at a
// time (a restore refuses while a snapshot of it is taken, and the
// other way round).

// progressSaveEvery spaces the saves of one snapshot's progress (a write
// of its record each), but for the last report.
const progressSaveEvery = 5 * time.Second

// maxProgressNotes bounds the reports kept: a minion that fires them for
// made-up volumes fills no more than this.
const maxProgressNotes = 4096

type progressNote struct {
	step        string
	done, total int64
	at          time.Time
}

// Progress takes a progress event's report of a long step (the
// reconciler passes on those in Salt's single-event envelope; the
// node is the minion that fired it). It never waits on the store.
func (s *Service) Progress(node, uuid, step string, done, total int64) {
	if node == "" || uuid == "" || step == "" || total <= 0 || done < 0 || done > total {
		return
	}
	now := time.Now()
	s.progMu.Lock()
	defer s.progMu.Unlock()
	if s.prog == nil {
		s.prog = map[string]progressNote{}
	}
	// By node and volume: another minion's reports for this volume (its
	// uuid is no secret) do not hide its own node's.
	key := node + "/" + uuid
	if _, ok := s.prog[key]; !ok && len(s.prog) >= maxProgressNotes {
		for k, n := range s.prog {
			if now.Sub(n.at) > restoreJobLimit {
				delete(s.prog, k)
			}
		}
		if len(s.prog) >= maxProgressNotes {
			return
		}
	}
	s.prog[key] = progressNote{step: step, done: done, total: total, at: now}
}

// saveProgress saves on r the last report of its running job's copy,
// when one came since the job started and a save is due.
func (s *Service) saveProgress(ctx context.Context, r *record) {
	restoring := r.Restore != nil && r.Restore.Phase == Restoring && r.Restore.JobID != ""
	started, have := r.JobStartedAt, r.Progress
	switch {
	case restoring:
		started, have = r.RestoreJobStartedAt, r.Restore.Progress
	case r.Phase != Pending || r.JobID == "":
		return
	}
	s.progMu.Lock()
	n, ok := s.prog[r.Node+"/"+r.VolumeUUID]
	s.progMu.Unlock()
	if !ok || started == nil || n.at.Before(*started) {
		return
	}
	p := saltvolumes.Progress{Step: n.step, Done: n.done, Total: n.total}
	if have != nil && *have == p || p.Done != p.Total && time.Since(r.UpdatedAt) < progressSaveEvery {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.read(ctx, r.Name)
	if err != nil {
		return
	}
	if restoring {
		if cur.Restore == nil || cur.Restore.Phase != Restoring || cur.Restore.JobID != r.Restore.JobID {
			return // settled meanwhile
		}
		cur.Restore.Progress = &p
	} else {
		if cur.Phase != Pending || cur.JobID != r.JobID {
			return
		}
		cur.Progress = &p
	}
	if err := s.write(ctx, cur); err != nil && ctx.Err() == nil {
		s.Log.Warn("saving a snapshot's progress", "snapshot", r.Name, "error", err)
	}
}

// dropEndedProgress clears, as r is saved, the progress of a job that
// is no longer running: the API shows progress only while it moves.
func dropEndedProgress(r *record) {
	if r.Phase != Pending || r.JobID == "" {
		r.Progress = nil
	}
	if rs := r.Restore; rs != nil && (rs.Phase != Restoring || rs.JobID == "") {
		rs.Progress = nil
	}
}
