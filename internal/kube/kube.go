// Package kube is salt-volumes' Kubernetes side. In Kubernetes mode its
// controller publishes each Available volume as a local PersistentVolume
// pinned to the volume's node, provisions and expands claims of our
// classes, and reports on claims with Events (controller.go and the files
// beside it). Without Kubernetes mode it renders the same PersistentVolume,
// and StorageClasses, as manifests for kubectl (salt-volumes pv,
// salt-volumes storageclass).
package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/runtime"
)

// DefaultStorageClass is the class name the guide and the CLI use for the
// class claims are provisioned from (salt-volumes storageclass).
const DefaultStorageClass = "salt-volumes"

// DefaultStaticClass is the class of the PVs of volumes made with the CLI,
// the REST API, the UI or Volume objects in Kubernetes mode (serve's
// kubernetes.storageClass): a class of their own, which no provisioning
// class shares, so that a claim of a provisioning class never binds one,
// even naming it; deploy/kubernetes/claims-policy.yaml keeps tenants'
// claims out of it.
const DefaultStaticClass = "salt-volumes-static"

// Options shape the PersistentVolume.
type Options struct {
	StorageClass string // default DefaultStorageClass
	// Hostname is the node's kubernetes.io/hostname label when it differs
	// from the Salt minion id; default the volume's node.
	Hostname string
	// ReclaimPolicy is Retain (default) or Delete. Nothing deletes the
	// storage on Delete: there is no provisioner, so Retain says the truth.
	ReclaimPolicy string
	MountOptions  []string
}

type meta struct {
	Name        string            `yaml:"name"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// StorageClass is a storage.k8s.io/v1 StorageClass object.
type StorageClass struct {
	APIVersion        string            `yaml:"apiVersion"`
	Kind              string            `yaml:"kind"`
	Metadata          meta              `yaml:"metadata"`
	Provisioner       string            `yaml:"provisioner"`
	Parameters        map[string]string `yaml:"parameters,omitempty"`
	VolumeBindingMode string            `yaml:"volumeBindingMode"`
	ReclaimPolicy     string            `yaml:"reclaimPolicy"`
	MountOptions      []string          `yaml:"mountOptions,omitempty"`
}

// ClassOptions shape a StorageClass.
type ClassOptions struct {
	Name string
	// Static: no provisioner (PVs made with salt-volumes pv, no Kubernetes
	// mode) and Retain.
	Static        bool
	Provisioner   string // default DefaultProvisioner
	ReclaimPolicy string // Delete (default) or Retain
	FSType        string
	MkfsOptions   string
	MountOptions  []string
}

// Kubernetes label values: at most 63 characters of [A-Za-z0-9._-],
// starting and ending alphanumeric.
var labelValue = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)

// NewStorageClass is a class for salt-volumes PVs. Binding waits for the
// first consumer: the scheduler then picks a node that has a free volume,
// or the node salt-volumes provisions one on, instead of binding a claim
// to a volume on a node the pod cannot use.
func NewStorageClass(o ClassOptions) (*StorageClass, error) {
	if o.Name == "" {
		o.Name = DefaultStorageClass
	}
	sc := &StorageClass{APIVersion: "storage.k8s.io/v1", Kind: "StorageClass", Metadata: meta{Name: o.Name},
		VolumeBindingMode: "WaitForFirstConsumer", MountOptions: o.MountOptions}
	if o.Static {
		if o.FSType != "" || o.MkfsOptions != "" {
			return nil, errors.New("--fs-type and --mkfs-options apply to provisioned volumes: drop them with --static")
		}
		sc.Provisioner, sc.ReclaimPolicy = "kubernetes.io/no-provisioner", "Retain"
		return sc, nil
	}
	sc.Provisioner, sc.ReclaimPolicy = o.Provisioner, o.ReclaimPolicy
	if sc.Provisioner == "" {
		sc.Provisioner = DefaultProvisioner
	}
	switch sc.ReclaimPolicy {
	case "":
		sc.ReclaimPolicy = "Delete"
	case "Delete", "Retain":
	default:
		return nil, fmt.Errorf("reclaim policy %q: use Delete or Retain", o.ReclaimPolicy)
	}
	if o.FSType != "" || o.MkfsOptions != "" {
		sc.Parameters = map[string]string{}
		if o.FSType != "" {
			sc.Parameters[paramFSType] = o.FSType
		}
		if o.MkfsOptions != "" {
			sc.Parameters[paramMkfsOptions] = o.MkfsOptions
		}
	}
	return sc, nil
}

// Marshal renders an object as a YAML document, indented the way kubectl
// prints them. API objects (a PersistentVolume) go through their JSON
// form, as kubectl's own printer does, without the empty creation time
// and status a new object has.
func Marshal(obj any) ([]byte, error) {
	if _, ok := obj.(runtime.Object); ok {
		j, err := json.Marshal(obj)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(j, &m); err != nil {
			return nil, err
		}
		if md, ok := m["metadata"].(map[string]any); ok && md["creationTimestamp"] == nil {
			delete(md, "creationTimestamp")
		}
		if st, ok := m["status"].(map[string]any); ok && len(st) == 0 {
			delete(m, "status")
		}
		obj = m
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(obj); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
