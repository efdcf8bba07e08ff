// Package reconciler drives volume objects through their phases: it starts
// Salt state runs through salt-api (one per node at a time, doing every
// create, or every delete, that queued for that node) and settles each
// volume by its own state when the job returns.
//
// The bus says when, the job cache says what: any accepted minion can put a
// salt/job/<jid>/ret/<any minion> event with any payload on the master bus
// (Salt's batched minion events), so a return seen on the bus only makes the
// reconciler look the job up through salt-api. The job cache is written by
// the master from authenticated minion returns; only the looked-up return
// of the volume's own node settles, adopts, updates or removes a volume.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Salt is what the reconciler needs from salt-api.
type Salt = saltapi.Jobs

// SLS names the reconciler applies.
const (
	SLSPrepared   = "salt_volumes.prepared"
	SLSUnprepared = "salt_volumes.unprepared"
)

// Reasons set on a volume's status.
const (
	ReasonPrepareFailed   = "PrepareFailed"
	ReasonUnprepareFailed = "UnprepareFailed"
	ReasonNodeNotFound    = "NodeNotFound"
	ReasonSaltUnavailable = "SaltUnavailable"
	ReasonSaltRefused     = "SaltRefused"
	ReasonRetrying        = "Retrying"
	ReasonJobTimeout      = "JobTimeout"
	ReasonInvalidReturn   = "InvalidReturn"
	// Kubernetes mode.
	ReasonPublishFailed = "PublishFailed"
	ReasonPVDeleted     = "PersistentVolumeDeleted"
	ReasonKubeError     = "KubernetesUnavailable"
	// Reported by the volume's node (the salt_volumes beacon).
	ReasonDetached    = "Detached"
	ReasonStorageLost = "StorageLost"
	ReasonDamaged     = "Damaged"
)

// Kubernetes is the Kubernetes side of a volume's life: its
// PersistentVolume. Without a kubernetes: section it is nil and volumes
// become Available as soon as their storage is ready.
type Kubernetes interface {
	// Observe copies the volume's PV (phase, claim) into its status from
	// the API server's watch, and says what the volume needs.
	Observe(ctx context.Context, v *volume.Volume) KubeVerdict
	// Publish creates the volume's PV unless it exists (idempotent) and
	// records it in the status.
	Publish(ctx context.Context, v *volume.Volume) error
	// Withdraw deletes the volume's PV; done once no claim holds it any
	// more (or it is gone). blocked says why it may not be deleted now.
	Withdraw(ctx context.Context, v *volume.Volume) (done bool, blocked string, err error)
	// Release drops our finalizer from the PV once the storage is gone.
	Release(ctx context.Context, v *volume.Volume) error
}

// KubeVerdict is what Observe found.
type KubeVerdict struct {
	Changed bool // the PV status in v changed
	// Republish: an Available volume has no PV, and never had a claim: it
	// is (re)created.
	Republish bool
	// Lost: the PV was deleted outside salt-volumes; the volume fails with
	// this message.
	Lost string
	// Reclaim: a provisioned volume whose claim is gone and whose reclaim
	// policy is Delete: delete it.
	Reclaim bool
	// Reprovision: a claim's volume failed on its node for a reason another
	// node may not have (the node's capacity): delete it, after which the
	// claim goes back to the scheduler (Kubernetes.Release). Says why.
	Reprovision string
}

// Options tune the reconciler; zero values take the defaults.
type Options struct {
	Workers int // concurrent reconciles (default 16)
	// JobTimeout bounds how long a volume waits for its job's return before
	// the job cache is asked and, failing that, the volume fails (default 10m).
	JobTimeout time.Duration
	// PollInterval > 0 disables the event source and looks jobs up on a
	// timer instead: the MetalK8s way, kept as the benchmark baseline and a
	// fallback where the bus cannot be reached.
	PollInterval time.Duration
	// RetryDelay is the first delay after a transient failure; it doubles up
	// to a minute (default 2s).
	RetryDelay time.Duration
	// LookupParallel bounds concurrent job lookups after a reconnect (8).
	LookupParallel int
	// Kube publishes PersistentVolumes (Kubernetes mode); nil without.
	Kube Kubernetes
	// ConcurrentRuns sends every volume's state run at once, not one per
	// node at a time: for a Salt that runs them side by side (the replay
	// benchmark's, whose recorded stream returns every job at once). A real
	// minion runs one state run at a time; more only come back busy.
	ConcurrentRuns bool
	// BatchSize is the most volumes one state run prepares, or removes,
	// on a node (default 16; 1: each in its own run). Volumes that queued
	// for a node while a run of ours held it are done together by the
	// next run there.
	BatchSize int
}

// Metrics are the reconciler's counters.
type Metrics struct {
	Reconciles        metrics.Counter
	JobsLaunched      metrics.Counter
	JobsSucceeded     metrics.Counter
	JobsFailed        metrics.Counter
	JobsReconstructed metrics.Counter // settled from the job cache after a reconnect or restart
	JobsRelaunched    metrics.Counter // unknown to Salt after a reconnect or restart, started again
	JobsTimedOut      metrics.Counter
	LaunchErrors      metrics.Counter
	Adopted           metrics.Counter
	Lookups           metrics.Counter
	JobLatency        *metrics.Histogram
	// Rejected counts events that changed nothing because they could not
	// be trusted, by reason.
	Rejected Rejections
}

