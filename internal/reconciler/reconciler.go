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
	"reflect"
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
	"golang.org/x/time/rate"
)

// Salt is what the reconciler needs from salt-api.
type Salt = saltapi.Jobs

// SLS names the reconciler applies.
const (
	SLSPrepared   = "salt_volumes.prepared"
	SLSUnprepared = "salt_volumes.unprepared"
)

// FunApply runs one of those formulas on a node with fixed arguments
// (action, volume specs, wipe): the function the control plane's Salt
// account may call instead of state.apply, whose keyword arguments
// (localconfig, saltenv) no ACL can fully constrain.
const FunApply = "salt_volumes.apply_volume"

// Reasons set on a volume's status.
const (
	ReasonPrepareFailed   = "PrepareFailed"
	ReasonUnprepareFailed = "UnprepareFailed"
	// ReasonWipeUnverified: a --wipe could not zero the device or read
	// zeros back; the node keeps the volume's record, so the device is not
	// offered again.
	ReasonWipeUnverified = saltvolumes.ReasonWipeUnverified
	// ReasonResizing: a grow was asked for; the prepare state runs with
	// the new size.
	ReasonResizing = "Resizing"
	// ReasonResizeFailed: the growth's state run failed; asking again (the
	// same size, or any size from the one it had) runs it again.
	ReasonResizeFailed    = "ResizeFailed"
	ReasonNodeNotFound    = "NodeNotFound"
	ReasonSaltUnavailable = "SaltUnavailable"
	ReasonSaltRefused     = "SaltRefused"
	ReasonRetrying        = "Retrying"
	ReasonJobTimeout      = "JobTimeout"
	ReasonInvalidReturn   = "InvalidReturn"
	// A Volume object whose spec the API server took but the volume
	// contract refuses (its schema checks less than the contract does).
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonLimit: a Volume object beyond limits.volumes; nothing ran.
	ReasonLimit = "LimitReached"
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
	// HintNamesPerSecond bounds the volume names taken from job returns of
	// runs that are not ours (salt-call, orchestrate, or a minion forging
	// returns of jids of its choosing), each of which costs a job lookup
	// and a reconcile; bursts of four seconds' worth pass (default 500).
	// Returns of our own runs are never limited.
	HintNamesPerSecond float64
	// MaxVolumes bounds the volumes the store holds, however they enter it:
	// created through the API or CLI, provisioned for a claim, adopted from
	// someone else's state run, or written as Volume objects (0: none).
	MaxVolumes int
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
	// OverLimit counts volumes refused because the store held MaxVolumes,
	// by the way they came.
	OverLimit  LimitRefusals
	Lookups    metrics.Counter
	JobLatency *metrics.Histogram
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
	// Flood: a job return of someone else's run naming more volumes than
	// MaxHintNames, or past HintNamesPerSecond.
	Flood metrics.Counter
}

// LimitRefusals count volumes refused over limits.volumes, by the way
// they came: the API or CLI, a claim, a state run to adopt, a Volume object.
type LimitRefusals struct {
	API, Claim, Adoption, Object metrics.Counter
}

// Inc counts one refusal of the named way.
func (l *LimitRefusals) Inc(via string) {
	switch via {
	case "api":
		l.API.Inc()
	case "claim":
		l.Claim.Inc()
	case "adoption":
		l.Adoption.Inc()
	default:
		l.Object.Inc()
	}
}

// Values lists the counters by their via label.
func (l *LimitRefusals) Values() map[string]int64 {
	return map[string]int64{"api": l.API.Value(), "claim": l.Claim.Value(), "adoption": l.Adoption.Value(), "object": l.Object.Value()}
}

// Values lists the counters by reason label.
func (r *Rejections) Values() map[string]int64 {
	return map[string]int64{"unconfirmed": r.Unconfirmed.Value(), "progress": r.Progress.Value(), "device": r.Device.Value(), "health": r.Health.Value(), "flood": r.Flood.Value()}
}

// Reconciler owns the volume objects in its store.
type Reconciler struct {
	store store.Store
	// w is what workers write through during a term (Lead): the store
	// itself, or a writer fenced on this replica's leadership.
	w       store.Writer
	running bool // a term is under way
	salt    Salt
	// unknownAt is when a node unknown to the control plane was last
	// asked to confirm itself (confirmUnknownNode).
	unknownMu sync.Mutex
	unknownAt time.Time
	source    events.Source
	opt       Options
	log       *slog.Logger
	Hub       *Hub
	Metrics   *Metrics
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
	// nodeRuns is the state run of ours in flight on each node: a minion
	// runs one at a time, so a second one would only come back busy.
	nodeRuns    map[string]nodeRun
	jobNode     map[string]string // our job id -> its node, for running
	lookupRetry bool

	cache       *jobCache
	jobLog      jobLog
	nodeConfirm nodeConfirm
	modSync     moduleSync
	ctx         context.Context // Run's, for work started from Handle
	// warn logs what could repeat without end (forged events, salt-api
	// down) at most once a minute per message.
	warn *rateLog
	// hints meters the volume names taken from runs not ours.
	hints *rate.Limiter
}

