package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Info reports a volume's state without changing anything.
func (e *Engine) Info(ctx context.Context, s *spec.Spec) (*Result, error) {
	rec, err := e.State.Load(s.UUID)
	if err != nil {
		return nil, failed("state", err, "reading state of %s", s.Name)
	}
	if rec != nil {
		if same, why := s.SameVolume(rec.Spec); !same {
			return nil, refused("conflict", "volume %s on this node has a different spec (%s)", s.UUID, why)
		}
	}
	return e.inspect(s, rec), nil
}

// List reports every volume this node knows, plus sparse files that no
// state claims (orphans).
func (e *Engine) List(ctx context.Context) ([]*Result, error) {
	recs, errs := e.State.All()
	if len(errs) > 0 {
		return nil, failed("state", errors.Join(errs...), "reading node state")
	}
	out := make([]*Result, 0, len(recs))
	known := map[string]bool{}
	for _, r := range recs {
		known[r.Spec.UUID] = true
		out = append(out, e.inspect(r.Spec, r))
	}
	return append(out, e.orphans(known)...), nil
}

// orphans are sparse files named after a UUID that no state file claims.
func (e *Engine) orphans(known map[string]bool) []*Result {
	ents, _ := os.ReadDir(e.State.Sparse())
	var out []*Result
	for _, ent := range ents {
		u, err := uuid.Parse(ent.Name())
		if err != nil || known[u.String()] || ent.Name() != u.String() {
			continue
		}
		file := filepath.Join(e.State.Sparse(), ent.Name())
		res := &Result{UUID: u.String(), Type: spec.TypeSparse, BackingFile: file, State: StateOrphan}
		if st, err := os.Stat(file); err == nil {
			res.Size, res.Allocated = st.Size(), allocated(st)
		}
		if devs, _ := loopdev.Find(file); len(devs) > 0 {
			res.DeviceName, res.DevicePath = devs[0].Name, devs[0].Path
			_, _ = e.usage(devs[0].Name, res)
		}
		out = append(out, res)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UUID < out[j].UUID })
	return out
}

func (e *Engine) inspect(s *spec.Spec, rec *nodestate.Record) *Result {
	res := baseResult(s)
	switch {
	case s.SparseLoopDevice != nil:
		e.inspectSparse(s, rec, res)
	case s.LVMLogicalVolume != nil:
		e.inspectLVM(s, rec, res)
	default:
		e.inspectRaw(s, rec, res)
	}
	if res.DeviceName != "" {
		if _, err := e.usage(res.DeviceName, res); err != nil {
			res.Error = err.Error()
		}
	}
	return res
}

func (e *Engine) inspectSparse(s *spec.Spec, rec *nodestate.Record, res *Result) {
	file := e.State.SparseFile(s.UUID)
	res.BackingFile = file
	st, err := os.Lstat(file)
	exists := err == nil
	if exists {
		res.Size, res.Allocated = st.Size(), allocated(st)
	}
	damaged := false
	if exists && rec != nil && rec.Formatted() {
		damaged = !e.sparseCarries(s)
	}
	var devs []loopdev.Device
	if exists {
		devs, _ = loopdev.Find(file)
	}
	locked := false
	if len(devs) > 0 && encrypted(s) {
		// The volume is the opened container; its loop device is only
		// the container's.
		m, ok := e.mapping(s, devs)
		locked = !ok
		if ok {
			res.DeviceName, res.DevicePath = m.Device, "/dev/"+m.Device
			res.Size, _ = blockdev.SizeOf(m.Device)
		}
	} else if len(devs) > 0 {
		res.DeviceName, res.DevicePath = devs[0].Name, devs[0].Path
		if s.Mode == spec.ModeBlock {
			if p, ok, _ := partitionAt(devs[0].Name, 1); ok {
				res.DeviceName, res.DevicePath, res.Size = p.name, "/dev/"+p.name, p.Size
			}
		} else if sz, err := blockdev.SizeOf(devs[0].Name); err == nil {
			res.Size = sz
		}
	}
	switch {
	case rec == nil && !exists:
		res.State = StateAbsent
	case rec == nil:
		res.State = StateOrphan
	case rec.Phase != nodestate.PhasePrepared:
		res.State = StateIncomplete
	case !exists:
		res.State = StateMissing
		res.Error = file + " is gone"
	case damaged:
		res.State = StateDamaged
		res.Error = file + " no longer carries the volume's " + expectedSignature(s) + ": " + recovery(s, file)
	case len(devs) == 0:
		res.State = StateDetached
	case locked:
		res.State = StateLocked
		res.Error = "the container of " + s.Name + " is not open: salt-volume-exec restore opens it"
		if s.EncryptionProvider() == spec.ProviderMaster {
			res.Error = "the container of " + s.Name + " is not open and its key is the Salt master's: salt-call salt_volumes.restore on the node (or salt NODE salt_volumes.restore) opens it"
		}
	default:
		res.State = StatePrepared
		e.checkLink(s, res)
	}
}

// checkLink notes a persistent path that does not lead to the device.
func (e *Engine) checkLink(s *spec.Spec, res *Result) {
	if got := resolveLink(res.PersistentPath); got != res.DeviceName {
		res.Warnings = append(res.Warnings, res.PersistentPath+" does not resolve to "+res.DeviceName+": run salt-volume-exec restore")
	}
}

