package reconciler

import (
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// What the bus tells: Handle turns events into observations for the volumes
// they name, which their workers apply.

// MaxHintNames is the most volume names one job return of a run not ours
// may name; a return naming more is dropped whole.
const MaxHintNames = 1024

type obsKind int

const (
	obsProgress obsKind = iota
	obsReturn           // a return read from the job cache
	obsHint             // the bus says job jid returned: look it up
	obsLost             // the job cache does not know the job
	obsForget           // a user asked to forget the volume (ForgetRequested)
	obsHealth           // the volume's node reported on its storage
	obsLaunched         // another volume's run on this node prepares this one too
)

// observation is something learnt about a volume, applied by its worker so
// that one volume's changes never interleave.
type observation struct {
	kind    obsKind
	jid     string
	node    string
	how     string // event, lookup, poll
	outcome volume.Outcome
	result  *volume.StateResult // set for returns found by state name
	uuid    string
	step    string
	seq     int // obsProgress: the step's number from its minion (0: none)
	// obsProgress: a long step's bytes done and total (total 0: none).
	done, total int64
	wipe        bool
	sls         string    // obsLaunched: the run's state
	tries       int       // lookups of a hint so far
	looked      time.Time // when the last of them ended
	// obsHealth: the node's entry for the volume (nil: the node has no
	// record of it) and when the report arrived.
	device *saltvolumes.Device
	at     time.Time
}

// Handle takes one bus event. It never blocks on Salt or a volume, and it
// trusts nothing the event says: a job return is only a hint to look the
// job up, and progress counts only from the volume's own node.
func (r *Reconciler) Handle(ev events.Event) {
	switch ev.Kind() {
	case events.KindProgress:
		p, _ := ev.AsProgress()
		if !p.Authenticated {
			r.Metrics.Rejected.Progress.Inc()
			r.warn.Warn("progress event outside Salt's single-event envelope ignored", "tag", ev.Tag)
			return
		}
		r.push(p.Volume, observation{kind: obsProgress, uuid: p.UUID, step: p.Step, node: p.Node, seq: p.Seq, done: p.Done, total: p.Total})
		if r.Snapshots != nil && p.Total > 0 {
			// A snapshot's copy or a restore's, maybe: its own loop
			// matches it to the job by the volume and the node.
			r.Snapshots.Progress(p.Node, p.UUID, p.Step, p.Seq, p.Done, p.Total)
		}
	case events.KindNodeHealth, events.KindNodeRestore:
		r.handleNode(ev)
	case events.KindJobReturn:
		if ev.Data["cmd"] == "_minion_event" {
			// A minion fired an event under a job return's tag: the master
			// writes real returns itself, never in this envelope.
			r.Metrics.Rejected.Unconfirmed.Inc()
			r.warn.Warn("minion event under a job return tag ignored", "tag", ev.Tag, "from", ev.Data["id"])
			return
		}
		jr, _ := ev.AsJobReturn()
		if jr.Fun == FunStatus {
			r.statusReturned(jr.JID)
			return
		}
		if jr.Fun == snapshots.FunApply {
			if r.Snapshots != nil {
				r.Snapshots.Hint(jr.JID)
			}
			return
		}
		if jr.Fun != FunApply && !strings.HasPrefix(jr.Fun, "state.") {
			return
		}
		r.mu.Lock()
		mine, ours := r.jobs[jr.JID]
		mine = append([]string(nil), mine...)
		r.mu.Unlock()
		if ours {
			for _, name := range mine {
				r.push(name, observation{kind: obsHint, jid: jr.JID})
			}
			return
		}
		// Someone else's run (salt-call, orchestrate): the names in the
		// event only say which volumes to look up.
		names := volume.StateNames(jr.Return)
		if len(names) > MaxHintNames || !r.hints.AllowN(time.Now(), len(names)) {
			// Maybe one of ours that returned before its publish was
			// answered: registerJob still finds it here.
			r.remember(jr.JID)
			r.Metrics.Rejected.Flood.Inc()
			r.warn.Warn("job return of a run not ours dropped: more volume names than the hint limits allow", "job", jr.JID, "from", jr.Minion, "names", len(names))
			return
		}
		for _, n := range names {
			r.push(n, observation{kind: obsHint, jid: jr.JID})
		}
		if len(names) == 0 {
			// Maybe ours, returned before local_async answered (a render
			// error names no state): keep the jid for registerJob.
			r.remember(jr.JID)
		}
	}
}

func (r *Reconciler) push(name string, o observation) {
	if name == "" {
		return
	}
	r.mu.Lock()
	if r.term == nil {
		// Not reconciling (a follower): whatever matters is in the store.
		r.mu.Unlock()
		return
	}
	r.inbox[name] = append(r.inbox[name], o)
	r.mu.Unlock()
	r.add(name)
}
