package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// of its namespace (or, with cluster-level rights, a volume or an existing
// snapshot); the leader takes the snapshot on the volume's node and writes
// what the node answered into the object's status; deleting the object
// deletes the snapshot first (our finalizer holds it until then).
//
// Tenancy: an object's snapshot is named by SnapshotName, which two
// objects never share, and records its owner (namespace, name, uid):
// every write (take, bind, delete, release) checks it, so that a snapshot
// that is not the object's is never taken over or deleted, and claims
// restore only snapshots owned by an object of their namespace
// (clone.go). Which objects may name a volume or an existing snapshot
// (spec.source.volume, spec.source.snapshotName) is the admission policy's
// (deploy/kubernetes/volumesnapshot-policy.yaml): the verb admin on
// volumes.salt-volumes.io.

// SnapshotResource is the VolumeSnapshot resource of our group.
var SnapshotResource = schema.GroupVersionResource{Group: ourGroup, Version: "v1alpha1", Resource: "volumesnapshots"}

const snapshotFinalizer = "salt-volumes.io/snapshot"

// SnapshotName is the control plane's name of VolumeSnapshot ns/name's
// snapshot: readable, cut to fit, and told apart by 64 bits of the
// SHA-256 of "ns/name" (neither has a '/'): "team/a-backup" and
// "team-a/backup" are two snapshots. A DNS label, at most 63 characters,
// as the store and the node take them. Should two objects ever share a
// name, the owner recorded with the snapshot refuses the second.
func SnapshotName(ns, name string) string {
	sum := sha256.Sum256([]byte(ns + "/" + name))
	h := hex.EncodeToString(sum[:8])
	b := []byte(ns + "-" + name)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '-'
		}
	}
	readable := strings.Trim(string(b[:min(len(b), 63-1-len(h))]), "-")
	if readable == "" {
		return "vs-" + h
	}
	return readable + "-" + h
}

// legacyName is the name objects' snapshots had before SnapshotName
// (ns-name, which two objects could share): such a record, taken for
// this very object (its RequestedBy says so) and owned by none, is
// adopted.
func legacyName(ns, name string) string { return ns + "-" + name }

// ownerOf is the object u as a snapshot's owner.
func ownerOf(u *unstructured.Unstructured, bound bool) snapshots.Owner {
	return snapshots.Owner{Namespace: u.GetNamespace(), Name: u.GetName(), UID: string(u.GetUID()), Bound: bound}
}

