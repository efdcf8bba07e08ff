// Package reconciler drives volume objects through their phases. On the
// replica that leads, a pass over one volume at a time (client-go's work
// queue; reconcile returns a Result saying when the next pass is due) starts
// Salt state runs, through the master's request server or salt-api, one per
// node at a time, doing every create, or every delete, that queued for that
// node, and settles each volume by its own state when the job returns.
// Users' requests reach it through the store (internal/requests writes
// them; the store's watch queues the volume).
//
// The bus says when, the job cache says what: any accepted minion can put a
// salt/job/<jid>/ret/<any minion> event with any payload on the master bus
// (Salt's batched minion events), so a return seen on the bus only makes the
// reconciler look the job up (the master's job cache on disk, or
// jobs.list_job). The job cache is written by the master from
// authenticated minion returns; only the looked-up return of the volume's
// own node settles, adopts, updates or removes a volume.
package reconciler

import (
	"context"
	"log/slog"
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
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
	ReasonWipeUnverified  = saltvolumes.ReasonWipeUnverified
	ReasonResizing        = volume.ReasonResizing
	ReasonResizeFailed    = volume.ReasonResizeFailed
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
	// ReasonContainerClosed (phase Locked): an encrypted volume's
	// container is on its node but not open (its key was not at hand when
	// the node restored it, or someone closed it).
	ReasonContainerClosed = "ContainerClosed"
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
	Lookups           metrics.Counter
	// NodeReportsConfirmed counts node reports applied once the node's
	// own salt_volumes.status bore them out.
	NodeReportsConfirmed metrics.Counter
	JobLatency           *metrics.Histogram
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

// Values lists the counters by reason label.
func (r *Rejections) Values() map[string]int64 {
	return map[string]int64{"unconfirmed": r.Unconfirmed.Value(), "progress": r.Progress.Value(), "device": r.Device.Value(), "health": r.Health.Value(), "flood": r.Flood.Value()}
}

// Reconciler owns the volume objects in its store.
type Reconciler struct {
	// Snapshots, when set, are taken and deleted by the leader beside
	// the volumes (their job returns come through the same bus).
	Snapshots *snapshots.Service
	store     store.Store
	// w is what workers write through during a term (Lead): the store
	// itself, or a writer fenced on this replica's leadership.
	w    store.Writer
	salt Salt
	// unknownAt is when a node unknown to the control plane was last
	// asked to confirm itself (confirmUnknownNode).
	unknownMu sync.Mutex
	unknownAt time.Time
	source    events.Source
	opt       Options
	log       *slog.Logger
	// Requests takes users' requests (create, delete, grow...) into the
	// store, where the reconciler's watch finds them.
	Requests *requests.Service
	Metrics  *Metrics
	// Nodes holds what nodes report about themselves.
	Nodes *health.Registry

	mu sync.Mutex
	// steps holds, per volume, the last progress step shown (stepBehind).
	stepsMu sync.Mutex
	steps   map[string]stepMark
	// progressAt is when each volume's long-step report was last saved.
	progressAt map[string]time.Time
	// term is the queue of the term under way (nil between terms).
	term           *term
	inbox          map[string][]observation
	jobs           map[string][]string // our job id -> its volumes
	unmatched      map[string]struct{}
	unmatchedOrder []string
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
		Requests: requests.New(st, opt.MaxVolumes),
		Nodes:    health.New(),
		Metrics:  &Metrics{JobLatency: metrics.NewHistogram(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)},
		inbox:    map[string][]observation{}, jobs: map[string][]string{},
		unmatched: map[string]struct{}{}, nodeRuns: map[string]nodeRun{}, jobNode: map[string]string{},
		warn:  newRateLog(log, time.Minute),
		hints: rate.NewLimiter(rate.Limit(opt.HintNamesPerSecond), int(4*opt.HintNamesPerSecond)),
	}
	r.cache = newJobCache(salt, &r.Metrics.Lookups)
	r.Nodes.Known = r.knownOn
	// Every replica's watchers see the store's changes, whoever made them.
	st.Watch(r.noticed)
	return r
}

// WriteMetrics adds the reconciler's counters, its requests' refusals and
// the work queues (its own, and the Kubernetes controller's) to an
// exposition.
func (r *Reconciler) WriteMetrics(mw *metrics.Writer) {
	m := r.Metrics
	mw.Counter("salt_volumes_reconciles_total", "Volume reconcile passes.", m.Reconciles.Value())
	mw.Counter("salt_volumes_jobs_launched_total", "State runs started through salt-api.", m.JobsLaunched.Value())
	mw.Counter("salt_volumes_jobs_succeeded_total", "State runs that settled a volume successfully.", m.JobsSucceeded.Value())
	mw.Counter("salt_volumes_jobs_failed_total", "State runs that failed a volume.", m.JobsFailed.Value())
	mw.Counter("salt_volumes_jobs_reconstructed_total", "Jobs settled from Salt's job cache after an event bus reconnect or a control plane restart.", m.JobsReconstructed.Value())
	mw.Counter("salt_volumes_jobs_relaunched_total", "Jobs unknown to Salt after a reconnect or restart, started again.", m.JobsRelaunched.Value())
	mw.Counter("salt_volumes_jobs_timed_out_total", "Jobs without a return within the job timeout.", m.JobsTimedOut.Value())
	mw.Counter("salt_volumes_job_launch_errors_total", "Failed attempts to start a state run.", m.LaunchErrors.Value())
	mw.Counter("salt_volumes_job_lookups_total", "Job cache lookups (reconnects, restarts, timeouts, polling mode).", m.Lookups.Value())
	mw.Counter("salt_volumes_node_reports_confirmed_total", "Node reports applied after the node's own salt_volumes.status confirmed them.", m.NodeReportsConfirmed.Value())
	mw.Counter("salt_volumes_adopted_total", "Volumes first seen in someone else's state run.", m.Adopted.Value())
	r.Requests.WriteMetrics(mw)
	mw.CounterVec("salt_volumes_events_rejected_total", "Events that changed nothing because they could not be trusted: job returns the job cache does not confirm (unconfirmed), progress not from the volume's node (progress), device info that does not describe the volume (device), node reports not from the node they are about (health).", "reason", m.Rejected.Values())
	mw.Histogram("salt_volumes_job_latency_seconds", "From starting a state run to its return settling the volume.", m.JobLatency)
	metrics.WorkQueues.Write(mw)
}
