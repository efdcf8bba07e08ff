package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
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
	Provision(s *spec.Spec, claim *saltvolumes.Claim) (*volume.Volume, error)
	Resize(name, size string) (*volume.Volume, error)
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
	log     *slog.Logger
	Metrics *Metrics

	factory   informers.SharedInformerFactory
	pvFactory informers.SharedInformerFactory
	pvs       corelisters.PersistentVolumeLister
	pvcs      corelisters.PersistentVolumeClaimLister
	classes   storagelisters.StorageClassLister
	nodes     corelisters.NodeLister
	synced    []cache.InformerSynced

	claims      workqueue.TypedRateLimitingInterface[string]
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	mu       sync.Mutex
	reported map[string]string // volume -> last condition reported on its claim

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
		cfg.StorageClass = DefaultStorageClass
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
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "claims"})

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
	c.spawn(func() { c.followLeadership(ctx) })
	go func() {
		select {
		case <-ctx.Done():
		case <-c.stop:
		}
		c.claims.ShutDown()
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

func (c *Controller) queueAllClaims() {
	pvcs, err := c.pvcs.List(labels.Everything())
	if err != nil {
		return
	}
	for _, pvc := range pvcs {
		if key, err := cache.MetaNamespaceKeyFunc(pvc); err == nil {
			c.claims.Add(key)
		}
	}
}

// ours reports whether pv was made by us for the volume with this uuid.
func ours(pv *corev1.PersistentVolume, uuid string) bool {
	return pv.Labels[LabelManagedBy] == ManagedBy && pv.Labels[LabelUUID] == uuid
}

func pvStatus(pv *corev1.PersistentVolume) *saltvolumes.PersistentVolume {
	s := &saltvolumes.PersistentVolume{Name: pv.Name, Phase: string(pv.Status.Phase), Terminating: pv.DeletionTimestamp != nil}
	if s.Phase == "" {
		s.Phase = string(corev1.VolumePending)
	}
	if r := pv.Spec.ClaimRef; r != nil && r.Name != "" {
		s.Claim = r.Namespace + "/" + r.Name
	}
	return s
}

func samePV(a, b *saltvolumes.PersistentVolume) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// Observe implements reconciler.Kubernetes.
func (c *Controller) Observe(ctx context.Context, v *volume.Volume) reconciler.KubeVerdict {
	name := v.Spec.Name
	var cur *saltvolumes.PersistentVolume
	pv, err := c.pvs.Get(name)
	if err == nil && ours(pv, v.Spec.UUID) {
		cur = pvStatus(pv)
	} else if v.Status.Phase == volume.Available && v.Status.PersistentVolume != nil {
		// Missing from the watch: ask the API server before deciding the
		// PV is gone (the watch may lag behind our own create).
		live, gerr := c.cs.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case gerr == nil && ours(live, v.Spec.UUID):
			cur = pvStatus(live)
		case gerr != nil && !apierrors.IsNotFound(gerr):
			return reconciler.KubeVerdict{} // cannot tell; the next event or resync will
		}
	}
	prev := v.Status.PersistentVolume
	kv := reconciler.KubeVerdict{Changed: !samePV(prev, cur)}
	v.Status.PersistentVolume = cur
	defer c.report(v)
	if v.DeleteRequested {
		return kv
	}
	if v.Status.Phase == volume.Available {
		switch {
		case cur == nil && (prev == nil || prev.Claim == ""):
			// Never an adopted volume: it was not made to be offered.
			kv.Republish = v.Origin != volume.OriginSalt
		case cur == nil:
			kv.Lost = fmt.Sprintf("its PersistentVolume %s was deleted outside salt-volumes while claimed by %s; the data is kept on %s: delete the volume (salt-volumes rm %s) when it is no longer needed", name, prev.Claim, v.Spec.Node, name)
		case cur.Terminating:
			kv.Lost = fmt.Sprintf("its PersistentVolume %s is being deleted outside salt-volumes (kubectl delete pv); the data is kept on %s: delete the volume (salt-volumes rm %s) to finish, and create it again if it is still needed", name, v.Spec.Node, name)
		}
	}
	if cl := v.Claim; cl != nil && cl.ReclaimPolicy == string(corev1.PersistentVolumeReclaimDelete) {
		switch {
		case cur != nil && cur.Phase == string(corev1.VolumeReleased):
			kv.Reclaim = true
		case cur == nil && v.Status.Phase != volume.Pending && !c.claimExists(cl):
			kv.Reclaim = true
		}
	}
	if cl := v.Claim; cl != nil && !kv.Reclaim && cur == nil && v.Status.Phase == volume.Failed {
		if pvc, err := c.pvcs.PersistentVolumeClaims(cl.Namespace).Get(cl.Name); err == nil {
			kv.Reprovision = reprovision(v, pvc)
		}
	}
	return kv
}

