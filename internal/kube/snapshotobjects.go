package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// VolumeSnapshot objects of our group: kubectl creates one naming a claim
// (or a volume); the leader takes the snapshot on the volume's node and
// writes what the node answered into the object's status; deleting the
// object deletes the snapshot first (our finalizer holds it until then).

// SnapshotResource is the VolumeSnapshot resource of our group.
var SnapshotResource = schema.GroupVersionResource{Group: ourGroup, Version: "v1alpha1", Resource: "volumesnapshots"}

const snapshotFinalizer = "salt-volumes.io/snapshot"

// SnapshotName is the control plane's name of VolumeSnapshot ns/name.
func SnapshotName(ns, name string) string { return ns + "-" + name }

// SnapshotObjects keeps VolumeSnapshot objects and the control plane's
// snapshots in step, on the replica that leads.
type SnapshotObjects struct {
	Client    dynamic.Interface
	Snapshots *snapshots.Service
	Volumes   interface {
		Get(name string) (*volume.Volume, error)
	}
	Claims  corelisters.PersistentVolumeClaimLister
	Leading func() bool
	Log     *slog.Logger
	// Served tells whether the API server serves the resource (its CRD
	// applied): until it does, nothing watches it (a watch of a missing
	// resource would log its failure every few seconds).
	Served func() bool

	queue workqueue.TypedRateLimitingInterface[string]
	lis   cache.GenericLister
}

// Run watches the objects until ctx ends, in the background: a cluster
// without the resource (volumesnapshot-crd.yaml not applied) only gets a
// warning, and everything else works.
func (o *SnapshotObjects) Run(ctx context.Context) error {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Served != nil && !o.Served() {
		o.Log.Warn("volumesnapshots." + ourGroup + " is not served (apply deploy/kubernetes/volumesnapshot-crd.yaml): VolumeSnapshot objects are watched once it is")
		go func() {
			t := time.NewTicker(30 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if o.Served() {
						o.Served = nil
						_ = o.Run(ctx)
						return
					}
				}
			}
		}()
		return nil
	}
	f := dynamicinformer.NewDynamicSharedInformerFactory(o.Client, 10*time.Minute)
	inf := f.ForResource(SnapshotResource)
	o.lis = inf.Lister()
	o.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	add := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			o.queue.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, n any) { add(n) }, DeleteFunc: add}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		o.queue.ShutDown()
	}()
	go func() {
		warn := time.AfterFunc(30*time.Second, func() {
			o.Log.Warn("volumesnapshots." + ourGroup + " cannot be watched (is deploy/kubernetes/volumesnapshot-crd.yaml applied, and serve's ClusterRole the current one?): VolumeSnapshot objects are not served until it is")
		})
		ok := cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced)
		warn.Stop()
		if !ok {
			return
		}
		for o.next(ctx) {
		}
	}()
	return nil
}

func (o *SnapshotObjects) next(ctx context.Context) bool {
	key, quit := o.queue.Get()
	if quit {
		return false
	}
	defer o.queue.Done(key)
	if !o.Leading() {
		// The leader's queue has them; this replica's resync (every 10
		// min) or a change brings them back if it leads by then.
		o.queue.Forget(key)
		o.queue.AddAfter(key, 5*time.Second)
		return true
	}
	again, err := o.sync(ctx, key)
	switch {
	case err != nil:
		o.Log.Warn("volume snapshot object", "object", key, "error", err)
		o.queue.AddRateLimited(key)
	case again:
		o.queue.Forget(key)
		o.queue.AddAfter(key, time.Second)
	default:
		o.queue.Forget(key)
	}
	return true
}

