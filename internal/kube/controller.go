package kube

import (
	"context"
	"fmt"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Labels and the finalizer on the PVs we create.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "salt-volumes"
	LabelUUID      = "salt-volumes.io/uuid"
	LabelNode      = "salt-volumes.io/node"
	// Finalizer keeps a PV until its storage has been reclaimed on the node.
	Finalizer = "salt-volumes.io/storage"
	// pvProtection is Kubernetes' own: removed once no claim uses the PV.
	pvProtection = "kubernetes.io/pv-protection"
	// DefaultProvisioner is the provisioner name of our StorageClasses.
	DefaultProvisioner = "salt-volumes.io/sparse"
)

// Volumes is what the controller needs from the reconciler.
type Volumes interface {
	Get(name string) (*volume.Volume, error)
	Provision(ctx context.Context, s *spec.Spec, claim *saltvolumes.Claim) (*volume.Volume, error)
	Resize(ctx context.Context, name, size string) (*volume.Volume, error)
	Touch(name string)
}

// Config is the kubernetes: section of serve's configuration.
type Config struct {
	// StorageClass of the PVs of volumes created through the API.
	StorageClass string
	// Provisioner: claims of classes with this provisioner are provisioned.
	Provisioner string
	// Nodes maps Salt minion ids to Kubernetes node names.
	Nodes *NodeMap
	// Resync re-reads every watched object this often (default 10m): what
	// an event handler missed is caught up then.
	Resync time.Duration
	// Leading, when set, says whether this replica reconciles: only the
	// leader provisions claims (followers keep their caches warm).
	Leading func() bool
}

// Metrics count what the controller did.
type Metrics struct {
	PVsCreated         metrics.Counter
	PVsDeleted         metrics.Counter
	ClaimsProvisioned  metrics.Counter
	ClaimsRefused      metrics.Counter
	FinalizersReleased metrics.Counter
}

// Controller is the Kubernetes side of the control plane: it publishes a
// PersistentVolume for every volume whose storage is ready, follows the
// PVs' phases and claims from the API server's watch, and provisions
// volumes for claims of our StorageClasses. It implements
// reconciler.Kubernetes.
type Controller struct {
	cfg     Config
	cs      kubernetes.Interface
	vols    Volumes
	snaps   *snapshots.Service
	log     *slog.Logger
	Metrics *Metrics
	// classReported holds the UIDs of the PVs moveClass reported as kept
	// in their class, so that each is reported once per process.
	classReported sync.Map

	factory   informers.SharedInformerFactory
	pvFactory informers.SharedInformerFactory
	pvs       corelisters.PersistentVolumeLister
	pvcs      corelisters.PersistentVolumeClaimLister
	classes   storagelisters.StorageClassLister
	nodes     corelisters.NodeLister
	synced    []cache.InformerSynced

	claims      workqueue.TypedRateLimitingInterface[string]
	restores    workqueue.TypedRateLimitingInterface[string] // claims asking for a restore (restore.go)
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	// snapshotObjects, when set, reads VolumeSnapshot objects instead of
	// the API server (tests).
	snapshotObjects func(ctx context.Context, ns, name string) (snapshotObject, error)

	mu       sync.Mutex
	reported map[string]string // volume -> last condition reported on its claim
	// restoreWaits: when each new restore request (claim key, value) first
	// waited for its snapshot (restore.go).
	restoreWaits map[string]time.Time

	// ctx is Start's; work the informers' handlers start runs under it and
	// is counted in wg, which Stop waits for. stopped (under mu) refuses
	// new work once Stop began.
	ctx     context.Context
	stop    chan struct{}
	wg      sync.WaitGroup
	stopped bool
}

