package kube

import (
	"errors"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// pvParams is what a volume's PersistentVolume is built from besides the
// volume itself: chosen by the controller in Kubernetes mode, by flags for
// salt-volumes pv.
type pvParams struct {
	class    string
	hostname string // the node's kubernetes.io/hostname label
	policy   corev1.PersistentVolumeReclaimPolicy
	mount    []string
	access   []corev1.PersistentVolumeAccessMode
	// managed: the control plane's own PV (Kubernetes mode), selected by
	// its label and held by its finalizer until the storage is gone.
	// Without it, a static PV (salt-volumes pv) that nothing watches.
	managed bool
	// claim and provisioner: a claim's volume, bound to it from the start.
	claim       *saltvolumes.Claim
	provisioner string
}

// publishable refuses a PV for storage the node has not described: the
// path is handed to kubelet, which mounts it as root, so it must be the
// one the volume's own UUID names, whatever a node claimed.
func publishable(s *spec.Spec, st saltvolumes.Status) error {
	if !s.MatchesPersistentPath(st.PersistentPath) || st.Size <= 0 {
		return fmt.Errorf("the node reported path %q and size %d; a PV needs the link its UUID names (or, for a Block volume on an LV, the LV's %s link) and a size",
			st.PersistentPath, st.Size, spec.DMUUIDLinkPrefix)
	}
	return nil
}

// buildPV is the one PersistentVolume builder: the volume's persistent path
// (by-uuid, by-partuuid or the LV's link, which survive reboots and device
// renames), its size, its template's metadata under ours, and node affinity
// by matchExpressions on kubernetes.io/hostname, because the scheduler
// ignores matchFields on PVs (kubernetes#81725).
func buildPV(s *spec.Spec, st saltvolumes.Status, p pvParams) (*corev1.PersistentVolume, error) {
	if err := publishable(s, st); err != nil {
		return nil, err
	}
	if p.class == "" {
		p.class = DefaultStorageClass
	}
	if p.hostname == "" {
		p.hostname = s.Node
	}
	if !labelValue.MatchString(p.hostname) {
		return nil, fmt.Errorf("hostname %q is not a valid kubernetes.io/hostname value: pass the node's label with --hostname", p.hostname)
	}
	switch p.policy {
	case "":
		p.policy = corev1.PersistentVolumeReclaimRetain
	case corev1.PersistentVolumeReclaimRetain, corev1.PersistentVolumeReclaimDelete:
	default:
		return nil, fmt.Errorf("reclaim policy %q: use Retain or Delete", p.policy)
	}
	if len(p.access) == 0 {
		p.access = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	mode := corev1.PersistentVolumeFilesystem
	if s.Mode == spec.ModeBlock {
		if len(p.mount) > 0 {
			return nil, errors.New("mount options: a Block volume is not mounted")
		}
		mode = corev1.PersistentVolumeBlock
	}
	pv := &corev1.PersistentVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Labels: map[string]string{}},
	}
	// The volume's template first, ours over it: validation refuses a
	// template naming our keys, and ours decide which PVs are ours.
	if t := s.Template; t != nil {
		maps.Copy(pv.Labels, t.Metadata.Labels)
		pv.Annotations = maps.Clone(t.Metadata.Annotations)
	}
	maps.Copy(pv.Labels, map[string]string{LabelUUID: s.UUID, LabelNode: s.Node})
	if p.managed {
		pv.Labels[LabelManagedBy] = ManagedBy
		pv.Finalizers = []string{Finalizer}
	}
	if cl := p.claim; cl != nil {
		if pv.Annotations == nil {
			pv.Annotations = map[string]string{}
		}
		pv.Annotations[annProvisionedBy] = p.provisioner
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
			Namespace: cl.Namespace, Name: cl.Name, UID: types.UID(cl.UID)}
	}
	pv.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(st.Size, resource.BinarySI)}
	pv.Spec.VolumeMode = &mode
	pv.Spec.AccessModes = p.access
	pv.Spec.PersistentVolumeReclaimPolicy = p.policy
	pv.Spec.StorageClassName = p.class
	local := &corev1.LocalVolumeSource{Path: st.PersistentPath}
	if mode == corev1.PersistentVolumeFilesystem {
		// The path is a block device: kubelet mounts it with this type.
		fs := s.FSType
		local.FSType = &fs
		pv.Spec.MountOptions = p.mount
	}
	pv.Spec.Local = local
	pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{p.hostname}}},
	}}}}
	return pv, nil
}

// build is the PV the controller publishes for a volume whose storage is
// ready: ours, for its claim if it has one, on the Kubernetes node its
// minion maps to.
func (c *Controller) build(v *volume.Volume) (*corev1.PersistentVolume, error) {
	node, err := c.cfg.Nodes.NodeName(v.Spec.Node)
	if err != nil {
		return nil, err
	}
	p := pvParams{class: c.cfg.StorageClass, hostname: node, managed: true}
	if n, err := c.nodes.Get(node); err == nil && n.Labels[corev1.LabelHostname] != "" {
		p.hostname = n.Labels[corev1.LabelHostname]
	}
	if cl := v.Claim; cl != nil {
		p.class, p.policy = cl.StorageClass, corev1.PersistentVolumeReclaimPolicy(cl.ReclaimPolicy)
		p.claim, p.provisioner = cl, c.cfg.Provisioner
		if pvc, err := c.pvcs.PersistentVolumeClaims(cl.Namespace).Get(cl.Name); err == nil && len(pvc.Spec.AccessModes) > 0 {
			p.access = pvc.Spec.AccessModes
		}
	}
	if v.Spec.Mode == spec.ModeFilesystem {
		if sc, err := c.classes.Get(p.class); err == nil {
			p.mount = sc.MountOptions
		}
	}
	return buildPV(&v.Spec, v.Status.Status, p)
}

// NewPersistentVolume is the static PV of an Available volume, for kubectl
// apply (salt-volumes pv, without Kubernetes mode): the same builder as
// the controller's, without our managed-by label and finalizer.
func NewPersistentVolume(v saltvolumes.View, o Options) (*corev1.PersistentVolume, error) {
	if v.Status.Phase != saltvolumes.Available {
		return nil, fmt.Errorf("volume %s is %s: a PersistentVolume needs an Available volume (its persistent path and size come from the node)", v.Spec.Name, v.Status.Phase)
	}
	if !v.Spec.MatchesPersistentPath(v.Status.PersistentPath) {
		return nil, fmt.Errorf("volume %s: its persistent path %q is not the one its UUID names: refusing to publish it", v.Spec.Name, v.Status.PersistentPath)
	}
	return buildPV(&v.Spec, v.Status, pvParams{class: o.StorageClass, hostname: o.Hostname,
		policy: corev1.PersistentVolumeReclaimPolicy(o.ReclaimPolicy), mount: o.MountOptions})
}
