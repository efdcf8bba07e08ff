package kube

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Annotations the PV controller and the scheduler set on claims.
const (
	annSelectedNode    = "volume.kubernetes.io/selected-node"
	annProvisioner     = "volume.kubernetes.io/storage-provisioner"
	annBetaProvisioner = "volume.beta.kubernetes.io/storage-provisioner"
	annProvisionedBy   = "pv.kubernetes.io/provisioned-by"
)

// StorageClass parameters we understand; any other is refused, so a typo
// never falls back to a default.
const (
	paramFSType      = "fsType"
	paramMkfsOptions = "mkfsOptions"
	paramMode        = "mode"
	paramEncryption  = "encryption"
)

// claimDecision is what to do with one claim.
type claimDecision struct {
	// Wait: not ours, or not ready yet (no node selected): nothing to say.
	Wait bool
	// Refuse: ours, but we cannot provision it: said as a Warning event on
	// the claim, and not retried until the claim changes.
	Refuse string
	Spec   *spec.Spec
	Claim  *saltvolumes.Claim
	Size   string // what was asked, for the event
}

// decideClaim is the whole provisioning decision for a claim of class sc,
// given the Salt minion the selected node maps to. It never provisions
// what does not match the claim: no selectors, no data sources but ours
// (the source itself is resolved by withSource), no access mode a local
// volume cannot honour.
func decideClaim(pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass, provisioner, minion string) claimDecision {
	if pvc.Spec.VolumeName != "" || pvc.DeletionTimestamp != nil {
		return claimDecision{Wait: true}
	}
	if sc == nil || sc.Provisioner != provisioner {
		return claimDecision{Wait: true}
	}
	if p := pvc.Annotations[annProvisioner]; p != provisioner && pvc.Annotations[annBetaProvisioner] != provisioner {
		// The PV controller names the provisioner once it wants one
		// (for WaitForFirstConsumer, after the scheduler picked a node).
		return claimDecision{Wait: true}
	}
	if pvc.Spec.Selector != nil {
		return claimDecision{Refuse: "salt-volumes cannot provision a claim with a selector (it could not honour the labels): remove spec.selector, or create a volume and bind it with spec.volumeName"}
	}
	if refuse := checkSource(pvc); refuse != "" {
		return claimDecision{Refuse: refuse}
	}
	if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		return claimDecision{Refuse: fmt.Sprintf("StorageClass %s: set volumeBindingMode: WaitForFirstConsumer: a local volume is made on the node the scheduler picks for the pod", sc.Name)}
	}
	node := pvc.Annotations[annSelectedNode]
	if node == "" {
		return claimDecision{Wait: true}
	}
	if minion == "" {
		return claimDecision{Refuse: fmt.Sprintf("node %s (selected by the scheduler) is not a Salt minion salt-volumes knows", node)}
	}
	for _, m := range pvc.Spec.AccessModes {
		if m != corev1.ReadWriteOnce && m != corev1.ReadWriteOncePod {
			return claimDecision{Refuse: fmt.Sprintf("access mode %s: a local volume is on one node only: use ReadWriteOnce or ReadWriteOncePod", m)}
		}
	}
	mode := spec.ModeFilesystem
	if pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		mode = spec.ModeBlock
	}
	s := &spec.Spec{Name: "pvc-" + string(pvc.UID), UUID: string(pvc.UID), Node: minion, Mode: mode}
	var unknown []string
	for k, v := range sc.Parameters {
		switch k {
		case paramFSType:
			s.FSType = v
		case paramMkfsOptions:
			s.MkfsOptions = strings.Fields(v)
		case paramEncryption:
			if v == spec.ProviderMaster {
				// Its key must be in pillar under the volume's name before
				// the volume is made; a claim's volume is named as it is
				// provisioned.
				return claimDecision{Refuse: fmt.Sprintf("StorageClass %s parameter encryption=master: a master key is put in pillar (salt_volumes:keys:NAME) before its volume is made, and a claim's volume gets its name only now: use encryption=keyfile, or a Volume made from pillar or the API with its key", sc.Name)}
			}
			s.Encryption = &spec.Encryption{Provider: v}
		case paramMode:
			if v != mode {
				return claimDecision{Refuse: fmt.Sprintf("StorageClass %s parameter mode=%s but the claim asks for volumeMode %s: use a class without mode, or set the claim's volumeMode", sc.Name, v, mode)}
			}
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return claimDecision{Refuse: fmt.Sprintf("StorageClass %s: unknown parameter(s) %s: salt-volumes knows fsType, mkfsOptions, mode and encryption", sc.Name, strings.Join(unknown, ", "))}
	}
	if mode == spec.ModeBlock && (s.FSType != "" || len(s.MkfsOptions) > 0) {
		return claimDecision{Refuse: fmt.Sprintf("StorageClass %s: fsType and mkfsOptions apply to Filesystem claims only; this claim asks for volumeMode Block", sc.Name)}
	}
	req, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok || req.Sign() <= 0 {
		return claimDecision{Refuse: "spec.resources.requests.storage: missing: say how much storage the claim needs"}
	}
	size, err := sparseSizeFor(s, req.Value())
	if err != nil {
		return claimDecision{Refuse: err.Error()}
	}
	s.SparseLoopDevice = &spec.SparseLoopDevice{Size: spec.Size(fmt.Sprint(size))}
	if err := s.Validate(); err != nil {
		return claimDecision{Refuse: fmt.Sprintf("StorageClass %s: %v", sc.Name, strings.Replace(err.Error(), "mkfsOptions", "parameter mkfsOptions", 1))}
	}
	policy := string(corev1.PersistentVolumeReclaimDelete)
	if sc.ReclaimPolicy != nil {
		policy = string(*sc.ReclaimPolicy)
	}
	return claimDecision{Spec: s, Size: req.String(), Claim: &saltvolumes.Claim{
		Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID), StorageClass: sc.Name, ReclaimPolicy: policy,
	}}
}

