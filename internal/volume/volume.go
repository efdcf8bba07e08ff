// Package volume is the control plane's model of a volume: its phases, the
// rules for when it may be deleted, and how a Salt job return settles it.
package volume

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Phase is where a volume is in its life (the contract's Phase).
type Phase = saltvolumes.Phase

const (
	Unknown     = saltvolumes.Unknown
	Pending     = saltvolumes.Pending
	Available   = saltvolumes.Available
	Failed      = saltvolumes.Failed
	Terminating = saltvolumes.Terminating
	Locked      = saltvolumes.Locked
)

// Status is what the control plane knows about a volume on its node: what
// the API shows, plus the reconciler's own bookkeeping.
type Status struct {
	saltvolumes.Status
	// JobStartedAt is when JobID was launched (job latency, job timeout).
	JobStartedAt time.Time `json:"jobStartedAt,omitempty"`
	// Publishing marks a Pending volume whose storage is ready on its node
	// and whose PersistentVolume is still to be created (Kubernetes mode):
	// it becomes Available once the PV exists.
	Publishing bool `json:"publishing,omitempty"`
	// PreparedSize is the sparse size (bytes) the volume's last successful
	// prepare had: a spec asking for more (a Volume object edited with
	// kubectl) is a growth to carry out.
	PreparedSize int64 `json:"preparedSize,omitempty"`
	// Growing marks the prepare run a resize asked for (for a raw volume
	// the spec does not change: its device grew), until it returns.
	Growing bool `json:"growing,omitempty"`
}

// Volume is one volume object.
type Volume struct {
	Spec      spec.Spec `json:"spec"`
	Status    Status    `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
	// DeleteRequested marks a deletion the reconciler has not finished.
	DeleteRequested bool `json:"deleteRequested,omitempty"`
	// Wipe asks the deletion to erase the volume's signatures on a raw device.
	Wipe bool `json:"wipe,omitempty"`
	// ForgetRequested asks the reconciler to drop a Failed volume without
	// running anything on its node (kept in the store so that the replica
	// that reconciles carries out what another one accepted).
	ForgetRequested bool `json:"forgetRequested,omitempty"`
	// NodeForgotten marks a forget asked for by draining the volume's node
	// (salt-volumes node forget): it applies whatever the phase, as the
	// node is gone for good and nothing will ever run there.
	NodeForgotten bool `json:"nodeForgotten,omitempty"`
	// Origin is OriginSalt for a volume first seen in the return of a
	// state run someone else started (salt-call, orchestrate); empty for
	// ours.
	Origin string `json:"origin,omitempty"`
	// Claim is the PersistentVolumeClaim the volume was provisioned for.
	Claim *saltvolumes.Claim `json:"claim,omitempty"`
	// RequestedBy names who asked for the change last requested (create,
	// deletion, growth) as the audit names them: the Salt jobs that carry
	// it out say so in their metadata.
	RequestedBy string `json:"requestedBy,omitempty"`
	// DeletionMarked says the store's object itself is marked for
	// deletion (Kubernetes: kubectl delete set its deletionTimestamp): the
	// deletion cannot be dropped, only waited for, and the store sets it.
	DeletionMarked bool `json:"-"`
	// Revision is the store's revision of this copy (not stored: the
	// backend assigns it); updates and deletes are guarded by it.
	Revision int64 `json:"-"`
}

// Clone returns a deep copy.
func (v *Volume) Clone() *Volume {
	c := *v
	c.Spec.MkfsOptions = append([]string(nil), v.Spec.MkfsOptions...)
	c.Spec.Template = v.Spec.Template.Clone()
	if v.Spec.SparseLoopDevice != nil {
		s := *v.Spec.SparseLoopDevice
		c.Spec.SparseLoopDevice = &s
	}
	if v.Spec.RawBlockDevice != nil {
		r := *v.Spec.RawBlockDevice
		c.Spec.RawBlockDevice = &r
	}
	if v.Spec.LVMLogicalVolume != nil {
		l := *v.Spec.LVMLogicalVolume
		c.Spec.LVMLogicalVolume = &l
	}
	if v.Spec.Source != nil {
		src := *v.Spec.Source
		c.Spec.Source = &src
	}
	if v.Status.PersistentVolume != nil {
		pv := *v.Status.PersistentVolume
		c.Status.PersistentVolume = &pv
	}
	if v.Claim != nil {
		cl := *v.Claim
		c.Claim = &cl
	}
	return &c
}

// View is the volume as the API shows it.
func (v *Volume) View() saltvolumes.View {
	ok, why := CanDelete(v)
	if v.DeleteRequested {
		ok, why = false, "the volume is already being deleted"
		if creating(v) {
			why = "deletion requested: it starts once the creation ends"
		}
	}
	return saltvolumes.View{
		Spec: v.Spec, Status: v.Status.Status, CreatedAt: v.CreatedAt, Origin: v.Origin, Claim: v.Claim,
		Deleting: v.DeleteRequested, Deletable: ok, DeleteBlockedReason: why,
	}
}

// CanDelete applies the deletion criteria: none while a deletion runs,
// none while the device is in use, none while its PersistentVolume is Bound
// or Pending (a claim holds it, or Kubernetes has not settled it). A volume
// still being created (Unknown, Pending) may be deleted: the deletion is
// recorded and starts once the creation ends, whatever its outcome (seed
// 000; refusing it left users waiting, or a volume Pending for good in
// MetalK8s #2409).
func CanDelete(v *Volume) (bool, string) {
	if v.Status.Phase == Terminating {
		return false, "the volume is already being deleted"
	}
	if v.Status.InUse {
		return false, "the volume is in use on " + v.Spec.Node + " (mounted or held); release it first"
	}
	if pv := v.Status.PersistentVolume; pv != nil {
		switch pv.Phase {
		case "Bound":
			return false, fmt.Sprintf("its PersistentVolume %s is Bound to %s: delete that claim (and the pods using it) first", pv.Name, pv.Claim)
		case "Pending":
			return false, fmt.Sprintf("its PersistentVolume %s is Pending: wait until Kubernetes makes it Available", pv.Name)
		}
	}
	return true, ""
}

// creating tells whether v's creation has not ended yet: no status, or
// Pending before its storage was ready.
func creating(v *Volume) bool {
	return v.Status.Phase == Unknown || v.Status.Phase == Pending && !v.Status.Publishing
}

// CreationRunning tells whether v waits for the return of the state run
// that creates it: a deletion requested meanwhile starts after that.
func CreationRunning(v *Volume) bool {
	return v.Status.Phase == Pending && v.Status.JobID != "" && !v.Status.Publishing
}

// Outcome is what a job return says about a volume.
type Outcome struct {
	OK      bool
	Message string // the first failing state's comment, or Salt's error
	Device  *saltvolumes.Device
	// Retryable marks a run that did not happen (another state run was in
	// progress), as opposed to one that failed.
	Retryable bool
	// ModulesMissing: the run did not render because the salt_volumes
	// modules are not on the minion (a new minion cache: a reinstalled
	// node), which saltutil.sync_all mends.
	ModulesMissing bool
}

// stateEntry is one state's result in a state run's return.
type stateEntry struct {
	Result  *bool               `json:"result"`
	Comment json.RawMessage     `json:"comment"`
	RunNum  float64             `json:"__run_num__"`
	Volume  *saltvolumes.Device `json:"volume"`
	Spec    json.RawMessage     `json:"spec"`
}

func (e stateEntry) ok() bool { return e.Result != nil && *e.Result }

// comment reads a state comment, which Salt gives as a string or a list.
func (e stateEntry) comment() string {
	var s string
	if json.Unmarshal(e.Comment, &s) == nil {
		return s
	}
	var l []string
	if json.Unmarshal(e.Comment, &l) == nil {
		return strings.Join(l, "; ")
	}
	return ""
}

// states decodes a state run's return: a map of state keys to results.
// ok is false when the return is not such a map.
func states(raw json.RawMessage) (map[string]stateEntry, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil, false
	}
	out := make(map[string]stateEntry, len(m))
	for k, v := range m {
		var e stateEntry
		if json.Unmarshal(v, &e) == nil {
			out[k] = e
		}
	}
	return out, true
}

// ParseStateReturn reads one minion's return of state.apply
// salt_volumes.prepared or .unprepared, as the job cache holds it (JSON):
// retcode 0 with a map of states is success; a list is a render error; a
// state with result false names the failure.
func ParseStateReturn(retcode int, raw json.RawMessage) Outcome {
	if sts, ok := states(raw); ok {
		entries := make([]stateEntry, 0, len(sts))
		for _, e := range sts {
			entries = append(entries, e)
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].RunNum < entries[j].RunNum })
		out := Outcome{OK: retcode == 0}
		for _, e := range entries {
			if e.Volume != nil && out.Device == nil {
				out.Device = e.Volume
			}
			if c := e.comment(); !e.ok() && out.Message == "" && !strings.HasPrefix(c, "One or more requisite failed") {
				out.Message = c
				out.OK = false
			}
		}
		if !out.OK && out.Message == "" {
			out.Message = fmt.Sprintf("state run failed with retcode %d", retcode)
		}
		return out
	}
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return Outcome{Message: fmt.Sprintf("the minion returned nothing (retcode %d)", retcode)}
	}
	var list []any
	if json.Unmarshal(raw, &list) == nil {
		msgs := make([]string, 0, len(list))
		for _, m := range list {
			msgs = append(msgs, fmt.Sprint(m))
		}
		msg := strings.Join(msgs, "; ")
		missing := strings.Contains(msg, "no attribute 'salt_volumes.")
		if missing {
			msg += " (the salt_volumes modules are not on the minion: run salt <node> saltutil.sync_all)"
		}
		return Outcome{Message: "the state did not render: " + msg, Retryable: strings.Contains(msg, "is running as PID"), ModulesMissing: missing}
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		// A minion without our modules answers that the function "is
		// not available".
		if strings.Contains(str, "'salt_volumes.") && strings.Contains(str, "is not available") {
			return Outcome{Message: str + " (the salt_volumes modules are not on the minion: run salt <node> saltutil.sync_all)", ModulesMissing: true}
		}
		return Outcome{Message: str, Retryable: strings.Contains(str, "is running as PID")}
	}
	return Outcome{Message: "unexpected state return: " + string(raw)}
}

// OutcomeFor reads what a state run did to the named volume. A run that
// prepared several volumes of one node fails for each only by that
// volume's own state; a run that never reached the states (a render
// error, a busy minion) or has no state of this volume is read whole.
func OutcomeFor(name string, retcode int, raw json.RawMessage) Outcome {
	sts, ok := states(raw)
	if ok {
		for key, e := range sts {
			if n, _, isOurs := stateKey(key); isOurs && n == name {
				out := Outcome{OK: e.ok(), Device: e.Volume}
				if !out.OK {
					if out.Message = e.comment(); out.Message == "" {
						out.Message = fmt.Sprintf("the state of volume %s failed (retcode %d)", name, retcode)
					}
				}
				return out
			}
		}
	}
	return ParseStateReturn(retcode, raw)
}

// ApplyDevice copies device info from a node into the status.
func (s *Status) ApplyDevice(d *saltvolumes.Device) {
	if d == nil {
		return
	}
	s.DeviceName, s.DevicePath, s.PersistentPath = d.DeviceName, d.DevicePath, d.PersistentPath
	s.Size, s.InUse = d.Size, d.InUse
}

// StateResult is what one salt_volumes state in a state run did.
type StateResult struct {
	Volume   string // the state's name: the volume name
	Function string // prepared, unprepared, restored
	OK       bool
	Comment  string
	Device   *saltvolumes.Device
	Spec     json.RawMessage
}

// stateKey splits "salt_volumes_|-<id>_|-<name>_|-<fun>"; ok is false for
// other modules' states.
func stateKey(key string) (name, fun string, ok bool) {
	parts := strings.Split(key, "_|-")
	if len(parts) != 4 || parts[0] != "salt_volumes" {
		return "", "", false
	}
	fun = parts[3]
	if fun == "absent" {
		fun = "unprepared" // salt_volumes.unprepared is an alias of absent
	}
	return parts[2], fun, true
}

// StateResults finds the salt_volumes states in any state run's return
// (salt-call, orchestrate, ours), as the job cache holds it.
func StateResults(raw json.RawMessage) []StateResult {
	sts, _ := states(raw)
	var out []StateResult
	for key, e := range sts {
		name, fun, ok := stateKey(key)
		if !ok {
			continue
		}
		out = append(out, StateResult{Volume: name, Function: fun, OK: e.ok(), Comment: e.comment(), Device: e.Volume, Spec: e.Spec})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Volume < out[j].Volume })
	return out
}

// StateNames lists the volumes a state run's return names, read from a
// decoded bus event. The names only say which volumes to look up in the
// job cache; nothing else of a bus event is used.
func StateNames(ret any) []string {
	m, _ := ret.(map[string]any)
	var out []string
	for key := range m {
		if name, _, ok := stateKey(key); ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// OriginSalt marks an adopted volume (Volume.Origin).
const OriginSalt = "salt"

// AdoptedSpec is the spec of a volume prepared by someone else's state run:
// the normalised spec the prepared state returns next to the device info,
// read as strictly as a user's.
func AdoptedSpec(node string, r StateResult) (*spec.Spec, error) {
	if len(r.Spec) == 0 || string(r.Spec) == "null" {
		return nil, fmt.Errorf("volume %s: the state return carries no spec (salt_volumes older than the control plane?)", r.Volume)
	}
	s, err := spec.Parse(bytes.NewReader(r.Spec))
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", r.Volume, err)
	}
	if s.Node == "" {
		s.Node = node
	}
	if s.Node != node {
		return nil, fmt.Errorf("volume %s: spec node %q but returned by %q", r.Volume, s.Node, node)
	}
	return s, nil
}
