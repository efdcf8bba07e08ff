// Package volume is the control plane's model of a volume: its phases, the
// rules for when it may be deleted, and how a Salt job return settles it.
package volume

import (
	"encoding/json"
	"fmt"
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
}

// Volume is one volume object.
type Volume struct {
	Spec      spec.Spec `json:"spec"`
	Status    Status    `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
	// DeleteRequested marks a deletion the reconciler has not finished.
	DeleteRequested bool `json:"deleteRequested,omitempty"`
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
		return Outcome{Message: "the state did not render: " + msg, Retryable: strings.Contains(msg, "is running as PID")}
	case string:
		return Outcome{Message: r, Retryable: strings.Contains(r, "is running as PID")}
	case nil:
		return Outcome{Message: fmt.Sprintf("the minion returned nothing (retcode %d)", retcode)}
	}
	b, _ := json.Marshal(ret)
	return Outcome{Message: "unexpected state return: " + string(b)}
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
