// Package volume is the control plane's model of a volume: its phases, the
// rules for when it may be deleted, and how a Salt job return settles it.
package volume

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Phase is where a volume is in its life.
type Phase string

const (
	// Unknown: created, not yet seen by the reconciler (no status).
	Unknown     Phase = ""
	Pending     Phase = "Pending"
	Available   Phase = "Available"
	Failed      Phase = "Failed"
	Terminating Phase = "Terminating"
)

func (p Phase) String() string {
	if p == Unknown {
		return "Unknown"
	}
	return string(p)
}

// MarshalJSON spells the empty phase "Unknown" for API users.
func (p Phase) MarshalJSON() ([]byte, error) { return json.Marshal(p.String()) }

func (p *Phase) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == "Unknown" {
		s = ""
	}
	*p = Phase(s)
	return nil
}

// Status is what the control plane knows about a volume on its node.
type Status struct {
	Phase          Phase     `json:"phase"`
	Reason         string    `json:"reason,omitempty"`
	Message        string    `json:"message,omitempty"`
	JobID          string    `json:"jobId,omitempty"`
	Step           string    `json:"step,omitempty"`
	DeviceName     string    `json:"deviceName,omitempty"`
	DevicePath     string    `json:"devicePath,omitempty"`
	PersistentPath string    `json:"persistentPath,omitempty"`
	Size           int64     `json:"size,omitempty"`
	InUse          bool      `json:"inUse,omitempty"`
	UpdatedAt      time.Time `json:"updatedAt,omitempty"`
	// JobStartedAt is when JobID was launched (job latency, job timeout).
	JobStartedAt time.Time `json:"jobStartedAt,omitempty"`
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
	// Origin is "salt" for a volume first seen in the return of a state
	// run someone else started (salt-call, orchestrate); empty for ours.
	Origin string `json:"origin,omitempty"`
}

// Clone returns a deep copy.
func (v *Volume) Clone() *Volume {
	c := *v
	c.Spec.MkfsOptions = append([]string(nil), v.Spec.MkfsOptions...)
	if v.Spec.SparseLoopDevice != nil {
		s := *v.Spec.SparseLoopDevice
		c.Spec.SparseLoopDevice = &s
	}
	if v.Spec.RawBlockDevice != nil {
		r := *v.Spec.RawBlockDevice
		c.Spec.RawBlockDevice = &r
	}
	return &c
}

// CanDelete applies the deletion criteria: no decision without a status,
// none while creation or deletion is running, none while the device is in
// use. Available and Failed volumes can be deleted.
func CanDelete(v *Volume) (bool, string) {
	switch v.Status.Phase {
	case Unknown:
		return false, "the volume has no status yet; wait for the first reconciliation"
	case Pending:
		return false, "the volume is being prepared; wait until it is Available or Failed"
	case Terminating:
		return false, "the volume is already being deleted"
	}
	if v.Status.InUse {
		return false, "the volume is in use on " + v.Spec.Node + " (mounted or held); release it first"
	}
	return true, ""
}

// Outcome is what a job return says about a volume.
type Outcome struct {
	OK      bool
	Message string // the first failing state's comment, or Salt's error
	Device  map[string]any
	// Retryable marks a run that did not happen (another state run was in
	// progress), as opposed to one that failed.
	Retryable bool
}

// ParseStateReturn reads the return of state.apply salt_volumes.prepared or
// .unprepared for one minion: retcode 0 with a dict of states is success; a
// list is a render error; a dict with result false names the failing state.
func ParseStateReturn(retcode int, ret any) Outcome {
	switch r := ret.(type) {
	case map[string]any:
		type st struct {
			order   float64
			comment string
			ok      bool
			volume  map[string]any
		}
		var sts []st
		for _, v := range r {
			m, ok := v.(map[string]any)
			if !ok {
				continue
			}
			s := st{ok: m["result"] == true}
			s.order, _ = m["__run_num__"].(float64)
			if n, ok := m["__run_num__"].(int64); ok {
				s.order = float64(n)
			}
			s.comment, _ = m["comment"].(string)
			s.volume, _ = m["volume"].(map[string]any)
			sts = append(sts, s)
		}
		sort.Slice(sts, func(i, j int) bool { return sts[i].order < sts[j].order })
		out := Outcome{OK: retcode == 0}
		for _, s := range sts {
			if s.volume != nil && out.Device == nil {
				out.Device = s.volume
			}
			if !s.ok && out.Message == "" && !strings.HasPrefix(s.comment, "One or more requisite failed") {
				out.Message = s.comment
				out.OK = false
			}
		}
		if !out.OK && out.Message == "" {
			out.Message = fmt.Sprintf("state run failed with retcode %d", retcode)
		}
		return out
	case []any:
		var msgs []string
		for _, m := range r {
			msgs = append(msgs, fmt.Sprint(m))
		}
		msg := strings.Join(msgs, "; ")
		if strings.Contains(msg, "no attribute 'salt_volumes.") {
			msg += " (the salt_volumes modules are not on the minion: run salt <node> saltutil.sync_all)"
		}
		return Outcome{Message: "the state did not render: " + msg, Retryable: strings.Contains(msg, "is running as PID")}
	case string:
		return Outcome{Message: r, Retryable: strings.Contains(r, "is running as PID")}
	case nil:
		return Outcome{Message: fmt.Sprintf("the minion returned nothing (retcode %d)", retcode)}
	}
	b, _ := json.Marshal(ret)
	return Outcome{Message: "unexpected state return: " + string(b)}
}

