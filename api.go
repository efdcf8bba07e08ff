package saltvolumes

import (
	"encoding/json"
	"time"
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
	// Locked: an encrypted volume whose container is on its node, whole,
	// but not open: its data is there and unreadable until the volume's
	// key opens it (Reason and Message say what the node lacks).
	Locked Phase = "Locked"
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

// Status is what the API shows of a volume's state on its node.
type Status struct {
	Phase   Phase  `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	JobID   string `json:"jobId,omitempty"`
	Step    string `json:"step,omitempty"`
	// Progress is how far the step has come, for the steps that move
	// data (a clone's copy, a wipe's zeroing): bytes done of total.
	Progress       *Progress `json:"progress,omitempty"`
	DeviceName     string    `json:"deviceName,omitempty"`
	DevicePath     string    `json:"devicePath,omitempty"`
	PersistentPath string    `json:"persistentPath,omitempty"`
	Size           int64     `json:"size,omitempty"`
	InUse          bool      `json:"inUse,omitempty"`
	UpdatedAt      time.Time `json:"updatedAt,omitempty"`
	// PersistentVolume is the volume's PV, in Kubernetes mode once it has
	// been created.
	PersistentVolume *PersistentVolume `json:"persistentVolume,omitempty"`
}

// Progress is a long step's advance, as its node last reported it.
type Progress struct {
	// Step is the step it is of: a progress whose step is no longer the
	// volume's is dropped when the volume is saved.
	Step string `json:"step"`
	// Done and Total are bytes: copied of the data to copy, zeroed of
	// the device.
	Done  int64 `json:"done"`
	Total int64 `json:"total"`
}

// PersistentVolume is what the API shows of a volume's Kubernetes
// PersistentVolume, read from the API server's watch.
type PersistentVolume struct {
	Name string `json:"name"`
	// Phase is the PV's: Pending, Available, Bound, Released or Failed.
	Phase string `json:"phase"`
	// Claim is namespace/name of the claim it is bound to (or was, when
	// Released).
	Claim string `json:"claim,omitempty"`
	// Terminating is set once the PV is being deleted.
	Terminating bool `json:"terminating,omitempty"`
}

// Claim is the PersistentVolumeClaim a volume was provisioned for.
type Claim struct {
	Namespace    string `json:"namespace"`
	Name         string `json:"name"`
	UID          string `json:"uid"`
	StorageClass string `json:"storageClass"`
	// ReclaimPolicy is the class's: Delete removes the volume with its
	// claim, Retain keeps it.
	ReclaimPolicy string `json:"reclaimPolicy"`
}

// View is a volume as the API shows it: spec, status, and what the deletion
// criteria say now, so that clients never offer a deletion that will be
// refused. It is not the stored record (internal/volume), which also keeps
// the reconciler's bookkeeping.
type View struct {
	Spec      Spec      `json:"spec"`
	Status    Status    `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
	Origin    string    `json:"origin,omitempty"` // "salt": first seen in someone else's state run
	// Claim is set on volumes provisioned for a PersistentVolumeClaim.
	Claim *Claim `json:"claim,omitempty"`
	// Usage is the volume's health and usage as its node last reported
	// them (the salt_volumes beacon); absent until the node reports.
	Usage               *Usage `json:"usage,omitempty"`
	Deleting            bool   `json:"deleting,omitempty"`
	Deletable           bool   `json:"deletable"`
	DeleteBlockedReason string `json:"deleteBlockedReason,omitempty"`
}

// Watch event types.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
)

// Event is one record of the watch stream.
type Event struct {
	Type   string `json:"type"`
	Volume View   `json:"volume"`
}

// Node is a Salt minion and its volumes.
type Node struct {
	Name    string         `json:"name"`
	Up      bool           `json:"up"`
	Volumes int            `json:"volumes"`
	Phases  map[string]int `json:"phases"`
	// Capacity is the node's sparse capacity as its beacon last reported
	// it; Health says when that was.
	Capacity *Capacity   `json:"capacity,omitempty"`
	Health   *NodeHealth `json:"health,omitempty"`
}