// SnapshotObjects keeps VolumeSnapshot objects and the control plane's
// snapshots in step, on the replica that leads.
type SnapshotObjects struct {
	Client    dynamic.Interface
	Snapshots *snapshots.Service
	Volumes   interface {
		Get(name string) (*volume.Volume, error)
	}
	Claims corelisters.PersistentVolumeClaimLister
	// PVs tells which claim really holds a PV (its claimRef).
	PVs     corelisters.PersistentVolumeLister
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
	bind, _, _ := unstructured.NestedString(u.Object, "spec", "source", "snapshotName")
	me := ownerOf(u, bind != "")
	snapName, snap, owner, err := o.find(ctx, u, bind)
	if err != nil {
		return false, err
	}
	by := "k8s:volumesnapshot " + key
	if u.GetDeletionTimestamp() != nil {
		if !slices.Contains(u.GetFinalizers(), snapshotFinalizer) {
			return false, nil
		}
		switch {
		case owner == nil || !owner.Is(&me):
			// Not this object's (another's, or an operator's): kept.
		case owner.Bound:
			// Bound to an existing snapshot: released, and kept.
			if err := o.Snapshots.Release(ctx, snapName, me); err != nil {
				return false, err
			}
		default:
			if snap.Phase != snapshots.Deleting {
				if _, err := o.Snapshots.DeleteOwned(ctx, snapName, by, me); err != nil && !errors.Is(err, snapshots.ErrNotFound) {
					return false, err
				}
			}
			return true, o.status(ctx, api, u, snap, "")
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
	if bind != "" {
		// Pre-provisioned: an existing snapshot, made this object's if it
		// is no other's (creating such an object takes the admission
		// policy's admin on volumes).
		if snapName == "" {
			return false, o.status(ctx, api, u, snapshots.Snapshot{Phase: snapshots.Failed},
				fmt.Sprintf("spec.source.snapshotName: snapshot %s not found (salt-volumes snapshot ls lists them)", bind))
		}
		if owner == nil {
			snap, err = o.Snapshots.Bind(ctx, snapName, me, nil)
			if errors.Is(err, snapshots.ErrNotFound) {
				return true, nil
			}
			if errors.Is(err, snapshots.ErrNotOwner) {
				return false, o.status(ctx, api, u, snapshots.Snapshot{Phase: snapshots.Failed}, "spec.source.snapshotName: "+notOwnerMsg(err))
			}
			if err != nil {
				return false, err
			}
			o.Log.Info("snapshot bound to its VolumeSnapshot object", "snapshot", snapName, "object", key, "uid", me.UID)
		} else if !owner.Is(&me) {
			return false, o.status(ctx, api, u, snapshots.Snapshot{Phase: snapshots.Failed},
				fmt.Sprintf("spec.source.snapshotName: snapshot %s belongs to %s: a snapshot is bound to one object at a time", bind, owner))
		}
		return snap.Phase == snapshots.Pending || snap.Phase == snapshots.Deleting, o.status(ctx, api, u, snap, snap.Message)
	}
	if snapName != "" && !owner.Is(&me) {
		// The name is taken (by another object, or through the API):
		// refused, never taken over.
		return false, o.status(ctx, api, u, snapshots.Snapshot{Phase: snapshots.Failed},
			fmt.Sprintf("snapshot %s exists and belongs to %s, not to this object: nothing was taken (delete and re-create this object, or ask an operator)", snapName, owner))
	}
	if snapName == "" {
		snapName = SnapshotName(ns, name)
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
		snap, _, err = o.Snapshots.TakeOwned(ctx, v, snapName, by, cow, me)
		var se *snapshots.Error
		if errors.As(err, &se) {
			msg := se.Msg
			if se.Field == "size" {
				msg = "spec.copyOnWriteSize" + strings.TrimPrefix(msg, "size")
			}
			return false, failed(msg)
		}
		if err != nil {
			return false, err
		}
	}
	return snap.Phase == snapshots.Pending || snap.Phase == snapshots.Deleting, o.status(ctx, api, u, snap, snap.Message)
}

// find is the snapshot object u stands for, and its owner: the one it
// binds (bind), else its own (SnapshotName), else the one its status
// names if that is u's (or u's by the name before SnapshotName, which it
// adopts). snapName "" and no error: none yet.
func (o *SnapshotObjects) find(ctx context.Context, u *unstructured.Unstructured, bind string) (snapName string, snap snapshots.Snapshot, owner *snapshots.Owner, err error) {
	ns, name := u.GetNamespace(), u.GetName()
	look := func(n string) (bool, error) {
		snap, owner, err = o.Snapshots.Lookup(ctx, n)
		if errors.Is(err, snapshots.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		snapName = n
		return true, nil
	}
	if bind != "" {
		_, err = look(bind)
		return snapName, snap, owner, err
	}
	if ok, err := look(SnapshotName(ns, name)); ok || err != nil {
		return snapName, snap, owner, err
	}
	me := ownerOf(u, false)
	st, _, _ := unstructured.NestedString(u.Object, "status", "snapshot")
	if st == "" {
		st = legacyName(ns, name)
	}
	ok, err := look(st)
	switch {
	case err != nil:
		return "", snapshots.Snapshot{}, nil, err
	case !ok:
		return "", snapshots.Snapshot{}, nil, nil
	case owner.Is(&me):
		return snapName, snap, owner, nil
	case owner == nil && st == legacyName(ns, name):
		// Taken for this object before snapshots had owners.
		key := ns + "/" + name
		snap, err = o.Snapshots.Bind(ctx, st, me, func(s snapshots.Snapshot) bool { return s.RequestedBy == "k8s:volumesnapshot "+key })
		if err == nil {
			o.Log.Info("snapshot of a VolumeSnapshot object adopted: taken before snapshots had owners", "snapshot", st, "object", key, "uid", me.UID)
			return st, snap, &me, nil
		}
		if !errors.Is(err, snapshots.ErrNotOwner) && !errors.Is(err, snapshots.ErrNotFound) {
			return "", snapshots.Snapshot{}, nil, err
		}
	}
	// Someone else's: this object's own is SnapshotName's, not there yet.
	return "", snapshots.Snapshot{}, nil, nil
}

// notOwnerMsg is an ErrNotOwner's message without its prefix.
func notOwnerMsg(err error) string {
	return strings.TrimPrefix(err.Error(), snapshots.ErrNotOwner.Error()+": ")
}

// source is the volume the object asks a snapshot of: its namespace's
// claim's, or (spec.source.volume, which the admission policy keeps to
// those with admin on volumes) any volume of ours.
func (o *SnapshotObjects) source(u *unstructured.Unstructured, ns string) (*volume.Volume, string) {
	claim, _, _ := unstructured.NestedString(u.Object, "spec", "source", "persistentVolumeClaimName")
	name, _, _ := unstructured.NestedString(u.Object, "spec", "source", "volume")
	if claim == "" && name == "" {
		return nil, "spec.source: give persistentVolumeClaimName (a claim of this namespace), volume or snapshotName"
	}
	if claim != "" {
		pvc, err := o.Claims.PersistentVolumeClaims(ns).Get(claim)
		if err != nil {
			return nil, fmt.Sprintf("spec.source.persistentVolumeClaimName: claim %s not found in namespace %s", claim, ns)
		}
		held, ok := heldVolume(o.PVs, pvc)
		if !ok {
			return nil, fmt.Sprintf("spec.source.persistentVolumeClaimName: claim %s is not bound to its PersistentVolume yet: create the snapshot once it is", claim)
		}
		name = held
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
