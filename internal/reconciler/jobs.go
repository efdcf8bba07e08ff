package reconciler

import (
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// Bounds of the in-memory job log: it is for people looking at a volume,
// not an audit trail (Salt's job cache is that).
const (
	jobsPerVolume = 8
	stepsPerJob   = 32
)

// jobLog keeps the last jobs of each volume with their step timings.
type jobLog struct {
	mu sync.Mutex
	m  map[string][]*saltvolumes.Job
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
		jobs = jobs[len(jobs)-jobsPerVolume:]
	}
	l.m[name] = jobs
}

func (l *jobLog) step(name, jid, step string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j := l.find(name, jid); j != nil && len(j.Steps) < stepsPerJob {
		j.Steps = append(j.Steps, saltvolumes.JobStep{Name: step, At: at})
	}
}

func (l *jobLog) ended(name, jid, result, msg string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j := l.find(name, jid); j != nil && j.Finished.IsZero() {
		j.Finished, j.Result, j.Message = at, result, msg
	}
}

func (l *jobLog) forget(name string) {
	l.mu.Lock()
	delete(l.m, name)
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
