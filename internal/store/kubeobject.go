package store

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// The Volume resource (deploy/kubernetes/volume-crd.yaml).
var VolumeResource = schema.GroupVersionResource{Group: "salt-volumes.io", Version: "v1alpha1", Resource: "volumes"}

const (
	volumeAPIVersion = "salt-volumes.io/v1alpha1"
	// Finalizer keeps a Volume object until its storage is reclaimed (or
	// forgotten): a kubectl delete marks it, the control plane finishes it.
	Finalizer = "salt-volumes.io/volume"
	// WipeAnnotation set to "true" before a kubectl delete asks the removal
	// to erase a raw volume's signatures (the REST API's wipe=true).
	WipeAnnotation = "salt-volumes.io/wipe"
)

// objectSpec is a Volume object's spec: the volume contract itself (the
// same type, so a field added to it is carried, never dropped), without
// the name (metadata.name) and with uuid optional (metadata.uid
// otherwise). The outer fields shadow the contract's in JSON.
type objectSpec struct {
	spec.Spec
	Name json.RawMessage `json:"name,omitempty"`
	UUID string          `json:"uuid,omitempty"`
}

// objectStatus is what people and tools read (kubectl get, printer
// columns, conditions) and, in Record, the control plane's own copy of
// the volume's status and requests, which it reads back as they were.
type objectStatus struct {
	Phase            string                        `json:"phase,omitempty"`
	Kind             string                        `json:"kind,omitempty"`
	Reason           string                        `json:"reason,omitempty"`
	Message          string                        `json:"message,omitempty"`
	Step             string                        `json:"step,omitempty"`
	Progress         *saltvolumes.Progress         `json:"progress,omitempty"`
	Job              string                        `json:"job,omitempty"`
	DeviceName       string                        `json:"deviceName,omitempty"`
	DevicePath       string                        `json:"devicePath,omitempty"`
	PersistentPath   string                        `json:"persistentPath,omitempty"`
	Size             int64                         `json:"size,omitempty"`
	SizeQuantity     string                        `json:"sizeQuantity,omitempty"`
	UUID             string                        `json:"uuid,omitempty"`
	PersistentVolume *saltvolumes.PersistentVolume `json:"persistentVolume,omitempty"`
	Conditions       []metav1.Condition            `json:"conditions,omitempty"`
	Record           *objectRecord                 `json:"record,omitempty"`
}

// objectRecord is the volume record as the other backends store it (the
// same type, so a field added to a volume is kept in Volume-objects mode
// too), but for the spec, which is the object's own: the outer Spec
// shadows the volume's in JSON. What the object's metadata says (a
// deletion marked by kubectl, the wipe annotation) is read from there.
type objectRecord struct {
	volume.Volume
	Spec json.RawMessage `json:"spec,omitempty"`
}

type volumeObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       objectSpec        `json:"spec"`
	Status     *objectStatus     `json:"status,omitempty"`
}

// readyCondition is the Ready condition of a volume in a phase.
func readyCondition(v *volume.Volume) metav1.Condition {
	c := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: string(v.Status.Phase), Message: v.Status.Message}
	switch v.Status.Phase {
	case volume.Available:
		c.Status, c.Reason = metav1.ConditionTrue, "Available"
	case volume.Unknown:
		c.Reason = "Accepted"
	}
	if v.Status.Reason != "" {
		c.Reason = v.Status.Reason
	}
	step := v.Status.Step
	switch {
	case c.Message != "":
	case !v.DeleteRequested || v.Status.Phase == volume.Terminating || strings.HasPrefix(step, "deletion"):
		c.Message = step
	case v.Status.Phase == volume.Unknown || v.Status.Phase == volume.Pending:
		c.Message = "deletion requested: it starts once the creation ends"
	case step != "":
		c.Message = "deletion requested: " + step
	default:
		c.Message = "deletion requested"
	}
	return c
}