func resolveLink(link string) string {
	p, err := filepath.EvalSymlinks(link)
	if err != nil {
		return ""
	}
	return filepath.Base(p)
}

// sparseCarries reads the volume's signature from its sparse file.
func (e *Engine) sparseCarries(s *spec.Spec) bool {
	f, err := e.State.OpenSparse(s.UUID, os.O_RDONLY)
	if err != nil {
		return false
	}
	defer f.Close()
	r, err := probe.Device(f, s.SizeBytes, 512)
	return err == nil && ours(s, r)
}

func (e *Engine) inspectRaw(s *spec.Spec, rec *nodestate.Record, res *Result) {
	var name string
	res.PersistentPath = persistentPath(s, rec)
	if rec != nil {
		name = e.locateRaw(rec, false)
	} else {
		// No record: a device carrying the UUID is reported as an orphan,
		// and never acted upon.
		name, _ = e.findRaw(s, false)
	}
	if name != "" {
		res.DeviceName, res.DevicePath = name, "/dev/"+name
		res.Size, _ = blockdev.SizeOf(name)
	}
	switch {
	case rec == nil && name == "":
		res.State = StateAbsent
	case rec == nil:
		res.State = StateOrphan
	case rec.Phase != nodestate.PhasePrepared:
		res.State = StateIncomplete
	case name == "" && e.recordedDeviceDamaged(rec):
		res.State = StateDamaged
		res.DeviceName, res.DevicePath = rec.Device, "/dev/"+rec.Device
		res.Error = "/dev/" + rec.Device + " no longer carries the volume's " + expectedSignature(s) + ": " + recovery(s, "/dev/"+rec.Device)
	case name == "":
		res.State = StateMissing
		res.Error = "no device on this node carries the volume " + s.UUID
	default:
		res.State = StatePrepared
		e.checkLink(s, res)
	}
}

// recordedDeviceDamaged: the device the record names is still there, the
// same size, but without the signature we wrote on it (rather than with it,
// waiting for restore to tell the kernel about its partition).
func (e *Engine) recordedDeviceDamaged(rec *nodestate.Record) bool {
	n := deviceOf(rec)
	if n == "" || !rec.Formatted() {
		return false
	}
	size, err := blockdev.SizeOf(n)
	return err == nil && (rec.DeviceSize == 0 || size >= rec.DeviceSize) && !e.recordMatches(rec, n)
}

// findRaw returns the kernel name of the device that is the volume: the
// device named by devicePath if it carries the volume's signature, else any
// device on the node that does (disks get renamed across reboots).
func (e *Engine) findRaw(s *spec.Spec, fix bool) (string, error) {
	if raw, err := resolveRaw(s.RawBlockDevice.DevicePath); err == nil {
		if name := carries(s, raw.name, fix); name != "" {
			return name, nil
		}
	}
	ents, err := os.ReadDir(blockdev.SysBlock)
	if err != nil {
		return "", err
	}
	for _, ent := range ents {
		n := ent.Name()
		if strings.HasPrefix(n, "ram") || strings.HasPrefix(n, "zram") {
			continue
		}
		if strings.HasPrefix(n, "loop") {
			if _, err := os.Stat(filepath.Join(blockdev.SysBlock, n, "loop")); err != nil {
				continue // unbound loop devices have nothing to read
			}
		}
		if name := carries(s, n, fix); name != "" {
			return name, nil
		}
	}
	return "", nil
}

// carries tells whether device name holds the volume, and returns the name
// of the device that is the volume (the partition, in Block mode). With fix,
// a partition that is in the table but unknown to the kernel is added.
func carries(s *spec.Spec, name string, fix bool) string {
	if s.Mode == spec.ModeFilesystem {
		if _, isPart, _ := blockdev.Partition(name); !isPart {
			if kids, _ := blockdev.Children(name); len(kids) > 0 {
				return "" // a partitioned disk holds no filesystem of ours
			}
		}
		path, err := blockdev.EnsureNode(name)
		if err != nil {
			return ""
		}
		if r, _, _, err := openProbe(path); err == nil && ours(s, r) {
			return name
		}
		return ""
	}
	// Block mode: the GUID lives in the disk's table.
	disk, pno := name, 0
	if p, isPart, _ := blockdev.Partition(name); isPart {
		disk, pno = p.Parent, p.Number
	}
	path, err := blockdev.EnsureNode(disk)
	if err != nil {
		return ""
	}
	r, _, ss, err := openProbe(path)
	if err != nil || r.GPT == nil {
		return ""
	}
	for _, ent := range r.GPT.Entries {
		if ent.GUID != s.UUID || (pno != 0 && ent.Index != pno) {
			continue
		}
		if p, ok, _ := partitionAt(disk, ent.Index); ok && p.Start == ent.Start(ss) {
			return p.name
		}
		if pno == 0 && fix {
			// The table is there but the kernel has not been told (no GPT
			// parser, or a fresh boot without udev); restore adds it.
			if n, err := loopdev.EnsurePartition(disk, ent.Index, ent.Start(ss), ent.Size(ss)); err == nil {
				return n
			}
		}
	}
	return ""
}