// Rejections count untrusted events by reason.
type Rejections struct {
	// Unconfirmed: a job return on the bus that the job cache does not
	// hold for the volume's node (forged, or a node that never ran it).
	Unconfirmed metrics.Counter
	// Progress: a progress event outside the single-event envelope, or
	// whose authenticated minion id is not the volume's node.
	Progress metrics.Counter
	// Device: a return whose device info does not describe the volume.
	Device metrics.Counter
	// Health: a node report outside the single-event envelope, or about
	// another minion than its sender.
	Health metrics.Counter
}

// Values lists the counters by reason label.
func (r *Rejections) Values() map[string]int64 {
	return map[string]int64{"unconfirmed": r.Unconfirmed.Value(), "progress": r.Progress.Value(), "device": r.Device.Value(), "health": r.Health.Value()}
}

// Reconciler owns the volume objects in its store.
type Reconciler struct {
	store   *store.Store
	salt    Salt
	source  events.Source
	opt     Options
	log     *slog.Logger
	Hub     *Hub
	Metrics *Metrics
	// Nodes holds what nodes report about themselves.
	Nodes *health.Registry

	q *queue

	mu             sync.Mutex
	inbox          map[string][]observation
	jobs           map[string][]string // our job id -> its volumes
	unmatched      map[string]struct{}
	unmatchedOrder []string
	notBefore      map[string]time.Time
	backoff        map[string]time.Duration
	busyWaiters    map[string][]string // node -> volumes that found it busy, in order
	// running is the state run of ours in flight on each node: a minion
	// runs one at a time, so a second one would only come back busy.
	running     map[string]nodeRun
	jobNode     map[string]string // our job id -> its node, for running
	lookupRetry bool

	cache       *jobCache
	jobLog      jobLog
	nodeConfirm nodeConfirm
	ctx         context.Context // Run's, for work started from Handle
	// warn logs what could repeat without end (forged events, salt-api
	// down) at most once a minute per message.
	warn *rateLog
}

// nodeRun is a state run of ours on a node.
type nodeRun struct {
	jid    string
	volume string
	at     time.Time
}

// New builds a reconciler. source may be nil in polling mode.
func New(st *store.Store, salt Salt, source events.Source, opt Options, log *slog.Logger) *Reconciler {
	if opt.Workers <= 0 {
		opt.Workers = 16
	}
	if opt.JobTimeout <= 0 {
		opt.JobTimeout = 10 * time.Minute
	}
	if opt.RetryDelay <= 0 {
		opt.RetryDelay = 2 * time.Second
	}
	if opt.LookupParallel <= 0 {
		opt.LookupParallel = 8
	}
	if opt.BatchSize <= 0 {
		opt.BatchSize = 16
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{
		store: st, salt: salt, source: source, opt: opt, log: log,
		Hub:     NewHub(),
		Nodes:   health.New(),
		Metrics: &Metrics{JobLatency: metrics.NewHistogram(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)},
		q:       newQueue(),
		inbox:   map[string][]observation{}, jobs: map[string][]string{},
		unmatched: map[string]struct{}{}, notBefore: map[string]time.Time{},
		backoff: map[string]time.Duration{}, running: map[string]nodeRun{}, jobNode: map[string]string{},
		warn: newRateLog(log, time.Minute),
	}
	r.cache = newJobCache(salt, &r.Metrics.Lookups)
	return r
}

type obsKind int

const (
	obsProgress obsKind = iota
	obsReturn           // a return read from the job cache
	obsHint             // the bus says job jid returned: look it up
	obsLost             // the job cache does not know the job
	obsDelete           // a user asked for deletion
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
	wipe    bool
	sls     string // obsLaunched: the run's state
	forget  bool
	tries   int // lookups of a hint so far
	// obsHealth: the node's entry for the volume (nil: the node has no
	// record of it) and when the report arrived.
	device *saltvolumes.Device
	at     time.Time
}

// Run reconciles until ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	var wg sync.WaitGroup
	for range r.opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				name, ok := r.q.get()
				if !ok {
					return
				}
				r.reconcile(ctx, name)
				r.q.done(name)
			}
		}()
	}
	// Every volume gets a first pass: Unknown ones are launched, waiting
	// ones get their timeout timer back.
	for _, v := range r.store.List() {
		r.q.add(v.Spec.Name)
	}
	if r.opt.PollInterval > 0 {
		r.log.Info("polling mode: no event source", "interval", r.opt.PollInterval)
		t := time.NewTicker(r.opt.PollInterval)
		for done := false; !done; {
			select {
			case <-ctx.Done():
				done = true
			case <-t.C:
				r.lookupPending(ctx, "poll")
			}
		}
		t.Stop()
	} else {
		_ = r.source.Run(ctx, func() { go r.lookupPending(ctx, "lookup") }, r.Handle)
	}
	r.q.close()
	wg.Wait()
	return ctx.Err()
}