// sparseSizeFor is the size of the sparse file whose usable size is at
// least want bytes: for a Block volume the GPT and the 1 MiB alignment take
// their share, for xfs and tiny volumes the filesystem's minimum applies.
// Sizes are whole MiB.
func sparseSizeFor(s *spec.Spec, want int64) (int64, error) {
	const mib = 1 << 20
	size := (want + mib - 1) / mib * mib
	if s.Encryption != nil {
		// The container's header comes first: the filesystem (or the
		// opened device, which has no table of ours) gets the rest, at
		// least what the claim asked.
		if s.Mode == spec.ModeBlock {
			return max(size, spec.MinBlockSize) + spec.LUKSHeaderBytes, nil
		}
		fs := *s
		fs.Encryption = nil
		inner, err := sparseSizeFor(&fs, want)
		return inner + spec.LUKSHeaderBytes, err
	}
	switch {
	case s.Mode == spec.ModeBlock:
		size = max(size, spec.MinBlockSize)
		for {
			// The partition must hold want bytes whatever the loop
			// device's logical sector size.
			_, l512, err512 := gpt.Extent(size, 512)
			_, l4k, err4k := gpt.Extent(size, 4096)
			if err512 == nil && err4k == nil && l512 >= want && l4k >= want {
				return size, nil
			}
			size += mib
		}
	case s.FSType == spec.FSXFS:
		return max(size, spec.MinXFSSize), nil
	default:
		return max(size, spec.MinFilesystemSize), nil
	}
}

// reprovision tells why a claim's volume should be deleted and the claim
// given back to the scheduler, or "" if not. Only a refusal of the
// volume's size by its node qualifies (larger than the node's filesystem,
// or past its overcommit ratio): another node, or this one once space is
// freed, may take it. Any other failure would fail on every node, and
// stays for someone to read. A volume that was ever published, or whose
// claim is bound, going away or no longer waiting on a node, is left alone.
func reprovision(v *volume.Volume, pvc *corev1.PersistentVolumeClaim) string {
	st := v.Status
	switch {
	case v.Claim == nil || v.DeleteRequested || st.PersistentVolume != nil:
		return ""
	case st.Phase != volume.Failed || st.Reason != reconciler.ReasonPrepareFailed:
		return ""
	case !strings.Contains(st.Message, sizeField+": "):
		return ""
	case pvc == nil || string(pvc.UID) != v.Claim.UID || pvc.Spec.VolumeName != "" || pvc.DeletionTimestamp != nil:
		return ""
	case pvc.Annotations[annSelectedNode] == "":
		return ""
	}
	return fmt.Sprintf("Salt minion %s cannot hold it: %s", v.Spec.Node, st.Message)
}

// sizeField is the field the node names when it refuses a sparse volume's
// size (salt-volume-exec's messages name the field at fault).
const sizeField = "sparseLoopDevice.size"
