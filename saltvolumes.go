// Package saltvolumes is the contract every part of salt-volumes speaks:
// the volume spec, what a node reports about a volume (Device), the phases
// of a volume, the API's views, events and errors, and the error codes.
// It holds types and small rules only; the node engine, the reconciler, the
// HTTP server, the client and the CLIs live in internal/ and cmd/ around it.
package saltvolumes

import (
	"fmt"
	"path"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Spec is the volume spec (internal/spec parses and validates it).
type Spec = spec.Spec

// Device is what a node reports about one volume: salt-volume-exec's JSON
// document, and the `volume` key of the prepared state's return, which is
// how it reaches the control plane.
type Device struct {
	Name           string   `json:"name"`
	UUID           string   `json:"uuid"`
	Type           string   `json:"type,omitempty"`
	Mode           string   `json:"mode,omitempty"`
	FSType         string   `json:"fsType,omitempty"`
	Size           int64    `json:"size"`
	DevicePath     string   `json:"devicePath,omitempty"`
	DeviceName     string   `json:"deviceName,omitempty"`
	PersistentPath string   `json:"persistentPath,omitempty"`
	BackingFile    string   `json:"backingFile,omitempty"`
	State          string   `json:"state"`
	InUse          bool     `json:"inUse"`
	Mountpoints    []string `json:"mountpoints,omitempty"`
	Holders        []string `json:"holders,omitempty"`
	// Allocated is what a sparse file really takes on the node's disk.
	Allocated int64 `json:"allocated,omitempty"`
	// FSUsed and FSFree are the volume's own filesystem, when it is
	// mounted on the node.
	FSUsed   int64    `json:"fsUsed,omitempty"`
	FSFree   int64    `json:"fsFree,omitempty"`
	Changed  bool     `json:"changed"`
	Warnings []string `json:"warnings,omitempty"`
	Error    string   `json:"error,omitempty"`
	// Wiped says how a --wipe was checked: every byte of Device zeroed,
	// then the blocks at Offsets (drawn from Seed) read back as zeros.
	Wiped *WipeCheck `json:"wiped,omitempty"`
}

// WipeCheck is the evidence of a verified wipe.
type WipeCheck struct {
	Device  string  `json:"device"`
	Bytes   int64   `json:"bytes"`
	Seed    uint64  `json:"seed"`
	Offsets []int64 `json:"offsets"`
}

// Capacity is what a node's sparse volumes may use: the filesystem that
// holds the sparse files (Size, Free) and the sum of the sizes of every
// sparse file on it that is ours, with the data their snapshots keep
// (Committed). OvercommitRatio is the node's
// limit: a new sparse volume is refused when Committed would exceed
// OvercommitRatio x Size.
type Capacity struct {
	Path            string  `json:"path"`
	Size            int64   `json:"size"`
	Free            int64   `json:"free"`
	Committed       int64   `json:"committed"`
	OvercommitRatio float64 `json:"overcommitRatio"`
	// Snapshots kept in the node's state dir (on the same filesystem as
	// the sparse files, when the state dir holds them), and the bytes
	// their images really use.
	Snapshots     int   `json:"snapshots,omitempty"`
	SnapshotBytes int64 `json:"snapshotBytes,omitempty"`
	// SnapshotWarnings: LVM snapshots close to overflowing their
	// copy-on-write space or thin pool (80 % and up), or lost to it, one
	// line each naming the snapshot and what to do.
	SnapshotWarnings []string `json:"snapshotWarnings,omitempty"`
	// StaleFreezes: mounted sparse volumes' filesystems that a snapshot
	// run and its freeze watchdog both ended with frozen, not known
	// thawed since (writes there may wait): each also has a line in
	// SnapshotWarnings naming what to do.
	StaleFreezes int `json:"staleFreezes,omitempty"`
	// ThinPools: the LVM thin pools holding volumes, snapshots or clones
	// of ours, and how full their data and metadata are.
	ThinPools []ThinPool `json:"thinPools,omitempty"`
	// VGs: the node's LVM volume groups and their free space, where an
	// LVM volume may go (empty without LVM's tools).
	VGs []VGSpace `json:"vgs,omitempty"`
	// Disks: block devices a raw volume could take: unused, and carrying
	// nothing the node's probe recognises (the create still checks with
	// libblkid and refuses what it finds).
	Disks []Disk `json:"disks,omitempty"`
}

// VGSpace is one LVM volume group's size and free space, in bytes.
type VGSpace struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	Free int64  `json:"free"`
}

// Disk is a block device a raw volume could take.
type Disk struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	Model string `json:"model,omitempty"`
}

// ThinPool is how full one LVM thin pool (vg/pool) is, in percent. A pool
// whose data or metadata fills stops taking writes: every thin LV in it
// errors them.
type ThinPool struct {
	Name            string  `json:"name"`
	DataPercent     float64 `json:"dataPercent"`
	MetadataPercent float64 `json:"metadataPercent"`
}

// Check validates device info that came from a node before anything (the
// store, a PersistentVolume) uses it: the persistent path must be the one
// the volume's own UUID names, the device a clean path under /dev, and the
// size positive. A node that returns anything else is not describing s.
func (d *Device) Check(s *Spec) error {
	if d == nil {
		return fmt.Errorf("no device info")
	}
	if !s.MatchesPersistentPath(d.PersistentPath) {
		want := s.PersistentPath()
		if want == "" {
			want = spec.DMUUIDLinkPrefix + "LVM-<the LV's UUID>"
		}
		return fmt.Errorf("persistentPath %q is not %s", d.PersistentPath, want)
	}
	if d.UUID != "" && d.UUID != s.UUID {
		return fmt.Errorf("uuid %q is not the volume's %s", d.UUID, s.UUID)
	}
	p := d.DevicePath
	if !strings.HasPrefix(p, "/dev/") || path.Clean(p) != p || strings.ContainsAny(p, " \t\n\x00") {
		return fmt.Errorf("devicePath %q is not a clean path under /dev", p)
	}
	if n := d.DeviceName; n == "" || strings.ContainsAny(n, "/ \t\n\x00") || n == "." || n == ".." {
		return fmt.Errorf("deviceName %q is not a kernel device name", n)
	}
	if d.Size <= 0 {
		return fmt.Errorf("size %d is not positive", d.Size)
	}
	return nil
}

// ReasonWipeUnverified is the reason of a volume whose --wipe could not be
// done or proven. The node's message starts with it followed by ": ": Salt's
// state comment carries the node's message, not its error code.
const ReasonWipeUnverified = "WipeUnverified"

// Error codes of API answers (Error.Code).
const (
	CodeInvalid         = "invalid"          // 400: the field is named
	CodeUnauthorized    = "unauthorized"     // 401
	CodeForbidden       = "forbidden"        // 403: who asked may not do this; the message names the role or grant missing
	CodeNotFound        = "not_found"        // 404
	CodeExists          = "exists"           // 409: name or uuid taken
	CodeDeleteForbidden = "delete_forbidden" // 409: the deletion criteria say no, with the reason
	CodeResizeForbidden = "resize_forbidden" // 409: the volume cannot grow now, with the reason
	CodeLimit           = "limit"            // 429/503: a limit of the control plane
	CodeSnapshot        = "snapshot_refused" // 409/422: no snapshot of this volume now, with the reason and the fix
	CodeBusy            = "busy"             // 409: the volume kept changing under the request; nothing was recorded, ask again
	CodeInternal        = "internal"         // 500
	CodeUnavailable     = "unavailable"      // 503: the store (etcd) is out of reach; retry
)