// Idle reports whether no volume is queued or being reconciled (tests and
// benchmarks use it to know a replay has settled).
func (r *Reconciler) Idle() bool { return r.q.idle() }

// Create stores a new volume (phase Unknown) and queues it.
func (r *Reconciler) Create(s *spec.Spec) (*volume.Volume, error) {
	return r.Provision(s, nil)
}

// Provision is Create for a volume made for a PersistentVolumeClaim.
func (r *Reconciler) Provision(s *spec.Spec, claim *saltvolumes.Claim) (*volume.Volume, error) {
	now := time.Now().UTC()
	v := &volume.Volume{Spec: *s, CreatedAt: now, Claim: claim, Status: volume.Status{Status: saltvolumes.Status{UpdatedAt: now}}}
	if err := r.store.Create(v); err != nil {
		return nil, err
	}
	r.Hub.Publish(Added, v.Clone())
	r.q.add(s.Name)
	return v, nil
}

// Get reads one volume from the store.
func (r *Reconciler) Get(name string) (*volume.Volume, error) { return r.store.Get(name) }

// Touch reconciles a volume again: something it depends on outside Salt
// (its PersistentVolume, its claim) changed.
func (r *Reconciler) Touch(name string) {
	if _, err := r.store.Get(name); err == nil {
		r.q.add(name)
	}
}

// DeleteError is a deletion the criteria forbid.
type DeleteError struct{ Reason string }

func (e *DeleteError) Error() string { return "cannot delete: " + e.Reason }

// Delete asks for a volume's deletion. The criteria are checked now, so the
// caller gets a clear refusal, and again by the worker that carries it out.
func (r *Reconciler) Delete(name string, wipe bool) (*volume.Volume, error) {
	v, err := r.store.Get(name)
	if err != nil {
		return nil, err
	}
	if ok, why := volume.CanDelete(v); !ok {
		return v, &DeleteError{Reason: why}
	}
	// Persisted before the caller hears "accepted": a crash right after
	// still deletes. The observation covers a worker that was saving an
	// older copy of the volume at the same moment.
	v.DeleteRequested, v.Wipe = true, wipe
	if err := r.store.Put(v); err != nil {
		return nil, fmt.Errorf("recording the deletion of %s: %w", name, err)
	}
	r.push(name, observation{kind: obsDelete, wipe: wipe})
	return v, nil
}