func (c *Controller) claimExists(cl *saltvolumes.Claim) bool {
	pvc, err := c.pvcs.PersistentVolumeClaims(cl.Namespace).Get(cl.Name)
	return err == nil && string(pvc.UID) == cl.UID
}

// Publish implements reconciler.Kubernetes.
func (c *Controller) Publish(ctx context.Context, v *volume.Volume) error {
	want, err := c.build(v)
	if err != nil {
		return err
	}
	api := c.cs.CoreV1().PersistentVolumes()
	got, err := api.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = api.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case err != nil:
		case !ours(got, v.Spec.UUID):
			return fmt.Errorf("a PersistentVolume named %s already exists and was not made for this volume (its %s label is %q): delete or rename it", want.Name, LabelUUID, got.Labels[LabelUUID])
		case got.DeletionTimestamp != nil:
			return fmt.Errorf("the previous PersistentVolume %s is still being deleted", want.Name)
		default:
			got, err = c.grow(ctx, got, want.Spec.Capacity.Storage())
		}
	} else if err == nil {
		// Between creating the PV and recording the volume Available.
		failpoint.Hit("pv-created")
		c.Metrics.PVsCreated.Inc()
		c.log.Info("PersistentVolume created", "volume", v.Spec.Name, "node", v.Spec.Node, "size", got.Spec.Capacity.Storage().String())
	}
	if err != nil {
		return fmt.Errorf("creating PersistentVolume %s: %w", want.Name, err)
	}
	v.Status.PersistentVolume = pvStatus(got)
	if cl := v.Claim; cl != nil {
		c.event(cl, corev1.EventTypeNormal, "ProvisioningSucceeded", fmt.Sprintf("Successfully provisioned volume %s: %s on Salt minion %s (%s)",
			v.Spec.Name, spec.FormatSize(v.Status.Size), v.Spec.Node, v.Status.PersistentPath))
	}
	return nil
}

// grow raises the capacity of a volume's PV to what the volume grew to,
// and then that of its claim, as the external resizer does for CSI
// volumes: the in-tree local volume plugin expands nothing, and the
// filesystem was grown online on the node already.
func (c *Controller) grow(ctx context.Context, pv *corev1.PersistentVolume, size *resource.Quantity) (*corev1.PersistentVolume, error) {
	api := c.cs.CoreV1().PersistentVolumes()
	name := pv.Name
	raised := pv.Spec.Capacity.Storage().Cmp(*size) < 0
	if raised {
		// pv changes only on success: a failed Update returns an empty
		// object, and the retry reads the PV again by its name.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := api.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.Spec.Capacity.Storage().Cmp(*size) < 0 {
				cur.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: *size}
				if cur, err = api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
					return err
				}
			}
			pv = cur
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("raising the capacity of PersistentVolume %s to %s: %w", name, size, err)
		}
		c.log.Info("PersistentVolume capacity raised", "pv", name, "size", size.String())
	}
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.Name == "" {
		return pv, nil
	}
	pvcs := c.cs.CoreV1().PersistentVolumeClaims(ref.Namespace)
	var grown *corev1.PersistentVolumeClaim
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := pvcs.Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case pvc.UID != ref.UID || pvc.Spec.VolumeName != pv.Name:
			return nil
		}
		if cur, ok := pvc.Status.Capacity[corev1.ResourceStorage]; !ok || cur.Cmp(*size) >= 0 {
			return nil // not bound yet (the binder sets it), or as large
		}
		pvc.Status.Capacity[corev1.ResourceStorage] = *size
		if pvc.Status.AllocatedResources != nil {
			pvc.Status.AllocatedResources[corev1.ResourceStorage] = *size
		}
		delete(pvc.Status.AllocatedResourceStatuses, corev1.ResourceStorage)
		pvc.Status.Conditions = slices.DeleteFunc(pvc.Status.Conditions, func(c corev1.PersistentVolumeClaimCondition) bool {
			return c.Type == corev1.PersistentVolumeClaimResizing || c.Type == corev1.PersistentVolumeClaimFileSystemResizePending
		})
		grown, err = pvcs.UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("raising the capacity of claim %s/%s to %s: %w", ref.Namespace, ref.Name, size, err)
	}
	if grown != nil {
		c.log.Info("claim capacity raised", "claim", ref.Namespace+"/"+ref.Name, "size", size.String())
	}
	// Once per growth, whoever raised the claim's capacity: kubelet may,
	// seeing the PV larger than the claim (its local plugin "expands" a
	// filesystem we grew already).
	if raised || grown != nil {
		c.event(&saltvolumes.Claim{Namespace: ref.Namespace, Name: ref.Name, UID: string(ref.UID)}, corev1.EventTypeNormal,
			"VolumeResizeSuccessful", fmt.Sprintf("volume %s grown to %s", pv.Name, size))
	}
	return pv, nil
}