// NodeHealth is what the control plane knows of a node's beacon.
type NodeHealth struct {
	LastReport time.Time `json:"lastReport"`
	// Interval and Heartbeat are the beacon's, in seconds, as it reports
	// them: a node with nothing to report still fires every Heartbeat.
	Interval  float64 `json:"interval"`
	Heartbeat float64 `json:"heartbeat"`
	// Silent: no report for more than three heartbeats. Phases are not
	// changed for it: a silent node may only have lost its master link.
	Silent bool `json:"silent"`
	// Error is set when the node could not list its volumes.
	Error string `json:"error,omitempty"`
	// Orphans are storage of ours that no record on the node claims. They
	// are listed, never deleted automatically.
	Orphans []Device `json:"orphans,omitempty"`
	// Restores counts, since the control plane started, what restore runs
	// on the node rebuilt and failed to rebuild.
	Restored      int `json:"restored,omitempty"`
	RestoreFailed int `json:"restoreFailed,omitempty"`
}

// Usage is a volume's health and usage as its node reports them.
type Usage struct {
	// State is the node's: prepared, detached, missing, damaged, ...
	State       string    `json:"state"`
	Size        int64     `json:"size,omitempty"`
	Allocated   int64     `json:"allocated,omitempty"`
	FSUsed      int64     `json:"fsUsed,omitempty"`
	FSFree      int64     `json:"fsFree,omitempty"`
	InUse       bool      `json:"inUse,omitempty"`
	Mountpoints []string  `json:"mountpoints,omitempty"`
	Error       string    `json:"error,omitempty"`
	ReportedAt  time.Time `json:"reportedAt"`
}

// UsageSample is one point of a volume's usage history.
type UsageSample struct {
	At        time.Time `json:"at"`
	Allocated int64     `json:"allocated"`
	FSUsed    int64     `json:"fsUsed,omitempty"`
}

// Error is the body of every API error answer: a code from the Code*
// constants, the field at fault when there is one, and a message that says
// what to do.
type Error struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Job is one state run the control plane started for a volume, with the
// steps its node reported and when (kept in memory, the last few per
// volume).
type Job struct {
	JID      string    `json:"jid"`
	SLS      string    `json:"sls"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitempty"`
	// Result is running, succeeded, failed, retried or timed out.
	Result  string    `json:"result"`
	Message string    `json:"message,omitempty"`
	Steps   []JobStep `json:"steps"`
}

// JobStep is one progress step of a job.
type JobStep struct {
	Name string    `json:"name"`
	At   time.Time `json:"at"`
}

// Snapshot is one snapshot of a volume, kept on the volume's node
// (GET /api/v1/snapshots). Phase: Pending, Ready, Failed or Deleting.
type Snapshot struct {
	Name       string `json:"name"`
	Volume     string `json:"volume"`
	VolumeUUID string `json:"volumeUUID"`
	Node       string `json:"node"`
	Phase      string `json:"phase"`
	// Method, Frozen, Size, Allocated and TakenAt are the node's answer:
	// reflink or sparse-copy, whether the mounted filesystem was frozen,
	// the image's size and the bytes it really uses.
	Method    string     `json:"method,omitempty"`
	Frozen    bool       `json:"frozen,omitempty"`
	Size      int64      `json:"size,omitempty"`
	Allocated int64      `json:"allocated,omitempty"`
	TakenAt   *time.Time `json:"takenAt,omitempty"`
	// COWSize: a thick LVM snapshot's copy-on-write space, as asked
	// (0: a quarter of the LV), then as the node set it aside; LV is the
	// snapshot's logical volume (vg/name) on its node.
	COWSize     int64  `json:"cowSize,omitempty"`
	LV          string `json:"lv,omitempty"`
	Message     string `json:"message,omitempty"`
	JobID       string `json:"jobId,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
	// For names the clone this snapshot was taken for (a claim's
	// dataSource): it is deleted once that clone is Available.
	For string `json:"for,omitempty"`
	// Schedule names the API snapshot schedule that took it (its
	// volume's name); only that schedule prunes it, and only while it
	// stays the schedule that took it.
	Schedule  string    `json:"schedule,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// Restore is the last restore of the volume from this snapshot
	// (POST /api/v1/snapshots/NAME/restore); nil: never restored.
	Restore *SnapshotRestore `json:"restore,omitempty"`
	// Progress is the copy of a snapshot being taken (Pending, its job
	// running), as its node last reported it: saved at most every 5 s
	// (a step's last report at once), gone once the job ends.
	Progress *Progress `json:"progress,omitempty"`
}

