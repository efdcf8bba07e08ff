// Package lvm runs the LVM tools (vgs, lvs, lvcreate, lvextend, lvchange,
// lvconvert, lvrename, lvremove) with argument lists and reads their JSON reports. It never picks what to
// act on by name alone where a UUID can say it: removal selects the LV by
// its LVM UUID.
package lvm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoVG: the volume group does not exist on this machine.
var ErrNoVG = errors.New("volume group not found")

// VG is what we read of a volume group.
type VG struct {
	Name       string
	UUID       string
	Size, Free int64
	ExtentSize int64
}

// LV is what we read of a logical volume.
type LV struct {
	Name, VG   string
	UUID       string // LVM's own UUID of the LV (with dashes)
	VGUUID     string
	Size       int64
	Tags       []string
	Active     bool
	DevicePath string // /dev/<vg>/<lv>, when active
	// Pool is the thin pool of a thin LV ("" for another LV); Origin the
	// LV a snapshot was taken of.
	Pool, Origin string
	// DataPercent: how full a thin LV or pool, or a thick snapshot's
	// copy-on-write space, is (0-100); -1 when LVM reports none.
	DataPercent float64
	// MetadataPercent: how full a thin pool's metadata is (0-100); -1 for
	// any other LV. A pool whose data or metadata fills stops taking
	// writes: every thin LV in it errors them.
	MetadataPercent float64
	// Invalid: a thick snapshot whose copy-on-write space overflowed
	// (lv_attr's state 'I'): LVM dropped it, its data is lost.
	Invalid bool
	// Created is when LVM made the LV (lv_time; zero if unreadable).
	Created time.Time

	// Read by ListAll only (lvs -a):
	//
	// Hidden: an LV lvs lists only with -a (its name in brackets there):
	// an internal one, or a snapshot LVM is merging into its origin.
	Hidden bool
	// Merging (lv_merging): an origin a snapshot merges into, at once or
	// at its next activation, or that snapshot.
	Merging bool
	// MergeFailed (lv_merge_failed): LVM says the merge failed.
	MergeFailed bool
	// ThinID is a thin LV's device id in its pool (thin_id; "" for any
	// other LV). A thin merge gives the origin its snapshot's.
	ThinID string
}

// DMUUID is the device-mapper UUID of an LV, the name udev gives its
// /dev/disk/by-id/dm-uuid-* link: "LVM-" and both UUIDs without dashes.
func (l *LV) DMUUID() string {
	return "LVM-" + strings.ReplaceAll(l.VGUUID, "-", "") + strings.ReplaceAll(l.UUID, "-", "")
}

// HasTag tells whether the LV carries tag t.
func (l *LV) HasTag(t string) bool {
	for _, x := range l.Tags {
		if x == t {
			return true
		}
	}
	return false
}

// WaitDelay is how long an LVM tool asked to stop (its context done) may
// take to end before it is killed.
var WaitDelay = 30 * time.Second