// New builds a reconciler. source may be nil in polling mode.
func New(st store.Store, salt Salt, source events.Source, opt Options, log *slog.Logger) *Reconciler {
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
	if opt.HintNamesPerSecond <= 0 {
		opt.HintNamesPerSecond = 500
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
		backoff: map[string]time.Duration{}, nodeRuns: map[string]nodeRun{}, jobNode: map[string]string{},
		warn:  newRateLog(log, time.Minute),
		hints: rate.NewLimiter(rate.Limit(opt.HintNamesPerSecond), int(4*opt.HintNamesPerSecond)),
	}
	r.cache = newJobCache(salt, &r.Metrics.Lookups)
	r.Nodes.Known = r.knownOn
	// Closed until a term starts: a replica that does not reconcile queues
	// nothing (its first pass lists the store anyway).
	r.q.close()
	// Every replica's watchers see the store's changes, whoever made them.
	st.Watch(r.noticed)
	return r
}

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
	wipe    bool
	sls     string // obsLaunched: the run's state
	tries   int    // lookups of a hint so far
	// obsHealth: the node's entry for the volume (nil: the node has no
	// record of it) and when the report arrived.
	device *saltvolumes.Device
	at     time.Time
}

// Idle reports whether no volume is queued or being reconciled (tests and
// benchmarks use it to know a replay has settled).
func (r *Reconciler) Idle() bool { return r.q.idle() }

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
	if !r.running {
		// Not reconciling (a follower): whatever matters is in the store.
		r.mu.Unlock()
		return
	}
	r.inbox[name] = append(r.inbox[name], o)
	r.mu.Unlock()
	r.q.add(name)
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
	if v.ForgetRequested {
		obs = append(obs, observation{kind: obsForget})
	}
	base := v.Clone()
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
	if v.DeleteRequested && (v.Status.Reason == ReasonInvalidSpec || v.Status.Reason == ReasonLimit) && v.Status.JobID == "" {
		// Nothing ever ran for it: nothing to remove on its node.
		r.remove(ctx, v)
		return
	}
	if r.opt.Kube != nil && r.observeKube(ctx, v) {
		dirty = true
	}
	if r.act(ctx, v) {
		dirty = true
	}
	if dirty {
		v.Status.UpdatedAt = time.Now().UTC()
		r.save(v, base)
	}
}

// save writes what a worker made of base. A conflict means someone else
// wrote the volume since it was read: a user's request (deletion, forget)
// through this or another replica is merged and the write tried again;
// anything else (a cache behind a predecessor's writes) wins, and the
// volume is reconciled again from it.
func (r *Reconciler) save(v, base *volume.Volume) {
	name := v.Spec.Name
	for range 3 {
		err := r.writer().Update(v)
		var ce *store.ConflictError
		switch {
		case err == nil:
			return
		case errors.Is(err, store.ErrFenced):
			r.warn.Warn("not saving: this replica lost its leadership", "volume", name)
			return
		case !errors.As(err, &ce):
			r.log.Error("saving volume", "volume", name, "error", err)
			r.q.addAfter(name, r.opt.RetryDelay)
			return
		case ce.Current == nil || !onlyRequestsChanged(base, ce.Current):
			r.log.Warn("volume changed elsewhere while it was reconciled; reconciling it again", "volume", name)
			r.q.add(name)
			return
		}
		cur := ce.Current
		if cur.DeleteRequested && !base.DeleteRequested {
			v.DeleteRequested, v.Wipe = true, cur.Wipe
		}
		v.ForgetRequested = v.ForgetRequested || cur.ForgetRequested
		v.NodeForgotten = v.NodeForgotten || cur.NodeForgotten
		v.Revision, base = cur.Revision, cur
		r.q.add(name) // the request itself is acted on by the next pass
	}
	r.log.Error("saving volume: it keeps changing", "volume", name)
	r.q.addAfter(name, r.opt.RetryDelay)
}