// SnapshotSchedule is a schedule of snapshots of one volume: one made
// through the API (Source "api", run by the leading control plane) or one
// of Salt's minion scheduler that a node reports (Source "salt", pillar
// salt_volumes:snapshot_schedules). Every, Keep and MaxAge are the API's
// only: a node's report does not carry them.
type SnapshotSchedule struct {
	Source   string `json:"source"`
	Schedule string `json:"schedule"`
	Volume   string `json:"volume"`
	// VolumeUUID is the volume the schedule was made for: a volume made
	// again under the name is not taken by it.
	VolumeUUID string `json:"volumeUUID,omitempty"`
	Node       string `json:"node"`
	Every      string `json:"every,omitempty"`
	Keep       int    `json:"keep,omitempty"`
	MaxAge     string `json:"maxAge,omitempty"`
	// LastSuccess is when its last snapshot was taken (nil: none yet),
	// LastSnapshot that snapshot's name.
	LastSuccess  *time.Time `json:"lastSuccess,omitempty"`
	LastSnapshot string     `json:"lastSnapshot,omitempty"`
	// Failing: its last take failed (LastError says why); Failures is how
	// many in a row (the API's only).
	Failing     bool       `json:"failing"`
	Failures    int        `json:"failures,omitempty"`
	LastError   string     `json:"lastError,omitempty"`
	LastErrorAt *time.Time `json:"lastErrorAt,omitempty"`
	// Taking is the snapshot its current slot is taking; NextAt when its
	// next slot begins (the API's only).
	Taking string     `json:"taking,omitempty"`
	NextAt *time.Time `json:"nextAt,omitempty"`
	// Overdue: no success within twice its interval plus a minute (a
	// node's schedule, whose interval is not reported: its last run
	// failed).
	Overdue   bool       `json:"overdue"`
	CreatedBy string     `json:"createdBy,omitempty"`
	CreatedAt *time.Time `json:"createdAt,omitempty"`
}

// SnapshotRestore is a volume put back to a snapshot in place: who asked,
// when, and how it ended. Phase: Restoring (its job runs), Restored or
// Failed (Message says why; the volume was left as it was).
type SnapshotRestore struct {
	Phase       string     `json:"phase"`
	RequestedBy string     `json:"requestedBy,omitempty"`
	RequestedAt time.Time  `json:"requestedAt"`
	FinishedAt  *time.Time `json:"finishedAt,omitempty"`
	JobID       string     `json:"jobId,omitempty"`
	Message     string     `json:"message,omitempty"`
	// Method, SameDevice, Took and Warnings are the node's answer: how
	// the image was copied, whether the volume kept its loop device.
	Method     string   `json:"method,omitempty"`
	SameDevice bool     `json:"sameDevice,omitempty"`
	Took       string   `json:"took,omitempty"`
	Warnings   []string `json:"warnings,omitempty"`
	// SnapshotConsumed: the restore used the snapshot up (a thick LVM
	// snapshot merges into its volume and is gone); its record goes a
	// moment later.
	SnapshotConsumed bool `json:"snapshotConsumed,omitempty"`
	// Progress is the restore's copy (Restoring, its job running), as
	// the node last reported it: saved at most every 5 s (a step's last
	// report at once), gone once the job ends.
	Progress *Progress `json:"progress,omitempty"`
}