// Withdraw implements reconciler.Kubernetes. It reads the PV from the API
// server, not the watch: a deletion is decided on the freshest state.
func (c *Controller) Withdraw(ctx context.Context, v *volume.Volume) (bool, string, error) {
	api := c.cs.CoreV1().PersistentVolumes()
	pv, err := api.Get(ctx, v.Spec.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		v.Status.PersistentVolume = nil
		return true, "", nil
	case err != nil:
		return false, "", err
	case !ours(pv, v.Spec.UUID):
		return true, "", nil // someone else's PV by that name: not ours to delete
	}
	v.Status.PersistentVolume = pvStatus(pv)
	if pv.DeletionTimestamp == nil {
		switch pv.Status.Phase {
		case corev1.VolumeBound, corev1.VolumePending:
			ok, why := volume.CanDelete(v)
			if !ok {
				return false, why, nil
			}
		}
		uid := pv.UID
		if err := api.Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
			return false, "", fmt.Errorf("deleting PersistentVolume %s: %w", pv.Name, err)
		}
		c.Metrics.PVsDeleted.Inc()
		c.log.Info("PersistentVolume deleted; waiting until no claim holds it", "volume", v.Spec.Name)
		return false, "", nil
	}
	// Kubernetes removes its pv-protection finalizer once no claim is
	// bound to the PV: that is when the storage may go.
	return !slices.Contains(pv.Finalizers, pvProtection), "", nil
}

// Release implements reconciler.Kubernetes.
func (c *Controller) Release(ctx context.Context, v *volume.Volume) error {
	c.mu.Lock()
	delete(c.reported, v.Spec.Name)
	c.mu.Unlock()
	err := c.release(ctx, v.Spec.Name, v.Spec.UUID)
	if v.Claim != nil && v.Status.PersistentVolume == nil {
		err = errors.Join(err, c.unselect(ctx, v))
	}
	return err
}

// unselect gives the claim of a volume deleted before it was ever
// published back to the scheduler, as Kubernetes' own provisioners do: it
// removes the claim's selected-node annotation if it still names the
// volume's node. The scheduler then places the claim's pod again, perhaps
// on another node, and names that node on the claim, which provisions a
// new volume there. Without it the pod would wait on a node that will not
// get its volume.
func (c *Controller) unselect(ctx context.Context, v *volume.Volume) error {
	cl := v.Claim
	node, err := c.cfg.Nodes.NodeName(v.Spec.Node)
	if err != nil {
		return nil
	}
	api := c.cs.CoreV1().PersistentVolumeClaims(cl.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := api.Get(ctx, cl.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if string(pvc.UID) != cl.UID || pvc.Spec.VolumeName != "" || pvc.DeletionTimestamp != nil || pvc.Annotations[annSelectedNode] != node {
			return nil
		}
		delete(pvc.Annotations, annSelectedNode)
		if _, err := api.Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("giving claim %s/%s back to the scheduler: %w", cl.Namespace, cl.Name, err)
		}
		c.log.Info("claim given back to the scheduler", "claim", cl.Namespace+"/"+cl.Name, "volume", v.Spec.Name, "node", node)
		c.event(cl, corev1.EventTypeNormal, "Rescheduling", fmt.Sprintf("volume %s was deleted before it was ready on node %s (see the ProvisioningFailed event): the claim goes back to the scheduler to pick a node again",
			v.Spec.Name, node))
		return nil
	})
}