// Forget drops a Failed volume from the store without running anything on
// its node: the way out for a volume whose node is gone for good, where the
// unprepare state can never run. Whatever is on the node stays; a later
// salt_volumes run there reports it and it is adopted again.
func (r *Reconciler) Forget(name string) (*volume.Volume, error) {
	v, err := r.store.Get(name)
	if err != nil {
		return nil, err
	}
	if v.Status.Phase != volume.Failed {
		return v, &DeleteError{Reason: "only a Failed volume can be forgotten (it is " + v.Status.Phase.String() + "); delete it normally"}
	}
	r.push(name, observation{kind: obsDelete, forget: true})
	return v, nil
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
		r.push(p.Volume, observation{kind: obsProgress, uuid: p.UUID, step: p.Step, node: p.Node})
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
		if !strings.HasPrefix(jr.Fun, "state.") {
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
	r.inbox[name] = append(r.inbox[name], o)
	r.mu.Unlock()
	r.q.add(name)
}

func (r *Reconciler) remember(jid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unmatched[jid] = struct{}{}
	r.unmatchedOrder = append(r.unmatchedOrder, jid)
	if len(r.unmatchedOrder) > 1024 {
		delete(r.unmatched, r.unmatchedOrder[0])
		r.unmatchedOrder = r.unmatchedOrder[1:]
	}
}

// registerJob indexes a run of ours on node; names[0] is the volume whose
// worker started it.
func (r *Reconciler) registerJob(jid string, names []string, node string) {
	r.mu.Lock()
	r.jobs[jid] = names
	r.running[node] = nodeRun{jid: jid, volume: names[0], at: time.Now()}
	r.jobNode[jid] = node
	_, early := r.unmatched[jid]
	delete(r.unmatched, jid)
	r.mu.Unlock()
	if early {
		for _, name := range names {
			r.push(name, observation{kind: obsHint, jid: jid})
		}
	}
}

// joinJob indexes name under jid (after a restart the index starts empty).
func (r *Reconciler) joinJob(jid, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	addName(r.jobs, jid, name)
}

// addName appends name to m[key] unless it is there; removeName takes it
// out, dropping an emptied key. The job index and the node queues are
// both such lists.
func addName(m map[string][]string, key, name string) {
	if !slices.Contains(m[key], name) {
		m[key] = append(m[key], name)
	}
}

func removeName(m map[string][]string, key, name string) {
	names := m[key]
	if i := slices.Index(names, name); i >= 0 {
		names = slices.Delete(slices.Clone(names), i, i+1)
	}
	if len(names) == 0 {
		delete(m, key)
		return
	}
	m[key] = names
}

// leaveJob drops name from jid's volumes: it waits for that run no more.
func (r *Reconciler) leaveJob(jid, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	removeName(r.jobs, jid, name)
}

// forgetJob is called when jid is over for name (it returned, timed out,
// or Salt does not know it): the run no longer holds its node. ended says
// this call freed the node (the first volume of a run to settle frees it).
func (r *Reconciler) forgetJob(jid, name string) (ended bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	removeName(r.jobs, jid, name)
	if node, ok := r.jobNode[jid]; ok {
		if r.running[node].jid == jid {
			delete(r.running, node)
			ended = true
		}
		if len(r.jobs[jid]) == 0 {
			delete(r.jobNode, jid)
		}
	}
	return ended
}

// claimNode reserves node for the volume's next run, or returns the run of
// another volume of ours in flight there. A run older than the job timeout
// no longer counts: its volume may be gone, and a lost return must not
// hold a node for good.
func (r *Reconciler) claimNode(node, name string) (nodeRun, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	run, ok := r.running[node]
	if ok && run.volume != name && time.Since(run.at) < r.opt.JobTimeout && !r.opt.ConcurrentRuns {
		return run, true
	}
	r.running[node] = nodeRun{volume: name, at: time.Now()}
	return nodeRun{}, false
}

// unclaimNode drops a claim whose run could not be started.
func (r *Reconciler) unclaimNode(node, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if run := r.running[node]; run.volume == name && run.jid == "" {
		delete(r.running, node)
	}
}

type effect int

const (
	unchanged effect = iota
	changed
	removed
)

func (r *Reconciler) reconcile(ctx context.Context, name string) {
	r.Metrics.Reconciles.Inc()
	r.mu.Lock()
	obs := r.inbox[name]
	delete(r.inbox, name)
	r.mu.Unlock()

	v, err := r.store.Get(name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		r.log.Error("reading volume", "volume", name, "error", err)
		return
	}
	obs = r.confirm(ctx, name, v, obs)
	if v == nil {
		r.adopt(name, obs)
		return
	}
	dirty := false
	for _, o := range obs {
		switch r.apply(v, o) {
		case changed:
			dirty = true
		case removed:
			r.remove(ctx, v)
			return
		}
	}
	if r.opt.Kube != nil && r.observeKube(ctx, v) {
		dirty = true
	}
	if r.act(ctx, v) {
		dirty = true
	}
	if dirty {
		v.Status.UpdatedAt = time.Now().UTC()
		if err := r.store.Put(v); err != nil {
			r.log.Error("saving volume", "volume", name, "error", err)
			r.q.addAfter(name, r.opt.RetryDelay)
			return
		}
		r.Hub.Publish(Modified, v)
	}
}

func (r *Reconciler) remove(ctx context.Context, v *volume.Volume) {
	name := v.Spec.Name
	if r.opt.Kube != nil {
		// The storage is gone: the PV may go too. If this fails the
		// Kubernetes side drops the finalizer of a PV whose volume is gone.
		if err := r.opt.Kube.Release(ctx, v); err != nil {
			r.warn.Warn("could not release the PersistentVolume", "volume", name, "error", err)
		}
	}
	if err := r.store.Delete(name); err != nil {
		r.log.Error("removing volume", "volume", name, "error", err)
		r.q.addAfter(name, r.opt.RetryDelay)
		return
	}
	r.mu.Lock()
	delete(r.notBefore, name)
	delete(r.backoff, name)
	r.mu.Unlock()
	r.Nodes.Forget(v.Spec.UUID)
	r.jobLog.forget(name)
	r.log.Info("volume deleted", "volume", name, "node", v.Spec.Node)
	r.Hub.Publish(Deleted, v)
}

// adopt creates the object for a volume someone else's state run prepared.
func (r *Reconciler) adopt(name string, obs []observation) {
	for _, o := range obs {
		if o.kind != obsReturn || o.result == nil || o.result.Function != "prepared" || !o.result.OK || o.result.Device == nil {
			continue
		}
		s, err := volume.AdoptedSpec(o.node, *o.result)
		if err == nil {
			if err = o.result.Device.Check(s); err != nil {
				r.Metrics.Rejected.Device.Inc()
			}
		}
		if err != nil {
			r.log.Warn("not adopting volume", "volume", name, "job", o.jid, "node", o.node, "error", err)
			continue
		}
		now := time.Now().UTC()
		v := &volume.Volume{Spec: *s, CreatedAt: now, Origin: "salt",
			Status: volume.Status{Status: saltvolumes.Status{Phase: volume.Available, JobID: o.jid, UpdatedAt: now}}}
		v.Status.ApplyDevice(o.result.Device)
		if r.opt.Kube != nil {
			v.Status.Phase, v.Status.Publishing, v.Status.Step = volume.Pending, true, stepPublish
		}
		if err := r.store.Create(v); err != nil {
			r.log.Warn("not adopting volume", "volume", name, "error", err)
			r.q.add(name)
			return
		}
		r.Metrics.Adopted.Inc()
		r.log.Info("volume prepared outside the control plane adopted", "volume", name, "node", o.node, "job", o.jid)
		r.Hub.Publish(Added, v)
		if v.Status.Publishing {
			r.q.add(name)
		}
		return
	}
}

func waiting(v *volume.Volume) bool {
	return v.Status.Phase == volume.Pending || v.Status.Phase == volume.Terminating
}

func (r *Reconciler) apply(v *volume.Volume, o observation) effect {
	st := &v.Status
	switch o.kind {
	case obsProgress:
		if o.node != v.Spec.Node {
			r.Metrics.Rejected.Progress.Inc()
			r.warn.Warn("progress event from another minion ignored", "volume", v.Spec.Name, "node", v.Spec.Node, "from", o.node)
			return unchanged
		}
		if o.uuid != v.Spec.UUID || !waiting(v) || o.step == "" || o.step == st.Step {
			return unchanged
		}
		st.Step = o.step
		r.jobLog.step(v.Spec.Name, st.JobID, o.step, time.Now().UTC())
		return changed
	case obsDelete:
		if o.forget {
			if st.Phase != volume.Failed {
				r.log.Info("forget dropped", "volume", v.Spec.Name, "phase", st.Phase)
				return unchanged
			}
			r.forgetJob(st.JobID, v.Spec.Name)
			r.log.Warn("volume forgotten without touching its node", "volume", v.Spec.Name, "node", v.Spec.Node, "reason", st.Reason)
			return removed
		}
		if v.DeleteRequested && v.Wipe == o.wipe {
			return unchanged // recorded by Delete already
		}
		if ok, why := volume.CanDelete(v); !ok || v.DeleteRequested {
			r.log.Info("deletion dropped", "volume", v.Spec.Name, "reason", why)
			return unchanged
		}
		v.DeleteRequested, v.Wipe = true, o.wipe
		return changed
	case obsLost:
		if o.jid != st.JobID || !waiting(v) {
			return unchanged
		}
		r.forgetJob(o.jid, v.Spec.Name)
		r.Metrics.JobsRelaunched.Inc()
		r.log.Warn("job unknown to Salt; launching it again", "volume", v.Spec.Name, "job", o.jid)
		st.JobID, st.Message = "", "job "+o.jid+" was unknown to Salt; launched again"
		return changed
	case obsHealth:
		return r.applyHealth(v, o)
	case obsLaunched:
		return r.joined(v, o)
	case obsReturn:
		if o.jid == st.JobID && o.node == v.Spec.Node && waiting(v) {
			if o.how == "lookup" {
				r.Metrics.JobsReconstructed.Inc()
			}
			return r.settle(v, o.outcome)
		}
		return r.foreign(v, o)
	}
	return unchanged
}

// settle applies the return of the job the volume was waiting for.
func (r *Reconciler) settle(v *volume.Volume, out volume.Outcome) effect {
	st := &v.Status
	name := v.Spec.Name
	ended := r.forgetJob(st.JobID, name)
	if !st.JobStartedAt.IsZero() {
		r.Metrics.JobLatency.Observe(time.Since(st.JobStartedAt).Seconds())
	}
	result := "succeeded"
	switch {
	case out.Retryable:
		result = "retried"
	case !out.OK:
		result = "failed"
	}
	r.jobLog.ended(name, st.JobID, result, out.Message, time.Now().UTC())
	if out.Retryable {
		// The run did not happen: another state run held the minion.
		st.JobID, st.Reason, st.Message = "", ReasonRetrying, out.Message
		r.delay(name)
		r.waitForNode(v.Spec.Node, name)
		return changed
	}
	// A run of ours ended on this node: the minion is free for the next
	// volume that found it busy, now rather than at its backoff. (The
	// other volumes of the same run find it freed already.)
	if ended {
		r.nodeFree(v.Spec.Node)
	}
	st.Step = ""
	if st.Phase == volume.Terminating {
		if out.OK {
			r.Metrics.JobsSucceeded.Inc()
			return removed
		}
		r.Metrics.JobsFailed.Inc()
		st.Phase, st.Reason, st.Message = volume.Failed, ReasonUnprepareFailed, out.Message
		v.DeleteRequested, v.Wipe = false, false
		return changed
	}
	if out.OK {
		if err := out.Device.Check(&v.Spec); err != nil {
			r.Metrics.Rejected.Device.Inc()
			r.Metrics.JobsFailed.Inc()
			st.Phase, st.Reason = volume.Failed, ReasonInvalidReturn
			st.Message = fmt.Sprintf("%s returned device info that does not describe this volume: %v", v.Spec.Node, err)
			return changed
		}
		r.Metrics.JobsSucceeded.Inc()
		st.Phase, st.Reason, st.Message = volume.Available, "", ""
		st.ApplyDevice(out.Device)
		if r.opt.Kube != nil {
			// Available means the storage is ready and its PV exists.
			st.Phase, st.Publishing, st.Step = volume.Pending, true, stepPublish
		}
		r.mu.Lock()
		delete(r.backoff, name)
		r.mu.Unlock()
		return changed
	}
	r.Metrics.JobsFailed.Inc()
	st.Phase, st.Reason, st.Message = volume.Failed, ReasonPrepareFailed, out.Message
	return changed
}

// foreign applies the return of a state run the volume was not waiting
// for: someone's salt-call or orchestrate run, or an old job of ours.
func (r *Reconciler) foreign(v *volume.Volume, o observation) effect {
	res := o.result
	if res == nil || waiting(v) || o.node != v.Spec.Node || !res.OK {
		return unchanged
	}
	if res.Device != nil && res.Device.UUID != v.Spec.UUID {
		r.log.Warn("state return names this volume with another uuid; ignored", "volume", v.Spec.Name, "job", o.jid, "uuid", res.Device.UUID)
		return unchanged
	}
	switch res.Function {
	case "prepared":
		if res.Device == nil || v.DeleteRequested {
			return unchanged
		}
		if err := res.Device.Check(&v.Spec); err != nil {
			r.Metrics.Rejected.Device.Inc()
			r.warn.Warn("state return with device info that does not describe the volume ignored", "volume", v.Spec.Name, "job", o.jid, "error", err)
			return unchanged
		}
		before := v.Status
		v.Status.Phase, v.Status.Reason, v.Status.Message = volume.Available, "", ""
		v.Status.ApplyDevice(res.Device)
		if before == v.Status {
			return unchanged
		}
		r.log.Info("volume status updated from a state run outside the control plane", "volume", v.Spec.Name, "job", o.jid)
		return changed
	case "unprepared":
		r.log.Info("volume unprepared outside the control plane; removing it", "volume", v.Spec.Name, "job", o.jid)
		return removed
	}
	return unchanged
}

// act starts whatever job the volume needs; it reports whether v changed.
func (r *Reconciler) act(ctx context.Context, v *volume.Volume) bool {
	st := &v.Status
	switch {
	case needsRemovalRun(v):
		if r.opt.Kube != nil {
			if done, changed := r.withdraw(ctx, v); !done {
				return changed
			}
		}
		return r.launch(ctx, v, SLSUnprepared, volume.Terminating)
	case !v.DeleteRequested && st.Phase == volume.Pending && st.Publishing && r.opt.Kube != nil:
		return r.publish(ctx, v)
	case needsPrepareRun(v):
		return r.launch(ctx, v, SLSPrepared, volume.Pending)
	case waiting(v) && st.JobID != "":
		return r.checkTimeout(ctx, v)
	}
	return false
}

// waitForNode queues a volume whose run found its minion busy.
func (r *Reconciler) waitForNode(node, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busyWaiters == nil {
		r.busyWaiters = map[string][]string{}
	}
	addName(r.busyWaiters, node, name)
}

// dropWaiter takes name out of node's queue: its run started (its own, or
// another volume's that does it too).
func (r *Reconciler) dropWaiter(node, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	removeName(r.busyWaiters, node, name)
}

// nodeFree launches the first volume waiting for node at once (one: the
// minion runs one state run at a time; the others keep their turn, and
// their backoff timers stay as the fallback).
func (r *Reconciler) nodeFree(node string) {
	for {
		r.mu.Lock()
		w := r.busyWaiters[node]
		if len(w) == 0 {
			r.mu.Unlock()
			return
		}
		name := w[0]
		if len(w) == 1 {
			delete(r.busyWaiters, node)
		} else {
			r.busyWaiters[node] = w[1:]
		}
		delete(r.notBefore, name)
		delete(r.backoff, name)
		r.mu.Unlock()
		if v, err := r.store.Get(name); err == nil && needsRun(v) {
			r.q.add(name)
			return
		}
		// Gone, or started by a run that prepared it with another volume,
		// meanwhile: the turn goes to the next one.
	}
}

func (r *Reconciler) delay(name string) {
	r.mu.Lock()
	d := r.backoff[name]
	if d == 0 {
		d = r.opt.RetryDelay
	}
	r.backoff[name] = min(2*d, time.Minute)
	r.notBefore[name] = time.Now().Add(d)
	r.mu.Unlock()
	r.q.addAfter(name, d)
}

func (r *Reconciler) launch(ctx context.Context, v *volume.Volume, sls string, phase volume.Phase) bool {
	name := v.Spec.Name
	r.mu.Lock()
	wait := time.Until(r.notBefore[name])
	r.mu.Unlock()
	st := &v.Status
	// Until it launches, the volume waits for no job: a JobID left from
	// its last run (the prepare of a volume now being deleted) would be
	// taken for this run's and its return applied as this run's result.
	if wait > 0 {
		r.q.addAfter(name, wait)
		if st.Phase != phase || st.JobID != "" {
			r.leaveJob(st.JobID, name)
			st.Phase, st.JobID = phase, ""
			return true
		}
		return false
	}
	if run, busy := r.claimNode(v.Spec.Node, name); busy {
		// Our own run holds the minion: wait for its return (nodeFree
		// launches the first waiter). The timer is only a fallback: it
		// starts no Salt job while that run lasts.
		r.waitForNode(v.Spec.Node, name)
		r.q.addAfter(name, r.opt.RetryDelay)
		step := fmt.Sprintf("queued: %s is running a state run for volume %s", v.Spec.Node, run.volume)
		if st.Phase != phase || st.Step != step || st.JobID != "" {
			r.leaveJob(st.JobID, name)
			st.Phase, st.Step, st.JobID = phase, step, ""
			return true
		}
		return false
	}
	r.leaveJob(st.JobID, name)
	r.dropWaiter(v.Spec.Node, name)
	pillar := map[string]any{"volume": v.Spec}
	if sls == SLSUnprepared && v.Wipe {
		pillar["wipe"] = true
	}
	// Volumes that queued for this node while it was busy, for the same
	// kind of run, are done by this run too: one state run (one Salt job,
	// one return) for all.
	batch := r.takeBatch(v.Spec.Node, name, sls, v.Wipe)
	if len(batch) > 0 {
		all := map[string]any{name: v.Spec}
		for _, b := range batch {
			all[b.Spec.Name] = b.Spec
		}
		pillar["volumes"] = all
		delete(pillar, "volume")
	}
	job, err := r.salt.LocalAsync(ctx, v.Spec.Node, "state.apply", []any{sls}, map[string]any{"pillar": map[string]any{"salt_volumes": pillar}})
	st.Step = ""
	if err != nil {
		for _, b := range batch {
			r.waitForNode(v.Spec.Node, b.Spec.Name)
		}
		r.unclaimNode(v.Spec.Node, name)
		r.Metrics.LaunchErrors.Inc()
		var apiErr *saltapi.Error
		permanent := errors.Is(err, saltapi.ErrNoMinions) || (errors.As(err, &apiErr) && apiErr.Status == http.StatusBadRequest)
		r.warn.Warn("could not start the state run", "volume", name, "sls", sls, "error", err, "permanent", permanent)
		if !permanent {
			st.Phase, st.JobID = phase, ""
			st.Reason, st.Message = ReasonSaltUnavailable, fmt.Sprintf("could not start %s on %s, retrying: %v", sls, v.Spec.Node, err)
			r.delay(name)
			return true
		}
		st.Phase, st.JobID = volume.Failed, ""
		st.Reason, st.Message = ReasonSaltRefused, fmt.Sprintf("salt-api refused %s on %s: %v", sls, v.Spec.Node, err)
		if errors.Is(err, saltapi.ErrNoMinions) {
			st.Reason = ReasonNodeNotFound
			st.Message = fmt.Sprintf("no Salt minion matches node %q: check the node name against salt-key -L", v.Spec.Node)
		}
		v.DeleteRequested, v.Wipe = false, false
		return true
	}
	r.Metrics.JobsLaunched.Inc()
	names := []string{name}
	for _, b := range batch {
		names = append(names, b.Spec.Name)
	}
	r.log.Info("state run started", "volume", name, "node", v.Spec.Node, "sls", sls, "job", job.JID, "volumes", len(names))
	st.Phase, st.JobID, st.JobStartedAt = phase, job.JID, time.Now().UTC()
	st.Reason, st.Message = "", ""
	r.jobLog.started(name, job.JID, sls, st.JobStartedAt)
	// Each other volume takes the job id through its own worker (one
	// worker changes a volume); told before the job is indexed, so that a
	// return already seen reaches them after.
	for _, n := range names[1:] {
		r.push(n, observation{kind: obsLaunched, jid: job.JID, node: v.Spec.Node, at: st.JobStartedAt, sls: sls, wipe: v.Wipe})
	}
	r.registerJob(job.JID, names, v.Spec.Node)
	r.q.addAfter(name, r.opt.JobTimeout)
	return true
}

// needsPrepareRun tells whether v waits for a state run to prepare it.
func needsPrepareRun(v *volume.Volume) bool {
	st := &v.Status
	return !v.DeleteRequested && (st.Phase == volume.Unknown || (st.Phase == volume.Pending && st.JobID == "" && !st.Publishing))
}

// needsRemovalRun tells whether v waits for a state run to remove it.
func needsRemovalRun(v *volume.Volume) bool {
	return v.DeleteRequested && (v.Status.Phase != volume.Terminating || v.Status.JobID == "")
}

// needsRun tells whether v waits for a state run of either kind.
func needsRun(v *volume.Volume) bool { return needsPrepareRun(v) || needsRemovalRun(v) }

// queuedForRemoval tells whether v waits for its node to run its removal:
// Terminating without a job, which its worker sets only past the
// withdrawal of its PersistentVolume (Kubernetes mode), so another
// volume's run may remove it.
func queuedForRemoval(v *volume.Volume, wipe bool) bool {
	return v.DeleteRequested && v.Wipe == wipe && v.Status.Phase == volume.Terminating && v.Status.JobID == ""
}

// wantsRun tells whether v wants a run of sls (with wipe, for removals).
func wantsRun(v *volume.Volume, sls string, wipe bool) bool {
	if sls == SLSUnprepared {
		return queuedForRemoval(v, wipe)
	}
	return needsPrepareRun(v)
}

// takeBatch takes from node's queue the volumes the run of sls being
// started by first can do too, up to BatchSize in all. The store's
// snapshot decides what the run does on the node, so only volumes it shows
// wanting that run are taken; one whose worker has not stored its wait
// yet stays queued for the next run. What they want cannot change
// meanwhile (a volume being prepared or removed cannot be deleted, nor its
// wipe changed); each volume's worker takes the job id when told (joined).
func (r *Reconciler) takeBatch(node, first, sls string, wipe bool) []*volume.Volume {
	if r.opt.ConcurrentRuns || r.opt.BatchSize <= 1 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var batch []*volume.Volume
	var keep []string
	for _, n := range r.busyWaiters[node] {
		if n == first || len(batch) >= r.opt.BatchSize-1 {
			keep = append(keep, n)
			continue
		}
		b, err := r.store.Get(n)
		if err != nil || b.Spec.Node != node || !wantsRun(b, sls, wipe) {
			keep = append(keep, n)
			continue
		}
		batch = append(batch, b)
		delete(r.notBefore, n)
		delete(r.backoff, n)
	}
	if len(keep) == 0 {
		delete(r.busyWaiters, node)
	} else {
		r.busyWaiters[node] = keep
	}
	return batch
}

// joined applies the start of a run of another volume that does this one
// too.
func (r *Reconciler) joined(v *volume.Volume, o observation) effect {
	st := &v.Status
	name := v.Spec.Name
	if o.node != v.Spec.Node || !wantsRun(v, o.sls, o.wipe) {
		// Changed meanwhile: the run does it anyway; what the volume now
		// wants waits for the node as usual.
		r.leaveJob(o.jid, name)
		return unchanged
	}
	r.dropWaiter(v.Spec.Node, name)
	r.mu.Lock()
	delete(r.notBefore, name)
	delete(r.backoff, name)
	r.mu.Unlock()
	st.Phase = volume.Pending
	if o.sls == SLSUnprepared {
		st.Phase = volume.Terminating
	}
	st.JobID, st.JobStartedAt = o.jid, o.at
	st.Step, st.Reason, st.Message = "", "", ""
	r.jobLog.started(name, o.jid, o.sls, o.at)
	r.q.addAfter(name, r.opt.JobTimeout)
	return changed
}

// checkTimeout re-arms the job timer, or, past the timeout, asks the job
// cache once and fails the volume if the node never answered.
func (r *Reconciler) checkTimeout(ctx context.Context, v *volume.Volume) bool {
	st := &v.Status
	r.joinJob(st.JobID, v.Spec.Name)
	left := r.opt.JobTimeout - time.Since(st.JobStartedAt)
	if left > 0 {
		r.q.addAfter(v.Spec.Name, left)
		return false
	}
	o, ok, err := r.lookup(ctx, v, "lookup")
	if err != nil {
		r.log.Warn("job lookup failed", "volume", v.Spec.Name, "job", st.JobID, "error", err)
		r.q.addAfter(v.Spec.Name, r.opt.RetryDelay)
		return false
	}
	if ok {
		return r.apply(v, o) != unchanged
	}
	r.Metrics.JobsTimedOut.Inc()
	if r.forgetJob(st.JobID, v.Spec.Name) {
		r.nodeFree(v.Spec.Node)
	}
	r.jobLog.ended(v.Spec.Name, st.JobID, "timed out", "", time.Now().UTC())
	st.Reason = ReasonJobTimeout
	st.Message = fmt.Sprintf("no return from %s for job %s within %s: is the minion up? (salt-run jobs.lookup_jid %s)", v.Spec.Node, st.JobID, r.opt.JobTimeout, st.JobID)
	if st.Phase == volume.Terminating {
		v.DeleteRequested, v.Wipe = false, false
	}
	st.Phase, st.Step = volume.Failed, ""
	return true
}

// lookup asks the job cache about the volume's job: a return (or the job
// being unknown) becomes an observation; ok is false while it still runs.
func (r *Reconciler) lookup(ctx context.Context, v *volume.Volume, how string) (observation, bool, error) {
	r.Metrics.Lookups.Inc()
	jid := v.Status.JobID
	info, err := r.salt.ListJob(ctx, jid)
	if err != nil {
		return observation{}, false, err
	}
	if ret, ok := info.Returns[v.Spec.Node]; ok {
		return returnObservation(jid, v.Spec.Node, v.Spec.Name, how, ret), true, nil
	}
	if !info.Known {
		return observation{kind: obsLost, jid: jid}, true, nil
	}
	return observation{}, false, nil
}

// lookupPending asks the job cache once about every job a volume waits for:
// returns fired while no one listened are found there.
func (r *Reconciler) lookupPending(ctx context.Context, how string) {
	sem := make(chan struct{}, r.opt.LookupParallel)
	var wg sync.WaitGroup
	var failed sync.Once
	for _, v := range r.store.List() {
		if !waiting(v) || v.Status.JobID == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			o, ok, err := r.lookup(ctx, v, how)
			if err != nil {
				failed.Do(func() { r.log.Warn("job lookup failed; trying again shortly", "error", err) })
				r.mu.Lock()
				r.lookupRetry = true
				r.mu.Unlock()
				return
			}
			if ok {
				r.push(v.Spec.Name, o)
			}
		}()
	}
	wg.Wait()
	r.mu.Lock()
	again := r.lookupRetry
	r.lookupRetry = false
	r.mu.Unlock()
	if again && how == "lookup" && ctx.Err() == nil {
		time.AfterFunc(5*time.Second, func() { r.lookupPending(ctx, how) })
	}
}