// sync brings one object and its snapshot in step; again: look once more
// in a moment (its job runs).
func (o *SnapshotObjects) sync(ctx context.Context, key string) (again bool, err error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return false, nil
	}
	obj, err := o.lis.ByNamespace(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	u := obj.(*unstructured.Unstructured).DeepCopy()
	api := o.Client.Resource(SnapshotResource).Namespace(ns)
	snapName := SnapshotName(ns, name)
	if u.GetDeletionTimestamp() != nil {
		if !slices.Contains(u.GetFinalizers(), snapshotFinalizer) {
			return false, nil
		}
		snap, err := o.Snapshots.Get(ctx, snapName)
		if err == nil {
			if snap.Phase != snapshots.Deleting {
				if _, err := o.Snapshots.Delete(ctx, snapName, "k8s:volumesnapshot "+key); err != nil {
					return false, err
				}
			}
			return true, o.status(ctx, api, u, snap, "")
		}
		if !errors.Is(err, snapshots.ErrNotFound) {
			return false, err
		}
		u.SetFinalizers(slices.DeleteFunc(u.GetFinalizers(), func(f string) bool { return f == snapshotFinalizer }))
		_, err = api.Update(ctx, u, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return err != nil, nil
		}
		return false, err
	}
	if !slices.Contains(u.GetFinalizers(), snapshotFinalizer) {
		u.SetFinalizers(append(u.GetFinalizers(), snapshotFinalizer))
		if _, err := api.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				return true, nil
			}
			return false, err
		}
		return true, nil // the update comes back through the watch
	}
	snap, err := o.Snapshots.Get(ctx, snapName)
	if errors.Is(err, snapshots.ErrNotFound) {
		v, refuse := o.source(u, ns)
		if refuse != "" {
			return false, o.status(ctx, api, u, snapshots.Snapshot{Phase: snapshots.Failed}, refuse)
		}
		if v.Status.Phase != volume.Available {
			return true, o.status(ctx, api, u, snapshots.Snapshot{Phase: snapshots.Pending, Volume: v.Spec.Name, Node: v.Spec.Node},
				fmt.Sprintf("waiting for volume %s to be Available (it is %s)", v.Spec.Name, v.Status.Phase))
		}
		failed := func(msg string) error {
			return o.status(ctx, api, u, snapshots.Snapshot{Phase: snapshots.Failed, Volume: v.Spec.Name, Node: v.Spec.Node}, msg)
		}
		var cow int64
		if q, _, _ := unstructured.NestedString(u.Object, "spec", "copyOnWriteSize"); q != "" {
			if cow, err = spec.ParseSize(q); err != nil || cow <= 0 {
				return false, failed(fmt.Sprintf("spec.copyOnWriteSize: %q is not a size: write it like 2Gi or 512Mi", q))
			}
		}
		snap, _, err = o.Snapshots.TakeFor(ctx, v, snapName, "k8s:volumesnapshot "+key, "", cow)
		var se *snapshots.Error
		if errors.As(err, &se) {
			msg := se.Msg
			if se.Field == "size" {
				msg = "spec.copyOnWriteSize" + strings.TrimPrefix(msg, "size")
			}
			return false, failed(msg)
		}
	}
	if err != nil {
		return false, err
	}
	return snap.Phase == snapshots.Pending || snap.Phase == snapshots.Deleting, o.status(ctx, api, u, snap, snap.Message)
}

// source is the volume the object asks a snapshot of.
func (o *SnapshotObjects) source(u *unstructured.Unstructured, ns string) (*volume.Volume, string) {
	claim, _, _ := unstructured.NestedString(u.Object, "spec", "source", "persistentVolumeClaimName")
	name, _, _ := unstructured.NestedString(u.Object, "spec", "source", "volume")
	if claim != "" {
		pvc, err := o.Claims.PersistentVolumeClaims(ns).Get(claim)
		if err != nil {
			return nil, fmt.Sprintf("spec.source.persistentVolumeClaimName: claim %s not found in namespace %s", claim, ns)
		}
		if pvc.Spec.VolumeName == "" {
			return nil, fmt.Sprintf("spec.source.persistentVolumeClaimName: claim %s is not bound yet: create the snapshot once it is", claim)
		}
		name = pvc.Spec.VolumeName
	}
	v, err := o.Volumes.Get(name)
	if err != nil {
		return nil, fmt.Sprintf("spec.source: %s is not a salt-volumes volume", name)
	}
	return v, ""
}

// status writes the snapshot's state into the object, when it changed.
func (o *SnapshotObjects) status(ctx context.Context, api dynamic.ResourceInterface, u *unstructured.Unstructured, s snapshots.Snapshot, msg string) error {
	st := map[string]any{"phase": s.Phase, "readyToUse": s.Phase == snapshots.Ready}
	set := func(k string, v any, ok bool) {
		if ok {
			st[k] = v
		}
	}
	set("snapshot", s.Name, s.Name != "")
	set("volume", s.Volume, s.Volume != "")
	set("node", s.Node, s.Node != "")
	set("method", s.Method, s.Method != "")
	set("sizeBytes", s.Size, s.Size > 0)
	set("allocatedBytes", s.Allocated, s.Allocated > 0)
	if s.TakenAt != nil {
		st["takenAt"] = s.TakenAt.UTC().Format(time.RFC3339)
	}
	set("message", msg, msg != "")
	old, _, _ := unstructured.NestedMap(u.Object, "status")
	if fmt.Sprint(old) == fmt.Sprint(st) {
		return nil
	}
	u.Object["status"] = st
	_, err := api.UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // the watch brings the newer object
	}
	return err
}