// release drops our finalizer from the PV name made for uuid, and deletes
// it if no one has: its volume is gone.
func (c *Controller) release(ctx context.Context, name, uuid string) error {
	api := c.cs.CoreV1().PersistentVolumes()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pv, err := api.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if !ours(pv, uuid) {
			return nil
		}
		if pv.DeletionTimestamp == nil {
			uid := pv.UID
			if err := api.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			c.Metrics.PVsDeleted.Inc()
			if pv, err = api.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return nil
			} else if err != nil {
				return err
			}
		}
		if !slices.Contains(pv.Finalizers, Finalizer) {
			return nil
		}
		pv.Finalizers = slices.DeleteFunc(pv.Finalizers, func(f string) bool { return f == Finalizer })
		if _, err := api.Update(ctx, pv, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		c.Metrics.FinalizersReleased.Inc()
		c.log.Info("PersistentVolume released", "volume", name)
		return nil
	})
}

// pvChanged re-reconciles the PV's volume. A PV of ours being deleted whose
// volume is gone (the control plane stopped between reclaiming the storage
// and dropping the finalizer, or the volume was forgotten) is released.
func (c *Controller) pvChanged(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pv, ok := o.(*corev1.PersistentVolume)
	if !ok || pv.Labels[LabelManagedBy] != ManagedBy || c.vols == nil {
		return
	}
	if _, err := c.vols.Get(pv.Name); err == nil {
		c.vols.Touch(pv.Name)
		return
	}
	// Only the leader releases: a follower's cache may lag the store.
	if pv.DeletionTimestamp != nil && slices.Contains(pv.Finalizers, Finalizer) && c.leading() {
		c.spawn(func() {
			ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
			defer cancel()
			if err := c.release(ctx, pv.Name, pv.Labels[LabelUUID]); err != nil {
				c.log.Warn("could not release the PersistentVolume of a deleted volume", "pv", pv.Name, "error", err)
			}
		})
	}
}

func (c *Controller) claimChanged(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pvc, ok := o.(*corev1.PersistentVolumeClaim)
	if !ok || c.vols == nil {
		return
	}
	// A claim's volume learns of its claim's changes (deletion, binding).
	c.vols.Touch("pvc-" + string(pvc.UID))
	if !c.leading() {
		return // queued when this replica leads (followLeadership)
	}
	if key, err := cache.MetaNamespaceKeyFunc(pvc); err == nil {
		c.claims.Add(key)
	}
}

func (c *Controller) nextClaim(ctx context.Context) bool {
	key, quit := c.claims.Get()
	if quit {
		return false
	}
	defer c.claims.Done(key)
	if !c.leading() {
		// Leadership was lost after the claim was queued: the next leader
		// queues every claim when it takes over.
		c.claims.Forget(key)
		return true
	}
	err := c.syncClaim(ctx, key)
	if errors.Is(err, errVolumeLeaving) || errors.Is(err, errVolumeBusy) {
		c.claims.Forget(key)
		c.claims.AddAfter(key, time.Second)
		return true
	}
	if err != nil {
		c.log.Warn("provisioning failed; retrying", "claim", key, "error", err)
		c.claims.AddRateLimited(key)
		return true
	}
	c.claims.Forget(key)
	return true
}

// errVolumeBusy: the claim's volume cannot grow yet (being prepared,
// published or grown): asked again in a moment.
var errVolumeBusy = errors.New("the claim's volume is busy")