// New builds the controller; Start runs it.
func New(cs kubernetes.Interface, cfg Config, log *slog.Logger) *Controller {
	if cfg.StorageClass == "" {
		cfg.StorageClass = DefaultStaticClass
	}
	if cfg.Provisioner == "" {
		cfg.Provisioner = DefaultProvisioner
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	if cfg.Nodes == nil {
		cfg.Nodes = &NodeMap{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Controller{cfg: cfg, cs: cs, log: log, Metrics: &Metrics{}, reported: map[string]string{}}
	c.factory = informers.NewSharedInformerFactory(cs, cfg.Resync)
	// Only our PVs: a cluster's other PVs cost us nothing.
	c.pvFactory = informers.NewSharedInformerFactoryWithOptions(cs, cfg.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelManagedBy + "=" + ManagedBy }))
	pvInf := c.pvFactory.Core().V1().PersistentVolumes()
	pvcInf := c.factory.Core().V1().PersistentVolumeClaims()
	scInf := c.factory.Storage().V1().StorageClasses()
	nodeInf := c.factory.Core().V1().Nodes()
	c.pvs, c.pvcs, c.classes, c.nodes = pvInf.Lister(), pvcInf.Lister(), scInf.Lister(), nodeInf.Lister()
	c.synced = []cache.InformerSynced{pvInf.Informer().HasSynced, pvcInf.Informer().HasSynced, scInf.Informer().HasSynced, nodeInf.Informer().HasSynced}
	c.claims = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "claims", MetricsProvider: metrics.WorkQueues})
	c.restores = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "restores", MetricsProvider: metrics.WorkQueues})

	_, _ = pvInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.pvChanged(o) },
		UpdateFunc: func(_, o any) { c.pvChanged(o) },
		DeleteFunc: func(o any) { c.pvChanged(o) },
	})
	_, _ = pvcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.claimChanged(o) },
		UpdateFunc: func(_, o any) { c.claimChanged(o) },
		DeleteFunc: func(o any) { c.claimChanged(o) },
	})
	return c
}

// SetVolumes connects the controller to the reconciler (which needs the
// controller first).
func (c *Controller) SetVolumes(v Volumes) { c.vols = v }

// Start starts the watches and waits until their caches are filled: the
// reconciler must not decide that a PV is missing before it has read them.
func (c *Controller) Start(ctx context.Context, timeout time.Duration) error {
	c.ctx, c.stop = ctx, make(chan struct{})
	c.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
	c.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.cs.CoreV1().Events("")})
	c.recorder = c.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "salt-volumes"})
	c.factory.Start(ctx.Done())
	c.pvFactory.Start(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), c.synced...) {
		return fmt.Errorf("kubernetes: the watches of PersistentVolumes, PersistentVolumeClaims, StorageClasses and Nodes did not sync within %s: check the API server address and that the control plane's identity has the permissions of deploy/kubernetes/rbac.yaml", timeout)
	}
	if sc, err := c.classes.Get(c.cfg.StorageClass); err == nil && sc.Provisioner == c.cfg.Provisioner {
		c.log.Warn("the PersistentVolumes of volumes made through the API, CLI, UI or Volume objects are in a class claims are provisioned from: any claim of that class, in any namespace, can bind one; give them a class of their own (kubernetes.storageClass: salt-volumes-static) and apply deploy/kubernetes/claims-policy.yaml",
			"storageClass", c.cfg.StorageClass)
	}
	for range 2 {
		c.spawn(func() {
			for c.nextClaim(ctx) {
			}
		})
	}
	c.spawn(func() {
		for c.nextRestore(ctx) {
		}
	})
	c.spawn(func() { c.followLeadership(ctx) })
	go func() {
		select {
		case <-ctx.Done():
		case <-c.stop:
		}
		c.claims.ShutDown()
		c.restores.ShutDown()
	}()
	return nil
}

// Stop ends the claim workers and the work the watches started, and waits
// for them: nothing the controller started writes to the store after it.
// Start's context ending stops them too; Stop still waits.
func (c *Controller) Stop() {
	c.mu.Lock()
	already := c.stopped
	c.stopped = true
	c.mu.Unlock()
	if c.stop == nil {
		return // never started
	}
	if !already {
		close(c.stop)
	}
	c.claims.ShutDown()
	c.restores.ShutDown()
	c.wg.Wait()
	c.broadcaster.Shutdown()
}

// spawn runs f counted in wg, unless Stop began.
func (c *Controller) spawn(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

// leading says whether this replica acts on claims and PVs.
func (c *Controller) leading() bool { return c.cfg.Leading == nil || c.cfg.Leading() }

// followLeadership queues every claim once when this replica becomes the
// leader: a follower queues none (claimChanged), so the claims that changed
// while it followed are looked at then.
func (c *Controller) followLeadership(ctx context.Context) {
	if c.cfg.Leading == nil {
		return
	}
	was := false
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if now := c.cfg.Leading(); now != was {
			was = now
			if now {
				c.queueAllClaims()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-c.stop:
			return
		case <-tick.C:
		}
	}
}