// objectStatusOf is the status written for v. prev is the condition the
// object carries now: its transition time stays while Ready's status does.
func objectStatusOf(v *volume.Volume, prev []metav1.Condition, now time.Time) *objectStatus {
	st := v.Status
	os := &objectStatus{
		Phase: string(st.Phase), Reason: st.Reason, Message: st.Message, Step: st.Step, Progress: st.Progress, Job: st.JobID,
		DeviceName: st.DeviceName, DevicePath: st.DevicePath, PersistentPath: st.PersistentPath,
		Size: st.Size, UUID: v.Spec.UUID, PersistentVolume: st.PersistentVolume,
		Record: &objectRecord{Volume: *v},
	}
	if os.Phase == "" {
		os.Phase = string(volume.Pending) // Unknown: accepted, not started
	}
	switch {
	case v.Spec.SparseLoopDevice != nil:
		os.Kind = "sparse"
		os.SizeQuantity = string(v.Spec.SparseLoopDevice.Size)
	case v.Spec.RawBlockDevice != nil:
		os.Kind = "raw"
	case v.Spec.LVMLogicalVolume != nil:
		os.Kind = "lvm"
		os.SizeQuantity = string(v.Spec.LVMLogicalVolume.Size)
	}
	if os.SizeQuantity == "" && st.Size > 0 {
		// A raw device's size as kubectl prints quantities (32Mi, not
		// 33554432).
		os.SizeQuantity = resource.NewQuantity(st.Size, resource.BinarySI).String()
	}
	c := readyCondition(v)
	c.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
	for _, p := range prev {
		if p.Type == c.Type && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
	}
	os.Conditions = []metav1.Condition{c}
	return os
}

// newObject is the object created for v (its status is written after,
// through the status subresource).
func newObject(v *volume.Volume) *unstructured.Unstructured {
	o := volumeObject{APIVersion: volumeAPIVersion, Kind: "Volume",
		Metadata: metav1.ObjectMeta{Name: v.Spec.Name, Finalizers: []string{Finalizer}},
		Spec:     specOf(&v.Spec)}
	return mustUnstructured(o)
}

func specOf(s *spec.Spec) objectSpec {
	return objectSpec{Spec: *s, UUID: s.UUID}
}

func mustUnstructured(o any) *unstructured.Unstructured {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err) // plain structs of strings, numbers and maps
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// withStatus is a copy of u carrying v's status.
func withStatus(u *unstructured.Unstructured, v *volume.Volume, now time.Time) *unstructured.Unstructured {
	c := u.DeepCopy()
	var prev []metav1.Condition
	if o, err := decodeObject(u); err == nil && o.Status != nil {
		prev = o.Status.Conditions
	}
	c.Object["status"] = mustUnstructured(objectStatusOf(v, prev, now)).Object
	return c
}

func decodeObject(u *unstructured.Unstructured) (*volumeObject, error) {
	b, err := json.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	var o volumeObject
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, err
	}
	return &o, nil
}

// revisionOf reads a resourceVersion: etcd's revision, which the API
// server hands out as a decimal string.
func revisionOf(rv string) (int64, error) {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resourceVersion %q is not a number: this API server's storage is not etcd", rv)
	}
	return n, nil
}

// volumeFromObject is the volume an object describes. An object no
// control plane has written yet (kubectl apply) is a new volume: phase
// Unknown, created at its creationTimestamp.
func volumeFromObject(u *unstructured.Unstructured) (*volume.Volume, error) {
	o, err := decodeObject(u)
	if err != nil {
		return nil, fmt.Errorf("volume %q: %v", u.GetName(), err)
	}
	rev, err := revisionOf(o.Metadata.ResourceVersion)
	if err != nil {
		return nil, fmt.Errorf("volume %q: %v", u.GetName(), err)
	}
	v := &volume.Volume{}
	if o.Status != nil && o.Status.Record != nil {
		*v = o.Status.Record.Volume
	} else {
		v.CreatedAt = o.Metadata.CreationTimestamp.UTC()
		v.Status.UpdatedAt = v.CreatedAt
	}
	v.Revision, v.Spec = rev, o.Spec.Spec
	v.Spec.Name, v.Spec.UUID = o.Metadata.Name, o.Spec.UUID
	if v.Spec.UUID == "" {
		// As MetalK8s does: the object's own uid, unique by construction.
		v.Spec.UUID = string(o.Metadata.UID)
	}
	if o.Metadata.DeletionTimestamp != nil {
		// kubectl delete: the object is marked; the control plane carries
		// the deletion out and lets the object go.
		v.DeleteRequested = true
		v.DeletionMarked = true
		if o.Metadata.Annotations[WipeAnnotation] == "true" {
			v.Wipe = true
		}
	}
	return v, nil
}

func hasFinalizer(u *unstructured.Unstructured) bool {
	return slices.Contains(u.GetFinalizers(), Finalizer)
}

// hasRecord tells whether a control plane wrote the object's status.
func hasRecord(u *unstructured.Unstructured) bool {
	_, ok, _ := unstructured.NestedMap(u.Object, "status", "record")
	return ok
}
