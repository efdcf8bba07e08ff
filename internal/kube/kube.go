// Package kube turns an Available volume into the Kubernetes objects that
// expose it: a local PersistentVolume pinned to the volume's node, and the
// StorageClass such volumes belong to. It writes manifests only; it never
// talks to a Kubernetes API server.
package kube

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"regexp"

	"go.yaml.in/yaml/v3"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// DefaultStorageClass is the class name the guide and the CLI use.
const DefaultStorageClass = "salt-volumes"

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

type matchExpression struct {
	Key      string   `yaml:"key"`
	Operator string   `yaml:"operator"`
	Values   []string `yaml:"values"`
}

type nodeSelectorTerm struct {
	MatchExpressions []matchExpression `yaml:"matchExpressions"`
}

type pvSpec struct {
	Capacity      map[string]string `yaml:"capacity"`
	VolumeMode    string            `yaml:"volumeMode"`
	AccessModes   []string          `yaml:"accessModes"`
	ReclaimPolicy string            `yaml:"persistentVolumeReclaimPolicy"`
	StorageClass  string            `yaml:"storageClassName"`
	MountOptions  []string          `yaml:"mountOptions,omitempty"`
	Local         struct {
		Path   string `yaml:"path"`
		FSType string `yaml:"fsType,omitempty"`
	} `yaml:"local"`
	NodeAffinity struct {
		Required struct {
			NodeSelectorTerms []nodeSelectorTerm `yaml:"nodeSelectorTerms"`
		} `yaml:"required"`
	} `yaml:"nodeAffinity"`
}

// PersistentVolume is a v1 PersistentVolume object.
type PersistentVolume struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   meta   `yaml:"metadata"`
	Spec       pvSpec `yaml:"spec"`
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

// NewPersistentVolume builds the PV for an Available volume. The path is the
// persistent one (by-uuid or by-partuuid), which survives reboots and device
// renames; the node affinity uses matchExpressions on kubernetes.io/hostname
// because the scheduler ignores matchFields there (kubernetes#81725).
func NewPersistentVolume(v saltvolumes.View, o Options) (*PersistentVolume, error) {
	if v.Status.Phase != saltvolumes.Available || v.Status.PersistentPath == "" || v.Status.Size <= 0 {
		return nil, fmt.Errorf("volume %s is %s: a PersistentVolume needs an Available volume (its persistent path and size come from the node)", v.Spec.Name, v.Status.Phase)
	}
	// A PV hands its path to kubelet, which mounts it as root: it must be
	// the path the volume's own UUID names, whatever a node claimed.
	if !v.Spec.MatchesPersistentPath(v.Status.PersistentPath) {
		return nil, fmt.Errorf("volume %s: its persistent path %q is not the one its UUID names: refusing to publish it", v.Spec.Name, v.Status.PersistentPath)
	}
	if o.StorageClass == "" {
		o.StorageClass = DefaultStorageClass
	}
	if o.Hostname == "" {
		o.Hostname = v.Spec.Node
	}
	if !labelValue.MatchString(o.Hostname) {
		return nil, fmt.Errorf("hostname %q is not a valid kubernetes.io/hostname value: pass the node's label with --hostname", o.Hostname)
	}
	switch o.ReclaimPolicy {
	case "":
		o.ReclaimPolicy = "Retain"
	case "Retain", "Delete":
	default:
		return nil, fmt.Errorf("reclaim policy %q: use Retain or Delete", o.ReclaimPolicy)
	}
	pv := &PersistentVolume{APIVersion: "v1", Kind: "PersistentVolume"}
	pv.Metadata = meta{Name: v.Spec.Name, Labels: map[string]string{}}
	if t := v.Spec.Template; t != nil {
		maps.Copy(pv.Metadata.Labels, t.Metadata.Labels)
		pv.Metadata.Annotations = maps.Clone(t.Metadata.Annotations)
	}
	pv.Metadata.Labels["salt-volumes.io/node"] = o.Hostname
	pv.Metadata.Labels["salt-volumes.io/uuid"] = v.Spec.UUID
	pv.Spec.Capacity = map[string]string{"storage": spec.FormatSize(v.Status.Size)}
	pv.Spec.VolumeMode = v.Spec.Mode
	pv.Spec.AccessModes = []string{"ReadWriteOnce"}
	pv.Spec.ReclaimPolicy = o.ReclaimPolicy
	pv.Spec.StorageClass = o.StorageClass
	pv.Spec.Local.Path = v.Status.PersistentPath
	if v.Spec.Mode == spec.ModeFilesystem {
		// The path is a block device: kubelet mounts it with this type.
		pv.Spec.Local.FSType = v.Spec.FSType
		pv.Spec.MountOptions = o.MountOptions
	} else if len(o.MountOptions) > 0 {
		return nil, errors.New("mount options: a Block volume is not mounted")
	}
	pv.Spec.NodeAffinity.Required.NodeSelectorTerms = []nodeSelectorTerm{{
		MatchExpressions: []matchExpression{{Key: "kubernetes.io/hostname", Operator: "In", Values: []string{o.Hostname}}},
	}}
	return pv, nil
}

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
// prints them.
func Marshal(obj any) ([]byte, error) {
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