// run runs an LVM tool; its stderr goes into the error, which LVM keeps
// free of secrets.
func run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	path, err := exec.LookPath(prog)
	if err != nil {
		return nil, fmt.Errorf("%s not found: install lvm2: %w", prog, err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	// Cancelled (the exec's timeout), an LVM tool is asked to stop
	// (SIGTERM), never killed at once: LVM blocks signals in its
	// critical sections (metadata commits, device-mapper table changes)
	// and stops after them; killed only if it has not within WaitDelay.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = WaitDelay
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	// LVM warns about descriptors it inherits; none of ours are meant for it.
	cmd.Env = append(cmd.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1")
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

type report struct {
	Report []struct {
		VG []map[string]string `json:"vg"`
		LV []map[string]string `json:"lv"`
	} `json:"report"`
}

func parseReport(b []byte) (vgs, lvs []map[string]string, err error) {
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, nil, fmt.Errorf("reading an LVM report: %w", err)
	}
	for _, x := range r.Report {
		vgs = append(vgs, x.VG...)
		lvs = append(lvs, x.LV...)
	}
	return vgs, lvs, nil
}

func num(s string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return n
}

// ParseVGs reads `vgs --reportformat json` output.
func ParseVGs(b []byte) ([]VG, error) {
	rows, _, err := parseReport(b)
	if err != nil {
		return nil, err
	}
	var out []VG
	for _, r := range rows {
		out = append(out, VG{Name: r["vg_name"], UUID: r["vg_uuid"], Size: num(r["vg_size"]), Free: num(r["vg_free"]), ExtentSize: num(r["vg_extent_size"])})
	}
	return out, nil
}

// ParseLVs reads `lvs --reportformat json` output.
func ParseLVs(b []byte) ([]LV, error) {
	_, rows, err := parseReport(b)
	if err != nil {
		return nil, err
	}
	var out []LV
	for _, r := range rows {
		l := LV{Name: r["lv_name"], VG: r["vg_name"], UUID: r["lv_uuid"], VGUUID: r["vg_uuid"], Size: num(r["lv_size"]),
			Active: r["lv_active"] == "active", DevicePath: r["lv_path"], Pool: r["pool_lv"], Origin: r["origin"], DataPercent: -1, MetadataPercent: -1}
		if p, err := strconv.ParseFloat(strings.TrimSpace(r["data_percent"]), 64); err == nil {
			l.DataPercent = p
		}
		if p, err := strconv.ParseFloat(strings.TrimSpace(r["metadata_percent"]), 64); err == nil {
			l.MetadataPercent = p
		}
		if a := r["lv_attr"]; len(a) > 4 && a[4] == 'I' {
			l.Invalid = true
		}
		if n := l.Name; len(n) > 2 && n[0] == '[' && n[len(n)-1] == ']' {
			l.Name, l.Hidden = n[1:len(n)-1], true
		}
		l.Merging = binary(r["lv_merging"], "merging")
		l.MergeFailed = binary(r["lv_merge_failed"], "merge failed")
		l.ThinID = strings.TrimSpace(r["thin_id"])
		if t := r["lv_tags"]; t != "" {
			l.Tags = strings.Split(t, ",")
		}
		// LVM's default report/time_format; another one leaves it zero.
		if c, err := time.Parse("2006-01-02 15:04:05 -0700", r["lv_time"]); err == nil {
			l.Created = c.UTC()
		}
		out = append(out, l)
	}
	return out, nil
}

// binary reads one of lvs's binary fields: its word when set ("" when
// not, "unknown" when it does not apply), or 1 and 0 where LVM is set to
// report them as numbers.
func binary(v, word string) bool {
	v = strings.TrimSpace(v)
	return v == word || v == "1"
}

var units = []string{"--reportformat", "json", "--units", "b", "--nosuffix"}

// reportOn runs vgs or lvs on one volume group; ErrNoVG if there is none.
func reportOn(ctx context.Context, prog, vg, fields string) ([]byte, error) {
	b, err := run(ctx, prog, append(units, "-o", fields, vg)...)
	if err != nil && strings.Contains(err.Error(), "not found") {
		return nil, fmt.Errorf("%q: %w", vg, ErrNoVG)
	}
	return b, err
}

// ListVGs reads every volume group.
func ListVGs(ctx context.Context) ([]VG, error) {
	b, err := run(ctx, "vgs", append(units, "-o", "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size")...)
	if err != nil {
		return nil, err
	}
	return ParseVGs(b)
}

// GetVG reads one volume group; ErrNoVG if there is none by that name.
func GetVG(ctx context.Context, name string) (*VG, error) {
	b, err := reportOn(ctx, "vgs", name, "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size")
	if err != nil {
		return nil, err
	}
	vgs, err := ParseVGs(b)
	if err != nil {
		return nil, err
	}
	for i := range vgs {
		if vgs[i].Name == name {
			return &vgs[i], nil
		}
	}
	return nil, fmt.Errorf("%q: %w", name, ErrNoVG)
}

const lvFields = "lv_name,vg_name,lv_uuid,vg_uuid,lv_size,lv_tags,lv_active,lv_path,pool_lv,origin,data_percent,metadata_percent,lv_attr,lv_time"

// GetLV reads the LV named name in vg; nil if there is none.
func GetLV(ctx context.Context, vg, name string) (*LV, error) {
	b, err := reportOn(ctx, "lvs", vg, lvFields)
	if err != nil {
		return nil, err
	}
	lvs, err := ParseLVs(b)
	if err != nil {
		return nil, err
	}
	for i := range lvs {
		if lvs[i].Name == name && lvs[i].VG == vg {
			return &lvs[i], nil
		}
	}
	return nil, nil
}

// List reads every LV of every volume group on the machine.
func List(ctx context.Context) ([]LV, error) {
	b, err := run(ctx, "lvs", append(units, "-o", lvFields)...)
	if err != nil {
		return nil, err
	}
	return ParseLVs(b)
}

// allFields adds what a restore follows to lvFields. thin_id is a
// segment's field: lvs reports one row per segment then, which ListAll
// folds into one LV.
const allFields = lvFields + ",lv_merging,lv_merge_failed,thin_id"

// ListAll reads every LV of vg, the hidden ones too (lvs -a: a thin
// pool's parts, a snapshot being merged), with Merging, MergeFailed and
// ThinID; ErrNoVG if there is no such VG.
func ListAll(ctx context.Context, vg string) ([]LV, error) {
	b, err := run(ctx, "lvs", append(append([]string{"-a"}, units...), "-o", allFields, vg)...)
	if err != nil && strings.Contains(err.Error(), "not found") {
		return nil, fmt.Errorf("%q: %w", vg, ErrNoVG)
	}
	if err != nil {
		return nil, err
	}
	return ParseAll(b)
}

// ParseAll reads `lvs -a` output with segment fields: the rows of one LV
// (one per segment) are one LV, with the first thin id reported.
func ParseAll(b []byte) ([]LV, error) {
	rows, err := ParseLVs(b)
	if err != nil {
		return nil, err
	}
	var out []LV
	at := map[string]int{}
	for _, l := range rows {
		key := l.VG + "/" + l.UUID
		if l.UUID == "" {
			key = l.VG + "/" + l.Name
		}
		if i, ok := at[key]; ok {
			if out[i].ThinID == "" {
				out[i].ThinID = l.ThinID
			}
			continue
		}
		at[key] = len(out)
		out = append(out, l)
	}
	return out, nil
}

// CreateThin makes a thin LV of virtual size bytes in the thin pool
// vg/pool, carrying tag. Its blocks read as zeros until written.
func CreateThin(ctx context.Context, vg, pool, name string, size int64, tag string) error {
	_, err := run(ctx, "lvcreate", "--yes", "--wipesignatures", "n", "--activate", "y",
		"--type", "thin", "--virtualsize", strconv.FormatInt(size, 10)+"b", "--thinpool", pool,
		"--name", name, "--addtag", tag, vg)
	return err
}

// Snapshot takes a snapshot name of vg/origin carrying tags: thick, with
// cow bytes of copy-on-write space, when cow > 0; else a thin snapshot
// (the origin must be thin), which LVM leaves inactive and skips at
// activation. LVM suspends the origin meanwhile, which freezes a
// filesystem mounted on it.
func Snapshot(ctx context.Context, vg, origin, name string, cow int64, tags ...string) error {
	args := []string{"--yes", "--snapshot", "--name", name}
	if cow > 0 {
		args = append(args, "--size", strconv.FormatInt(cow, 10)+"b")
	}
	for _, t := range tags {
		args = append(args, "--addtag", t)
	}
	_, err := run(ctx, "lvcreate", append(args, vg+"/"+origin)...)
	return err
}

// Create makes a linear LV of at least size bytes (LVM rounds up to its
// extent size) carrying tag. It neither wipes signatures nor zeroes the
// start: what the extents held is the caller's to find and judge.
func Create(ctx context.Context, vg, name string, size int64, tag string) error {
	_, err := run(ctx, "lvcreate", "--yes", "--wipesignatures", "n", "--zero", "n", "--activate", "y",
		"--name", name, "--size", strconv.FormatInt(size, 10)+"b", "--addtag", tag, vg)
	return err
}

// CreateSkipped is Create for an LV that stays inactive and that LVM
// skips at activation (the boot's too) until SetActivationSkip clears
// the flag: ActivateSkipped activates it.
func CreateSkipped(ctx context.Context, vg, name string, size int64, tag string) error {
	_, err := run(ctx, "lvcreate", "--yes", "--wipesignatures", "n", "--zero", "n", "--activate", "n",
		"--setactivationskip", "y", "--name", name, "--size", strconv.FormatInt(size, 10)+"b", "--addtag", tag, vg)
	return err
}

// SnapshotSkipped takes a thin snapshot name of the thin LV vg/origin,
// inactive and skipped at activation whatever lvm.conf's
// auto_set_activation_skip says.
func SnapshotSkipped(ctx context.Context, vg, origin, name string, tags ...string) error {
	args := []string{"--yes", "--snapshot", "--name", name, "--setactivationskip", "y", "--activate", "n"}
	for _, t := range tags {
		args = append(args, "--addtag", t)
	}
	_, err := run(ctx, "lvcreate", append(args, vg+"/"+origin)...)
	return err
}

// ActivateSkipped activates the LV whose LVM UUID is uuid, in vg, even
// though its activation-skip flag is set.
func ActivateSkipped(ctx context.Context, vg, uuid string) error {
	_, err := run(ctx, "lvchange", "--activate", "y", "--ignoreactivationskip", "--select", "lv_uuid="+uuid, vg)
	return err
}

// SetActivationSkip sets or clears the activation-skip flag of the LV
// whose LVM UUID is uuid, in vg.
func SetActivationSkip(ctx context.Context, vg, uuid string, skip bool) error {
	flag := "n"
	if skip {
		flag = "y"
	}
	_, err := run(ctx, "lvchange", "--setactivationskip", flag, "--select", "lv_uuid="+uuid, vg)
	return err
}

// Extend grows the LV vg/name to at least size bytes (LVM rounds up to its
// extent size). lvextend takes no --select: the caller checks the LV's UUID
// just before.
func Extend(ctx context.Context, vg, name string, size int64) error {
	_, err := run(ctx, "lvextend", "--yes", "--size", strconv.FormatInt(size, 10)+"b", vg+"/"+name)
	return err
}

// Activate activates the LV whose LVM UUID is uuid, in vg.
func Activate(ctx context.Context, vg, uuid string) error {
	_, err := run(ctx, "lvchange", "--activate", "y", "--select", "lv_uuid="+uuid, vg)
	return err
}

// pollEverySecond has the poller an lvchange starts look at a merge every
// second instead of LVM's default 15 (activation/polling_interval): a
// small thick snapshot merges in well under a second.
const pollEverySecond = "activation/polling_interval=1"

// ActivatePolling activates the LV whose LVM UUID is uuid, in vg, and has
// LVM poll a merge into it to its end (lvchange --poll y, whatever the
// node's background_polling says: the merged snapshot is removed then),
// looking every second.
func ActivatePolling(ctx context.Context, vg, uuid string) error {
	_, err := run(ctx, "lvchange", "--config", pollEverySecond, "--activate", "y", "--poll", "y", "--select", "lv_uuid="+uuid, vg)
	return err
}

// Poll has LVM poll a merge into the active LV whose LVM UUID is uuid
// (again): the background process that finishes it and removes the
// snapshot.
func Poll(ctx context.Context, vg, uuid string) error {
	_, err := run(ctx, "lvchange", "--config", pollEverySecond, "--poll", "y", "--select", "lv_uuid="+uuid, vg)
	return err
}

// Deactivate deactivates the LV whose LVM UUID is uuid, in vg (a thick
// origin's snapshots with it). LVM refuses while it is open (mounted, held
// by a process or a device stacked on it), and then nothing changes.
func Deactivate(ctx context.Context, vg, uuid string) error {
	_, err := run(ctx, "lvchange", "--activate", "n", "--select", "lv_uuid="+uuid, vg)
	return err
}

// Merge merges the snapshot vg/name into its origin (lvconvert --merge):
// a thin one at once when both are inactive, a thick one when the origin
// is next activated if it is inactive now (else at once, closed). LVM
// removes the snapshot once merged. --background: lvconvert never waits
// for a thick merge itself; LVM's poller finishes it. lvconvert takes no
// --select: the caller checks the snapshot's UUID just before.
func Merge(ctx context.Context, vg, name string) error {
	_, err := run(ctx, "lvconvert", "--yes", "--merge", "--background", vg+"/"+name)
	return err
}

// Rename renames vg/from to vg/to. lvrename takes no --select: the caller
// checks the LV's UUID just before.
func Rename(ctx context.Context, vg, from, to string) error {
	_, err := run(ctx, "lvrename", vg, from, to)
	return err
}

// Remove removes the LV whose LVM UUID is uuid, in vg: a name could have
// been given to another LV since we looked.
func Remove(ctx context.Context, vg, uuid string) error {
	_, err := run(ctx, "lvremove", "--yes", "--select", "lv_uuid="+uuid, vg)
	return err
}
