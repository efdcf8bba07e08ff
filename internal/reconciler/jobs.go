package reconciler

import (
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/keep"
)

// Bounds of the in-memory job log: it is for people looking at a volume,
// not an audit trail (Salt's job cache is that).
const (
	jobsPerVolume = 8
	stepsPerJob   = 32
)

// lateStepGrace is how long after a job's return a step of it may still
// arrive: Salt 3006's minion forwards events concurrently, so the return
// can overtake the last steps.
const lateStepGrace = 10 * time.Second

// jobLog keeps the last jobs of each volume with their step timings.
type jobLog struct {
	mu sync.Mutex
	m  map[string][]*saltvolumes.Job
	// seqs holds, beside each job's steps, their numbers from the minion
	// (0: none), which put steps that arrived out of order back in place.
	seqs map[*saltvolumes.Job][]int
	// changed since the last snapshot (keep saves it).
	changed bool
}

func (l *jobLog) find(name, jid string) *saltvolumes.Job {
	for _, j := range l.m[name] {
		if j.JID == jid {
			return j
		}
	}
	return nil
}

func (l *jobLog) started(name, jid, sls string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string][]*saltvolumes.Job{}
	}
	jobs := append(l.m[name], &saltvolumes.Job{JID: jid, SLS: sls, Started: at, Result: "running", Steps: []saltvolumes.JobStep{}})
	if len(jobs) > jobsPerVolume {
		for _, j := range jobs[:len(jobs)-jobsPerVolume] {
			delete(l.seqs, j)
		}
		jobs = jobs[len(jobs)-jobsPerVolume:]
	}
	l.m[name] = jobs
	l.changed = true
}

// step records a step of the volume's running job jid; once: only if the
// job has no step of that name yet (a long step's many reports).
func (l *jobLog) step(name, jid, step string, seq int, at time.Time, once bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j := l.find(name, jid); j != nil {
		l.insert(j, step, seq, at, once)
	}
}

// late records a step that arrived after its job returned: it goes to the
// volume's newest job if that ended at most lateStepGrace before at.
// Progress events carry no job id, so only a numbered step is taken, and
// only once.
func (l *jobLog) late(name, step string, seq int, at time.Time, once bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	jobs := l.m[name]
	if seq <= 0 || len(jobs) == 0 {
		return
	}
	j := jobs[len(jobs)-1]
	if j.Finished.IsZero() || at.Sub(j.Finished) > lateStepGrace {
		return
	}
	l.insert(j, step, seq, at, once)
}

// insert puts the step in its place by number (a step seen already is not
// added twice, nor, once, one of a name the job has); its time stays the
// time it arrived.
func (l *jobLog) insert(j *saltvolumes.Job, step string, seq int, at time.Time, once bool) {
	if len(j.Steps) >= stepsPerJob {
		return
	}
	if once {
		for _, s := range j.Steps {
			if s.Name == step {
				return
			}
		}
	}
	if l.seqs == nil {
		l.seqs = map[*saltvolumes.Job][]int{}
	}
	seqs := l.seqs[j]
	for len(seqs) < len(j.Steps) { // steps restored from disk carry none
		seqs = append(seqs, 0)
	}
	i := len(j.Steps)
	if seq > 0 {
		for _, n := range seqs {
			if n == seq {
				return
			}
		}
		for i > 0 && seqs[i-1] > seq {
			i--
		}
	}
	j.Steps = append(j.Steps[:i], append([]saltvolumes.JobStep{{Name: step, At: at}}, j.Steps[i:]...)...)
	l.seqs[j] = append(seqs[:i], append([]int{seq}, seqs[i:]...)...)
	l.changed = true
}

func (l *jobLog) ended(name, jid, result, msg string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j := l.find(name, jid); j != nil && j.Finished.IsZero() {
		j.Finished, j.Result, j.Message = at, result, msg
		l.changed = true
	}
}

func (l *jobLog) forget(name string) {
	l.mu.Lock()
	for _, j := range l.m[name] {
		delete(l.seqs, j)
	}
	delete(l.m, name)
	l.changed = true
	l.mu.Unlock()
}

// Jobs returns copies of a volume's last jobs, oldest first. After a
// restart of the control plane it starts empty.
func (r *Reconciler) Jobs(name string) []saltvolumes.Job {
	l := &r.jobLog
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []saltvolumes.Job{}
	for _, j := range l.m[name] {
		c := *j
		c.Steps = append([]saltvolumes.JobStep(nil), j.Steps...)
		out = append(out, c)
	}
	return out
}

// Snapshot is what keep saves of the control plane's memory: the last jobs
// of every volume and the usage history; changed tells whether either moved
// since the last call.
func (r *Reconciler) Snapshot() (keep.Snapshot, bool) {
	l := &r.jobLog
	l.mu.Lock()
	jobs := make(map[string][]saltvolumes.Job, len(l.m))
	for name, js := range l.m {
		for _, j := range js {
			c := *j
			c.Steps = append([]saltvolumes.JobStep(nil), j.Steps...)
			jobs[name] = append(jobs[name], c)
		}
	}
	changed := l.changed
	l.changed = false
	l.mu.Unlock()
	usage, uchanged := r.Nodes.UsageSnapshot(keep.Compact)
	return keep.Snapshot{Usage: usage, Jobs: jobs}, changed || uchanged
}

// Restore puts back what keep saved, at start: a job that was running when
// serve stopped is shown as such, its result learned again from Salt.
func (r *Reconciler) Restore(s keep.Snapshot) {
	l := &r.jobLog
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string][]*saltvolumes.Job{}
	}
	for name, js := range s.Jobs {
		if _, ok := l.m[name]; ok {
			continue
		}
		for i := range js {
			j := js[i]
			l.m[name] = append(l.m[name], &j)
		}
	}
	l.mu.Unlock()
	r.Nodes.RestoreUsage(s.Usage)
	// Only volumes the store still holds: the saved file may carry deleted
	// volumes' history, or what a flood of reports once added.
	known := map[string]bool{}
	for _, v := range r.store.List() {
		known[v.Spec.UUID] = true
	}
	r.Nodes.PruneHistory(func(uuid string) bool { return known[uuid] })
}