// expand grows a bound claim's volume when the claim asks for more than it
// has (kubectl edit of spec.resources.requests.storage; the API server
// lets that through only for classes with allowVolumeExpansion). The
// volume's PV and the claim's capacity follow once the node is done
// (Publish).
func (c *Controller) expand(pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass, v *volume.Volume) error {
	if pvc.Spec.VolumeName != v.Spec.Name || v.Spec.SparseLoopDevice == nil {
		return nil
	}
	req, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return nil
	}
	want, err := sparseSizeFor(&v.Spec, req.Value())
	if err != nil {
		return nil // the request was checked when provisioned; a change the sizing refuses shows on the resize
	}
	cur, _ := spec.ParseSize(string(v.Spec.SparseLoopDevice.Size))
	if want <= cur {
		return nil
	}
	cl := &saltvolumes.Claim{Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID)}
	if sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
		c.event(cl, corev1.EventTypeWarning, "VolumeResizeFailed", fmt.Sprintf("StorageClass %s does not set allowVolumeExpansion: true", sc.Name))
		return nil
	}
	if _, err := c.vols.Resize(v.Spec.Name, spec.FormatSize(want)); err != nil {
		var re *requests.ResizeError
		if errors.As(err, &re) && re.Conflict {
			return errVolumeBusy
		}
		c.event(cl, corev1.EventTypeWarning, "VolumeResizeFailed", fmt.Sprintf("growing volume %s to %s: %v", v.Spec.Name, spec.FormatSize(want), err))
		return nil
	}
	c.log.Info("claim asks for more: growing its volume", "claim", pvc.Namespace+"/"+pvc.Name, "volume", v.Spec.Name, "size", want)
	c.event(cl, corev1.EventTypeNormal, "Resizing", fmt.Sprintf("salt-volumes is growing volume %s to %s (asked: %s) on Salt minion %s",
		v.Spec.Name, spec.FormatSize(want), req.String(), v.Spec.Node))
	return nil
}

// errVolumeLeaving: the claim's previous volume is still being deleted.
var errVolumeLeaving = errors.New("the claim's previous volume is still being deleted")

// syncClaim provisions a volume for a claim of one of our classes once the
// scheduler has picked its node. Retries are safe: the volume's name and
// UUID come from the claim's UID, so a second try finds the first.
func (c *Controller) syncClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := c.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pvc.Spec.StorageClassName == nil {
		return nil
	}
	sc, err := c.classes.Get(*pvc.Spec.StorageClassName)
	if err != nil {
		sc = nil
	}
	if sc == nil || sc.Provisioner != c.cfg.Provisioner {
		return nil
	}
	if v, err := c.vols.Get("pvc-" + string(pvc.UID)); err == nil {
		if v.DeleteRequested {
			// A failed volume on its way out: the claim is provisioned
			// anew once it is gone.
			return errVolumeLeaving
		}
		return c.expand(pvc, sc, v)
	}
	minion := ""
	if node := pvc.Annotations[annSelectedNode]; node != "" {
		if minion, err = c.cfg.Nodes.Minion(ctx, node); err != nil {
			return err
		}
	}
	d := decideClaim(pvc, sc, c.cfg.Provisioner, minion)
	switch {
	case d.Wait:
		return nil
	case d.Refuse != "":
		c.Metrics.ClaimsRefused.Inc()
		c.event(&saltvolumes.Claim{Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID)}, corev1.EventTypeWarning, "ProvisioningFailed", d.Refuse)
		return nil
	}
	v, err := c.vols.Provision(d.Spec, d.Claim)
	if err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil
		}
		c.event(d.Claim, corev1.EventTypeWarning, "ProvisioningFailed", fmt.Sprintf("creating volume %s: %v", d.Spec.Name, err))
		return err
	}
	c.Metrics.ClaimsProvisioned.Inc()
	c.log.Info("provisioning a volume for a claim", "claim", key, "volume", v.Spec.Name, "node", v.Spec.Node, "size", d.Spec.SizeBytes)
	c.event(d.Claim, corev1.EventTypeNormal, "Provisioning", fmt.Sprintf("salt-volumes is creating volume %s: a sparse %s %s volume of %s (asked: %s) on Salt minion %s",
		v.Spec.Name, v.Spec.Mode, v.Spec.FSType, spec.FormatSize(d.Spec.SizeBytes), d.Size, v.Spec.Node))
	return nil
}

