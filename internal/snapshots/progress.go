package snapshots

import (
	"context"
	"regexp"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// A snapshot's copy and a restore's tell their bytes as they go, as
// progress events on their volume (the origin; the one restored). Those
// events carry no job id: the latest report per node and volume is kept
// here (in memory: a report is worth seconds), for the volumes that have
// a snapshot being taken or a restore running (the loop's last pass
// says which), and the loop saves it on that snapshot when the report
// came after its job started. Progress is cosmetic: any minion can
// imitate another's envelope in Salt's batched form (docs/security.md),
// so a report can only ever change the progress shown, and costs at most
// one write each progressSaveEvery per running job.

// progressSaveEvery spaces the saves of one snapshot's progress (a write
// of its record each); a step's last report is saved at once, once.
const progressSaveEvery = 5 * time.Second

// progressReorder is how long a report with a lower step number than the
// one kept is taken for one that came late (Salt 3006's minion forwards
// events concurrently, so late by milliseconds), rather than for the
// next job's first (the node reports at most once a second).
const progressReorder = time.Second

// progressSteps are the steps that report bytes (internal/engine).
var progressSteps = regexp.MustCompile(`^(copying|zeroing|merging)$`)

var canonicalUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

type progressNote struct {
	step        string
	seq         int
	done, total int64
	at          time.Time
}

// Progress takes a progress event's report of a long step (the
// reconciler passes on those in Salt's single-event envelope; node is
// the minion it names). It never waits on the store.
func (s *Service) Progress(node, uuid, step string, seq int, done, total int64) {
	if node == "" || len(node) > 256 || !canonicalUUID.MatchString(uuid) || !progressSteps.MatchString(step) ||
		total <= 0 || done < 0 || done > total {
		return
	}
	key := node + "/" + uuid
	now := time.Now()
	s.progMu.Lock()
	defer s.progMu.Unlock()
	if s.running[key] == 0 {
		return // no job of ours there: nothing to show it on
	}
	if old, ok := s.prog[key]; ok && old.step == step && seq < old.seq && now.Sub(old.at) < progressReorder {
		return // an earlier report, late
	}
	if s.prog == nil {
		s.prog = map[string]progressNote{}
	}
	s.prog[key] = progressNote{step: step, seq: seq, done: done, total: total, at: now}
}

// noteRunning records, from a pass over every snapshot, the volumes a
// report may be for, and drops the reports of the others.
func (s *Service) noteRunning(rs []*record) {
	running := map[string]int{}
	for _, r := range rs {
		if r.Phase == Pending || r.Restore != nil && r.Restore.Phase == Restoring {
			running[r.Node+"/"+r.VolumeUUID]++
		}
	}
	s.progMu.Lock()
	defer s.progMu.Unlock()
	s.running = running
	for k := range s.prog {
		if running[k] == 0 {
			delete(s.prog, k)
		}
	}
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
	key := r.Node + "/" + r.VolumeUUID
	s.progMu.Lock()
	n, ok := s.prog[key]
	alone := s.running[key] == 1
	s.progMu.Unlock()
	// Two snapshots of one volume asked for at once: the node takes them
	// one after the other, and a report does not say whose copy it is.
	if !ok || !alone || started == nil || n.at.Before(*started) {
		return
	}
	p := saltvolumes.Progress{Step: n.step, Done: n.done, Total: n.total}
	if have != nil && *have == p {
		return
	}
	final := p.Done == p.Total && (have == nil || have.Done != have.Total)
	if !final && time.Since(r.UpdatedAt) < progressSaveEvery {
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
