package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/devlinks"
	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/luks"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Prepare makes the volume exist on this node. Running it again, or after a
// crash at any step, converges on the same prepared volume.
func (e *Engine) Prepare(ctx context.Context, s *spec.Spec) (*Result, error) {
	res := baseResult(s)
	o := &op{e: e, s: s}
	if encrypted(s) {
		// A master key is needed by every prepare but a rerun on a
		// container already open that grows nothing: asked before
		// anything is written, so a prepare without it leaves no file, no
		// record and no grown loop device.
		if s.EncryptionProvider() == spec.ProviderMaster {
			_, open := luks.Mapped(luks.MapperName(s.UUID))
			if hint, _ := e.State.Load(s.UUID); !open || growing(s, hint) {
				if _, err := e.key(s); err != nil {
					return nil, err
				}
			}
		}
		if err := luks.Ready(); err != nil {
			return nil, refused("encryption_unavailable", "encryption: volume %s is encrypted, and this node cannot open LUKS2 containers: %v. Nothing was done: prepare it on a node that can, or without encryption", s.Name, err)
		}
	}
	if s.SparseLoopDevice != nil {
		warn, err := e.checkCapacity(s)
		if err != nil {
			return nil, err
		}
		if warn != "" {
			res.Warnings = append(res.Warnings, warn)
		}
	}
	var raw *rawDevice
	if s.RawBlockDevice != nil {
		var err error
		if raw, err = resolveRaw(s.RawBlockDevice.DevicePath); err != nil {
			return nil, err
		}
		// libblkid's probe is the longest of admission's reads (a process
		// start and dozens of reads): it starts before the locks, on a
		// record read without them. That read is only a guess; admit
		// reads the record again under the lock and starts the probe then
		// if the guess was wrong. A volume already written needs no probe,
		// so a rerun (every state run) starts no process for it.
		if hint, _ := e.State.Load(s.UUID); hint == nil || !hint.Formatted() {
			pctx, cancel := context.WithCancel(ctx)
			defer cancel()
			o.sigs = startSignatures(pctx, "/dev/"+raw.name)
		}
	}

	lock, err := e.lockVolume(s.UUID)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	defer func() { o.final.discard() }()
	rec, err := e.admit(ctx, o, raw)
	if err != nil {
		return nil, err
	}
	switch {
	case s.SparseLoopDevice != nil:
		err = e.prepareSparse(ctx, o, rec, res)
	case s.LVMLogicalVolume != nil:
		err = e.prepareLVM(ctx, o, rec, res)
	default:
		err = e.prepareRaw(ctx, o, rec, raw, res)
	}
	if err != nil {
		return nil, err
	}
	if rec.Phase != nodestate.PhasePrepared || o.unsaved {
		o.changed = o.changed || rec.Phase != nodestate.PhasePrepared
		rec.Phase = nodestate.PhasePrepared
		if err := o.final.save(e, rec); err != nil {
			return nil, failed("state", err, "saving state of %s", s.Name)
		}
	}
	o.step("prepared")
	res.State = StatePrepared
	res.Changed = o.changed
	// A loop device this run attached a moment ago, or a raw device it
	// wrote through an exclusive open (after checking mounts and holders),
	// is not in use: reading mountinfo, holders and every loop device's
	// backing file again would only say so. Any other device is reported
	// as found.
	if !o.fresh {
		if _, err := e.usage(res.DeviceName, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// checkCapacity refuses sizes no file on this filesystem could ever have,
// and warns about overcommitting free space (sparse files are thin).
func (e *Engine) checkCapacity(s *spec.Spec) (string, error) {
	_, total, free, err := e.backingFS()
	if err != nil {
		return "", err
	}
	if s.SizeBytes > total {
		return "", invalid("size_too_large", "sparseLoopDevice.size: %s is larger than the whole filesystem holding %s (%s): use a smaller size",
			spec.FormatSize(s.SizeBytes), e.State.Root, spec.FormatSize(total))
	}
	if s.SizeBytes > free {
		return fmt.Sprintf("sparseLoopDevice.size %s is more than the free space under %s (%s): the sparse file is thin, but writes will fail once the filesystem is full",
			spec.FormatSize(s.SizeBytes), e.State.Root, spec.FormatSize(free)), nil
	}
	return "", nil
}

// admit makes every refusal before the first write (the record included)
// and returns the volume's record, creating it if needed. The global lock
// makes the name, device and UUID checks atomic with the write.
func (e *Engine) admit(ctx context.Context, o *op, raw *rawDevice) (*nodestate.Record, error) {
	s := o.s
	// The UUID check needs only this volume's lock, which the caller holds:
	// no other volume writes this UUID. Scanning the devices outside the
	// global lock keeps concurrent prepares of other volumes parallel.
	// This volume's own record is read once, here: only holders of this
	// lock write it.
	rec, err := e.State.Load(s.UUID)
	if err != nil {
		return nil, failed("state", err, "reading state of %s", s.Name)
	}
	// A raw device we may write gets libblkid's probe, running beside the
	// checks below (its result is read under the global lock, after the
	// records said the device is nobody else's).
	sigs := o.sigs
	if raw != nil && (rec == nil || !rec.Formatted()) && sigs == nil {
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		sigs = startSignatures(pctx, "/dev/"+raw.name)
	}
	// A new raw volume's record is written and synced while the checks
	// below wait for that probe; it only becomes the record once they
	// have all passed (see nodestate.Staged).
	var first *pendingStage
	if raw != nil && rec == nil {
		first = e.stageNewRaw(s, raw)
		defer first.discard()
	}
	mine := map[string]bool{}
	if rec != nil {
		for _, n := range e.devicesOf(rec) {
			mine[n] = true
		}
	}
	scan := scanNode()
	carriers := scan.carriers(s)
	// Our devices' children were read before the scan: a partition of one
	// of them that udev's re-read of its table took away and gave back in
	// between is as much ours as before (CI saw that window refuse a
	// prepare of a Block volume).
	// A partition the re-read has taken away again by the time we look
	// shows nothing in sysfs, while udev's link still names it: its name
	// alone says whose it is.
	for _, c := range carriers {
		if mine[c.Name] {
			continue
		}
		if p, isPart, _ := blockdev.Partition(c.Name); isPart && mine[p.Parent] || partitionOfAny(c.Name, mine) {
			mine[c.Name] = true
		}
	}
	if err := decideUUID(s, carriers, mine); err != nil {
		return nil, err
	}
	// Labels only matter until the volume is written: afterwards the
	// devices that carry them are this volume's own.
	if rec == nil || !rec.Formatted() {
		if err := decideLabels(scan.labelHolders(labelsOf(s, raw)), mine); err != nil {
			return nil, err
		}
	}

	g, err := e.State.Lock("global")
	if err != nil {
		return nil, failed("lock", err, "taking the state lock")
	}
	defer g.Unlock()
	all, errs := e.State.All()
	if len(errs) > 0 {
		return nil, failed("state", errors.Join(errs...), "reading node state")
	}
	for _, r := range all {
		switch {
		case r.Spec.UUID == s.UUID:
		case r.Spec.Name == s.Name:
			return nil, refused("name_conflict", "name: volume %q already exists on this node with uuid %s: choose another name or delete that volume first", s.Name, r.Spec.UUID)
		case raw != nil && r.Spec.RawBlockDevice != nil && deviceOf(r) == raw.name:
			return nil, refused("device_conflict", "%s: %s is already used by volume %q (%s)", devicePathField, s.RawBlockDevice.DevicePath, r.Spec.Name, r.Spec.UUID)
		}
	}
	if rec != nil {
		if same, why := s.SameVolume(rec.Spec); !same {
			return nil, refused("conflict", "volume %s is already on this node with a different spec (%s): delete it first, or use a new uuid", s.UUID, why)
		}
		// Until it is written, what a volume was begun as decides how it
		// is finished: a clone's LV skips the fresh-LV check (its every
		// byte is the snapshot's), so a volume begun as a new one may not
		// be finished as a clone (its LV may hold an earlier LV's data),
		// nor a clone as a new one or of another snapshot.
		if !rec.Formatted() && !sameSource(s.Source, rec.Spec.Source) {
			return nil, refused("conflict", "volume %s was begun %s and is not prepared yet: source must stay as it was (delete the volume first, or use a new uuid)", s.UUID, describeSource(rec.Spec.Source))
		}
		if growing(s, rec) {
			if err := e.checkGrowth(s, rec, all); err != nil {
				return nil, err
			}
		}
	}
	if raw != nil {
		if err := e.admitRaw(ctx, s, rec, raw, e.holdings(all, s.UUID), sigs, &o.probed); err != nil {
			return nil, err
		}
	} else if rec == nil && s.SparseLoopDevice != nil {
		// A sparse file that no record claims is an orphan: not ours to reuse.
		if _, err := os.Lstat(e.State.SparseFile(s.UUID)); err == nil {
			return nil, refused("orphan", "uuid: %s already exists but no record claims it (an orphan, see salt-volume-exec list): move it away or use another uuid", e.State.SparseFile(s.UUID))
		}
		// Only a new volume commits more: a rerun of one we admitted
		// before never fails here.
		if err := e.checkOvercommit(s, all); err != nil {
			return nil, err
		}
	}
	if rec != nil {
		return rec, nil
	}
	if first != nil {
		if rec, err = first.record(); err != nil {
			return nil, err
		}
	} else {
		rec = &nodestate.Record{Spec: s, Phase: nodestate.PhasePreparing}
	}
	if err := first.save(e, rec); err != nil {
		return nil, failed("state", err, "saving state of %s", s.Name)
	}
	o.changed = true
	o.step("recorded")
	return rec, nil
}

// admitRaw checks a raw device: a volume we wrote must still be on the
// device the record names; a device we have not written yet must be
// blank, unused, whole and nobody else's volume.
// probed receives what the device was found to hold when admitRaw read it.
func (e *Engine) admitRaw(ctx context.Context, s *spec.Spec, rec *nodestate.Record, raw *rawDevice, held map[string]string, sigs *pendingSignatures, probed **probe.Result) error {
	size, err := blockdev.SizeOfSettled(raw.name, partitionSettle)
	if err != nil {
		return failed("sysfs", err, "reading the size of %s", raw.name)
	}
	if err := s.CheckDeviceSize(size); err != nil {
		return err
	}
	if hb := heldBy(raw, held); hb != "" {
		return decideTarget(targetFacts{Path: raw.path, HeldBy: hb})
	}
	if rec != nil && e.recordMatches(rec, raw.name) {
		return nil // already this volume (or our own unfinished write): prepare re-links it
	}
	if rec != nil && rec.Formatted() {
		if rec.DeviceNum != "" && deviceOf(rec) != raw.name {
			return refused("device_changed", "%s: %s now points at %s, not the device %s this volume was prepared on, and %s does not carry the volume",
				devicePathField, raw.path, raw.name, rec.Device, raw.name)
		}
		r, _, _, err := openProbe("/dev/" + raw.name)
		if err != nil {
			return failed("probe", err, "reading %s", raw.path)
		}
		_, err = decideContent(s, contentFacts{Where: raw.path, Found: r, Formatted: true})
		return err
	}
	if err := checkPartitionTable(s, raw); err != nil {
		return err
	}
	f, err := gatherTarget(ctx, raw, "", sigs)
	if err != nil {
		return err
	}
	if err := decideTarget(f); err != nil {
		return err
	}
	*probed = &f.Own
	return nil
}

// finishDevice makes the partition node (Block mode) and the persistent link
// exist and fills in the device fields.
func (e *Engine) finishDevice(ctx context.Context, o *op, disk string, res *Result) error {
	s := o.s
	name := disk
	if s.Mode == spec.ModeBlock {
		size, err := blockdev.SizeOf(disk)
		if err != nil {
			return failed("sysfs", err, "reading the size of %s", disk)
		}
		start, length, err := gpt.Extent(size, sectorSize(disk))
		if err != nil {
			return failed("gpt", err, "computing the partition of %s", disk)
		}
		p, ok, _ := partitionAt(disk, 1)
		if !ok || p.Start != start || p.Size != length {
			_ = loopdev.Reread(disk)
			if name, err = loopdev.EnsurePartition(disk, 1, start, length); err != nil {
				return failed("partition", err, "making partition 1 of %s known to the kernel", disk)
			}
			o.changed = true
			o.step("partition-added", "device", name)
		} else {
			name = p.name
		}
	}
	return e.linkDevice(ctx, o, name, res)
}

// linkDevice makes /dev/<name> and the persistent link exist, and fills in
// the device fields of res.
func (e *Engine) linkDevice(ctx context.Context, o *op, name string, res *Result) error {
	path, size, err := e.node(ctx, o, name)
	if err != nil {
		return err
	}
	res.DeviceName, res.DevicePath, res.Size = name, path, size

	link := o.persistentPath()
	if devlinks.Resolve(link) != name {
		if l := gatherLink(o.s, link); !linkIsOurs(l, name) {
			return refused("link_conflict", "%s names /dev/%s, which carries uuid %s too and is not this volume's device: not replacing it", link, l.Target, o.s.UUID)
		}
		if err := devlinks.Ensure(ctx, link, name, e.UdevWait); err != nil {
			return failed("link", err, "creating %s", link)
		}
		o.changed = true
		o.step("linked", "link", link, "device", name)
	}
	return nil
}

// node makes /dev/<name> exist and reads its size. Where udev runs, closing
// a disk we wrote (a GPT, a loop device's configuration) has udev re-read its
// table: wait for udev after a change this run made.
func (e *Engine) node(ctx context.Context, o *op, name string) (string, int64, error) {
	if o.changed {
		devlinks.Settle(ctx, e.UdevWait)
	}
	path, size, err := blockdev.AwaitNode(ctx, name, e.UdevWait)
	if err != nil {
		return "", 0, failed("node", err, "making /dev/%s", name)
	}
	return path, size, nil
}

type namedPartition struct {
	blockdev.PartitionInfo
	name string
}

func partitionAt(disk string, pno int) (namedPartition, bool, error) {
	kids, err := blockdev.Children(disk)
	if err != nil {
		return namedPartition{}, false, err
	}
	for _, k := range kids {
		p, ok, err := blockdev.Partition(k)
		if err == nil && ok && p.Number == pno {
			return namedPartition{p, k}, true, nil
		}
	}
	return namedPartition{}, false, nil
}

func sectorSize(name string) int {
	b, err := os.ReadFile(filepath.Join(blockdev.SysBlock, name, "queue", "logical_block_size"))
	if err != nil {
		return 512
	}
	var n int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &n); err != nil || n == 0 {
		return 512
	}
	return n
}

// pendingStage is a record being staged (nodestate.Stage) beside other
// work. A nil *pendingStage stages nothing: save is then a plain Save.
type pendingStage struct {
	done chan struct{}
	rec  *nodestate.Record // the record built, once done
	st   *nodestate.Staged
	err  error // building it failed: there is no record to save
}

// stageNewRaw describes a raw device in a new record and stages it.
func (e *Engine) stageNewRaw(s *spec.Spec, raw *rawDevice) *pendingStage {
	return e.stageWith(func() (*nodestate.Record, error) {
		rec := &nodestate.Record{Spec: s, Phase: nodestate.PhasePreparing}
		return rec, describeRaw(rec, raw)
	})
}

// stage stages r, a copy the caller no longer changes.
func (e *Engine) stage(r nodestate.Record) *pendingStage {
	return e.stageWith(func() (*nodestate.Record, error) { return &r, nil })
}

// stageWith builds a record and stages it, beside the caller. A failed
// stage is not an error: save falls back to Save.
func (e *Engine) stageWith(build func() (*nodestate.Record, error)) *pendingStage {
	p := &pendingStage{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if p.rec, p.err = build(); p.err == nil {
			p.st, _ = e.State.Stage(p.rec)
		}
	}()
	return p
}

// record waits for the staged record, which the caller then owns.
func (p *pendingStage) record() (*nodestate.Record, error) {
	<-p.done
	return p.rec, p.err
}

// save saves r: by committing what was staged if that holds the same,
// else with Save. It consumes the stage.
func (p *pendingStage) save(e *Engine, r *nodestate.Record) error {
	if p != nil {
		<-p.done
		st := p.st
		p.st = nil
		if st != nil {
			if st.Holds(r) {
				return st.Commit(r)
			}
			st.Discard()
		}
	}
	return e.State.Save(r)
}

// discard removes a stage that was not saved.
func (p *pendingStage) discard() {
	if p == nil {
		return
	}
	<-p.done
	if p.st != nil {
		p.st.Discard()
		p.st = nil
	}
}

func sameSource(a, b *spec.Source) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

func describeSource(src *spec.Source) string {
	if src == nil {
		return "as a new volume (no source)"
	}
	return fmt.Sprintf("as a clone of snapshot %s of volume %s", src.Snapshot, src.VolumeUUID)
}

// partitionOfAny tells whether name is the kernel's name for a partition
// of one of the devices in disks: the disk's name, "p" if it ends in a
// digit (loop3p1, nvme0n1p2), then the partition's number (sda1).
func partitionOfAny(name string, disks map[string]bool) bool {
	for d := range disks {
		rest, ok := strings.CutPrefix(name, d)
		if !ok || d == "" {
			continue
		}
		if last := d[len(d)-1]; last >= '0' && last <= '9' {
			if rest, ok = strings.CutPrefix(rest, "p"); !ok {
				continue
			}
		}
		if rest != "" && strings.Trim(rest, "0123456789") == "" {
			return true
		}
	}
	return false
}