// report tells a provisioned volume's claim what happened to it: failures
// and the steps of its preparation, once each.
func (c *Controller) report(v *volume.Volume) {
	cl := v.Claim
	if cl == nil || v.Status.PersistentVolume != nil && v.Status.Phase == volume.Available {
		return
	}
	st := v.Status
	var kind, reason, msg string
	switch {
	case st.Phase == volume.Failed && st.Reason == reconciler.ReasonResizeFailed:
		kind, reason, msg = corev1.EventTypeWarning, "VolumeResizeFailed", fmt.Sprintf("growing volume %s on %s failed: %s", v.Spec.Name, v.Spec.Node, st.Message)
	case st.Phase == volume.Pending && st.Reason == reconciler.ReasonResizing:
		return // said when the growth started (Resizing)
	case st.Phase == volume.Failed:
		kind, reason, msg = corev1.EventTypeWarning, "ProvisioningFailed", fmt.Sprintf("volume %s failed on %s (%s): %s", v.Spec.Name, v.Spec.Node, st.Reason, st.Message)
	case st.Phase == volume.Pending && st.Reason != "":
		kind, reason, msg = corev1.EventTypeWarning, "ProvisioningRetrying", fmt.Sprintf("volume %s on %s (%s): %s", v.Spec.Name, v.Spec.Node, st.Reason, st.Message)
	case st.Phase == volume.Pending && st.Step != "":
		kind, reason, msg = corev1.EventTypeNormal, "ProvisioningProgress", fmt.Sprintf("volume %s on %s: %s", v.Spec.Name, v.Spec.Node, st.Step)
	default:
		return
	}
	c.mu.Lock()
	dup := c.reported[v.Spec.Name] == msg
	c.reported[v.Spec.Name] = msg
	c.mu.Unlock()
	if !dup {
		c.event(cl, kind, reason, msg)
	}
}

func (c *Controller) event(cl *saltvolumes.Claim, kind, reason, msg string) {
	if c.recorder == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: cl.Namespace, Name: cl.Name, UID: types.UID(cl.UID)}
	c.recorder.Event(ref, kind, reason, msg)
}

// Classes lists the StorageClasses we provision for (for the API).
func (c *Controller) Classes() []*storagev1.StorageClass {
	all, _ := c.classes.List(labels.Everything())
	var out []*storagev1.StorageClass
	for _, sc := range all {
		if sc.Provisioner == c.cfg.Provisioner {
			out = append(out, sc)
		}
	}
	return out
}

// VolumeEvent records, as Events on a Volume object (kubectl describe
// volume), each change of its phase and each Salt job started for it. uid
// is the object's. Called by the leader only, for every change of the
// store.
func (c *Controller) VolumeEvent(ev store.Event, uid string) {
	if c.recorder == nil || ev.Type != store.Modified || ev.Prev == nil {
		return
	}
	v, p := &ev.Volume.Status, &ev.Prev.Status
	ref := &corev1.ObjectReference{Kind: "Volume", APIVersion: "salt-volumes.io/v1alpha1", Name: ev.Volume.Spec.Name, UID: types.UID(uid)}
	if v.JobID != "" && v.JobID != p.JobID {
		sls := reconciler.SLSPrepared
		if v.Phase == volume.Terminating {
			sls = reconciler.SLSUnprepared
		}
		c.recorder.Eventf(ref, corev1.EventTypeNormal, "SaltCall", "%s started on %s: job %s", sls, ev.Volume.Spec.Node, v.JobID)
	}
	if v.Phase != p.Phase {
		kind := corev1.EventTypeNormal
		if v.Phase == volume.Failed {
			kind = corev1.EventTypeWarning
		}
		from := p.Phase
		if from == volume.Unknown {
			from = "Accepted"
		}
		msg := fmt.Sprintf("%s -> %s", from, v.Phase)
		if v.Reason != "" {
			msg += " (" + v.Reason + ")"
		}
		if v.Message != "" {
			msg += ": " + v.Message
		}
		c.recorder.Event(ref, kind, "StateTransition", msg)
	}
}