// onlyRequestsChanged tells whether cur differs from base only in what
// users write (the deletion and forget requests).
func onlyRequestsChanged(base, cur *volume.Volume) bool {
	a, b := base.Clone(), cur.Clone()
	for _, x := range []*volume.Volume{a, b} {
		x.DeleteRequested, x.Wipe, x.ForgetRequested, x.NodeForgotten, x.Revision = false, false, false, false, 0
	}
	return reflect.DeepEqual(a, b)
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
	if err := r.writer().Delete(v); err != nil {
		switch {
		case errors.Is(err, store.ErrFenced):
			r.warn.Warn("not removing: this replica lost its leadership", "volume", name)
		case errors.Is(err, store.ErrConflict):
			r.log.Warn("volume changed elsewhere while it was removed; reconciling it again", "volume", name)
			r.q.add(name)
		default:
			r.log.Error("removing volume", "volume", name, "error", err)
			r.q.addAfter(name, r.opt.RetryDelay)
		}
		return
	}
	r.mu.Lock()
	delete(r.notBefore, name)
	delete(r.backoff, name)
	r.mu.Unlock()
	r.Nodes.Forget(v.Spec.UUID)
	r.jobLog.forget(name)
	r.log.Info("volume deleted", "volume", name, "node", v.Spec.Node)
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
		if err := r.roomFor("adoption"); err != nil {
			r.log.Warn("not adopting volume", "volume", name, "job", o.jid, "node", o.node, "error", err)
			return
		}
		now := time.Now().UTC()
		v := &volume.Volume{Spec: *s, CreatedAt: now, Origin: volume.OriginSalt,
			Status: volume.Status{Status: saltvolumes.Status{Phase: volume.Available, JobID: o.jid, UpdatedAt: now}}}
		v.Status.ApplyDevice(o.result.Device)
		v.Status.PreparedSize = s.Bytes()
		// In Kubernetes mode an adopted volume gets no PersistentVolume:
		// nobody asked for it to be offered to claims, and a PV without a
		// claimRef binds any claim that names it.
		if err := r.writer().Create(v); err != nil {
			r.log.Warn("not adopting volume", "volume", name, "error", err)
			r.q.add(name)
			return
		}
		r.Metrics.Adopted.Inc()
		r.log.Info("volume prepared outside the control plane adopted", "volume", name, "node", o.node, "job", o.jid)
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
	case obsForget:
		if st.Phase != volume.Failed && !v.NodeForgotten {
			// Failed no more (its node reported it healthy meanwhile): the
			// request lapses, or a later failure would forget the volume
			// unasked.
			r.log.Info("forget dropped", "volume", v.Spec.Name, "phase", st.Phase)
			v.ForgetRequested = false
			return changed
		}
		r.forgetJob(st.JobID, v.Spec.Name)
		r.log.Warn("volume forgotten without touching its node", "volume", v.Spec.Name, "node", v.Spec.Node, "phase", st.Phase, "reason", st.Reason, "nodeDrained", v.NodeForgotten)
		return removed
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
	if out.ModulesMissing && r.syncModules(v.Spec.Node) {
		out.Retryable = true
		out.Message += "; asked the node to sync them (saltutil.sync_all), running again"
	}
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
		if strings.Contains(out.Message, ReasonWipeUnverified+": ") {
			st.Reason = ReasonWipeUnverified
		}
		if v.DeletionMarked {
			// kubectl delete cannot be taken back: try again, backing
			// off (a kubelet unmounts a pod's volume a moment after the
			// pod is gone).
			r.log.Info("removal failed; the Volume is marked for deletion: trying again", "volume", name, "message", out.Message)
			st.JobID = ""
			r.delay(name)
			return changed
		}
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
		st.PreparedSize, st.Growing = v.Spec.Bytes(), false
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
	reason := ReasonPrepareFailed
	if st.Growing || growthAsked(v) {
		// The volume was prepared before: this run was a growth, and the
		// volume's data is as the node left it.
		reason = ReasonResizeFailed
	}
	st.Growing = false
	st.Phase, st.Reason, st.Message = volume.Failed, reason, out.Message
	if v.DeleteRequested {
		// The removal starts in this same pass and its step replaces the
		// message: say here why the creation ended.
		r.log.Info("creation failed; the deletion asked for meanwhile starts now", "volume", name, "job", st.JobID, "message", out.Message)
	}
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
	case !v.DeleteRequested && st.Phase == volume.Available && growthAsked(v):
		// A spec edited to more than was prepared (kubectl edit of a
		// Volume object): the same growth salt-volumes resize starts.
		r.log.Info("volume spec asks for more: growing it", "volume", v.Spec.Name, "size", v.Spec.Bytes())
		startGrowth(v, "growing to "+spec.FormatSize(v.Spec.Bytes()))
		r.q.add(v.Spec.Name)
		return true
	case needsPrepareRun(v):
		if st.Phase == volume.Unknown {
			if err := v.Spec.Validate(); err != nil {
				r.log.Warn("volume refused: its spec breaks the volume contract", "volume", v.Spec.Name, "error", err)
				st.Phase, st.Reason, st.Message = volume.Failed, ReasonInvalidSpec, "spec."+err.Error()+"; delete the volume and create it again with the field fixed"
				return true
			}
			if r.beyondLimit(v) {
				r.Metrics.OverLimit.Inc("object")
				r.log.Warn("volume refused: over limits.volumes", "volume", v.Spec.Name, "limit", r.opt.MaxVolumes)
				st.Phase, st.Reason, st.Message = volume.Failed, ReasonLimit, (&LimitError{Max: r.opt.MaxVolumes}).Error()+"; nothing ran for this volume"
				return true
			}
		}
		if h, ok := r.store.(store.Holder); ok && !h.Held(v.Spec.Name) {
			// Written once before anything runs: from then on a deletion
			// made outside the control plane (kubectl delete) waits for
			// the storage to be reclaimed.
			st.Phase, st.Step = volume.Pending, stepAccepted
			r.q.add(v.Spec.Name)
			return true
		}
		return r.launch(ctx, v, SLSPrepared, volume.Pending)
	case waiting(v) && st.JobID != "":
		return r.checkTimeout(ctx, v)
	}
	return false
}