// CheckDevice validates device info from a state return before anything
// (the store, a PersistentVolume) uses it: the persistent path must be the
// one the volume's own UUID names, the device a clean path under /dev, and
// the size positive. A node that returns anything else is not describing
// this volume.
func CheckDevice(s *spec.Spec, d map[string]any) error {
	str := func(k string) string { v, _ := d[k].(string); return v }
	if want := s.PersistentPath(); str("persistentPath") != want {
		return fmt.Errorf("persistentPath %q is not %s", str("persistentPath"), want)
	}
	if u := str("uuid"); u != "" && u != s.UUID {
		return fmt.Errorf("uuid %q is not the volume's %s", u, s.UUID)
	}
	p := str("devicePath")
	if !strings.HasPrefix(p, "/dev/") || path.Clean(p) != p || strings.ContainsAny(p, " \t\n\x00") {
		return fmt.Errorf("devicePath %q is not a clean path under /dev", p)
	}
	if n := str("deviceName"); n == "" || strings.ContainsAny(n, "/ \t\n\x00") || n == "." || n == ".." {
		return fmt.Errorf("deviceName %q is not a kernel device name", n)
	}
	var st Status
	st.ApplyDevice(d)
	if st.Size <= 0 {
		return fmt.Errorf("size %d is not positive", st.Size)
	}
	return nil
}

// ApplyDevice copies device info from a state return into the status.
func (s *Status) ApplyDevice(d map[string]any) {
	str := func(k string) string { v, _ := d[k].(string); return v }
	s.DeviceName, s.DevicePath, s.PersistentPath = str("deviceName"), str("devicePath"), str("persistentPath")
	switch n := d["size"].(type) {
	case float64:
		s.Size = int64(n)
	case int64:
		s.Size = n
	case uint64:
		s.Size = int64(n)
	}
	s.InUse, _ = d["inUse"].(bool)
}

// StateResult is what one salt_volumes state in a state run did.
type StateResult struct {
	Volume   string // the state's name: the volume name
	Function string // prepared, unprepared, restored
	OK       bool
	Comment  string
	Device   map[string]any
	Spec     map[string]any
}

// StateResults finds the salt_volumes states in any state run's return
// (salt-call, orchestrate, ours), keyed "salt_volumes_|-<id>_|-<name>_|-<fun>".
func StateResults(ret any) []StateResult {
	m, ok := ret.(map[string]any)
	if !ok {
		return nil
	}
	var out []StateResult
	for key, v := range m {
		parts := strings.Split(key, "_|-")
		if len(parts) != 4 || parts[0] != "salt_volumes" {
			continue
		}
		st, ok := v.(map[string]any)
		if !ok {
			continue
		}
		r := StateResult{Volume: parts[2], Function: parts[3], OK: st["result"] == true}
		if r.Function == "absent" {
			r.Function = "unprepared" // salt_volumes.unprepared is an alias of absent
		}
		r.Comment, _ = st["comment"].(string)
		r.Device, _ = st["volume"].(map[string]any)
		r.Spec, _ = st["spec"].(map[string]any)
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Volume < out[j].Volume })
	return out
}

// AdoptedSpec is the spec of a volume prepared by someone else's state run:
// the normalised spec the prepared state returns next to the device info.
func AdoptedSpec(node string, r StateResult) (*spec.Spec, error) {
	if r.Spec == nil {
		return nil, fmt.Errorf("volume %s: the state return carries no spec (salt_volumes older than the control plane?)", r.Volume)
	}
	b, err := json.Marshal(r.Spec)
	if err != nil {
		return nil, err
	}
	s, err := spec.Parse(bytes.NewReader(b))
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
