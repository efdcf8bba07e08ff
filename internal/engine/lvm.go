package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/devlinks"
	"github.com/salt-volumes/salt-volumes/internal/lvm"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

const vgField = "lvmLogicalVolume.vgName"

// writtenLV is what an LVM Block volume's record says we wrote: the LV
// itself, and nothing on it.
const writtenLV = "lv"

func lvTag(s *spec.Spec) string { return spec.LVMTagPrefix + s.UUID }

// dmByUUID finds the device-mapper device with the given UUID in sysfs,
// without running a process: the beacon inspects every interval.
func dmByUUID(dmuuid string) string {
	if dmuuid == "" {
		return ""
	}
	ents, _ := os.ReadDir(blockdev.SysBlock)
	for _, ent := range ents {
		if n := ent.Name(); strings.HasPrefix(n, "dm-") && dmUUID(n) == dmuuid {
			return n
		}
	}
	return ""
}

// dmUUID is the device-mapper UUID of device name ("" for another device).
func dmUUID(name string) string {
	b, err := os.ReadFile(filepath.Join(blockdev.SysBlock, name, "dm", "uuid"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// lvmUUIDOf is the device-mapper UUID of device name if it is an LVM LV
// ("LVM-..."), else "".
func lvmUUIDOf(name string) string {
	if u := dmUUID(name); strings.HasPrefix(u, "LVM-") {
		return u
	}
	return ""
}

// persistentPath is where a recorded volume is found: the link its UUID
// names, or for a Block volume on an LV (ours, or given as a raw device)
// udev's link of the LV's device-mapper UUID, which only the record knows.
func persistentPath(s *spec.Spec, rec *nodestate.Record) string {
	if s.Mode == spec.ModeBlock && rec != nil && rec.DMUUID != "" {
		return spec.DMUUIDLinkPrefix + rec.DMUUID
	}
	return s.PersistentPath()
}

// activateLV activates the recorded LV and returns its device-mapper device.
func (e *Engine) activateLV(ctx context.Context, o *op, rec *nodestate.Record) (string, error) {
	vg, lv := o.s.LVMLogicalVolume.VGName, o.s.Name
	activate := lvm.Activate
	if cloneUnfinished(rec) {
		if err := devlinks.Hide(ctx, rec.DMUUID); err != nil {
			return "", failed("udev", err, "keeping udev from linking clone %s/%s before it has its own UUID", vg, lv)
		}
		activate = lvm.ActivateSkipped
	}
	if err := activate(ctx, vg, rec.LVUUID); err != nil {
		return "", failed("lvchange", err, "activating logical volume %s/%s", vg, lv)
	}
	o.changed = true
	o.step("lv-activated", "lv", vg+"/"+lv)
	if name := dmByUUID(rec.DMUUID); name != "" {
		return name, nil
	}
	return "", failed("lvm", nil, "logical volume %s/%s was activated but no device-mapper device has UUID %s: if lvs -o lv_name,lv_attr shows its activation-skip flag (k), it is a clone salt-volumes had not finished: run prepare with the clone's spec (its source) again", vg, lv, rec.DMUUID)
}

// dropUnstarted forgets a new volume's record when nothing of it exists on
// the machine yet, so that a refusal leaves the node as it was.
func (e *Engine) dropUnstarted(rec *nodestate.Record) {
	if rec.LVUUID == "" && !rec.Formatted() {
		_ = e.State.Remove(rec.Spec.UUID)
	}
}

func (e *Engine) prepareLVM(ctx context.Context, o *op, rec *nodestate.Record, res *Result) error {
	s := o.s
	l := s.LVMLogicalVolume
	// Ours by record and active: every state run prepares the volume
	// again, and needs no LVM tool for that.
	name := deviceOf(rec)
	if name != "" && cloneUnfinished(rec) && !devlinks.Hidden(rec.DMUUID) {
		if err := e.hideActiveClone(ctx, o, rec); err != nil {
			return err
		}
		name = ""
	}
	if name == "" {
		var err error
		if name, err = e.ensureLV(ctx, o, rec); err != nil {
			return err
		}
	}
	if cloneUnfinished(rec) {
		// A run killed inside revealClone may have cleared the flag; the
		// copy below writes the snapshot's UUID again, which a boot must
		// not activate.
		if err := lvm.SetActivationSkip(ctx, l.VGName, rec.LVUUID, true); err != nil {
			return failed("lvchange", err, "setting the activation skip flag of clone %s/%s", l.VGName, s.Name)
		}
		// A clone's LV holds nothing of anyone else: a thick snapshot's
		// copy writes it whole (the rest zeroed), a thin one shares only
		// its snapshot's blocks. What it holds now is the snapshot's
		// content, which a fresh-LV check would take for an earlier LV's
		// leftovers and remove or wipe.
		if _, err := blockdev.EnsureNode(name); err != nil {
			return failed("node", err, "making /dev/%s", name)
		}
		if err := e.cloneLVContent(ctx, o, name); err != nil {
			return err
		}
		var err error
		if name, err = e.revealClone(ctx, o, rec, name); err != nil {
			return err
		}
	}
	path, err := blockdev.EnsureNode(name)
	if err != nil {
		return failed("node", err, "making /dev/%s", name)
	}
	raw, err := resolveRaw(path)
	if err != nil {
		return err
	}
	raw.path = "/dev/" + l.VGName + "/" + s.Name
	if !rec.Formatted() && rec.Spec.Source == nil {
		if err := e.checkFreshLV(ctx, o, rec, raw); err != nil {
			return err
		}
	}
	grow := rec.Formatted() && s.SizeBytes > rec.Spec.SizeBytes
	if s.Mode == spec.ModeFilesystem {
		r, _, _, err := openProbe(path)
		if err != nil {
			return failed("probe", err, "reading %s", raw.path)
		}
		if err := e.writeIfBlank(ctx, o, rec, raw, r); err != nil {
			return err
		}
		o.markWritten(rec, s.FSType)
	} else {
		o.markWritten(rec, writtenLV)
	}
	if grow {
		if err := e.growLV(ctx, o, rec, name); err != nil {
			return err
		}
	}
	if err := e.rememberDevice(rec, raw); err != nil {
		return err
	}
	o.link = persistentPath(s, rec)
	res.PersistentPath = o.link
	return e.linkDevice(ctx, o, name, res)
}

// growLV grows the volume's LV to the spec's size (the VG must have the
// room: refused before anything changes otherwise), then its filesystem;
// the record takes the new size last, so a run killed at any step is
// finished by the next.
func (e *Engine) growLV(ctx context.Context, o *op, rec *nodestate.Record, name string) error {
	s := o.s
	l := s.LVMLogicalVolume
	// A restore under way sizes the LV itself once its snapshot merged.
	if err := e.refuseRestorePending(rec.Spec, "", "growing it to "+spec.FormatSize(s.SizeBytes)); err != nil {
		return err
	}
	lv, err := lvm.GetLV(ctx, l.VGName, s.Name)
	switch {
	case err != nil:
		return failed("lvm", err, "reading logical volume %s/%s", l.VGName, s.Name)
	case lv == nil || lv.UUID != rec.LVUUID:
		return refused("lv_not_ours", "%s: logical volume %s/%s is not the one salt-volumes created for this volume (LVM UUID %s): not growing it", vgField, l.VGName, s.Name, rec.LVUUID)
	}
	vg, err := lvm.GetVG(ctx, l.VGName)
	if err != nil {
		return failed("lvm", err, "reading volume group %s", l.VGName)
	}
	want := roundUp(s.SizeBytes, vg.ExtentSize)
	if lv.Size < want {
		// A thin LV grows in its pool, not in the VG's free extents.
		if more := want - lv.Size; lv.Pool == "" && more > vg.Free {
			return invalid("size_too_large", "lvmLogicalVolume.size: growing to %s needs %s more, and volume group %s has %s free: use a smaller size or extend the VG (vgextend)",
				spec.FormatSize(s.SizeBytes), spec.FormatSize(more), l.VGName, spec.FormatSize(vg.Free))
		}
		if err := lvm.Extend(ctx, l.VGName, s.Name, s.SizeBytes); err != nil {
			return failed("lvextend", err, "growing logical volume %s/%s", l.VGName, s.Name)
		}
		o.changed = true
		o.step("lv-extended", "lv", l.VGName+"/"+s.Name, "size", want)
	}
	if s.Mode == spec.ModeFilesystem {
		if err := e.growFS(ctx, o, name); err != nil {
			return err
		}
	}
	rec.Spec, o.unsaved = s, true
	o.changed = true
	o.step("grown", "size", s.SizeBytes)
	return nil
}

// ensureLV finds the volume's LV, creating it if there is none yet, and
// returns its device once active. The refusals come first: a VG that is
// not there, an LV of that name we did not create; a refused new volume
// leaves no record.
func (e *Engine) ensureLV(ctx context.Context, o *op, rec *nodestate.Record) (string, error) {
	s := o.s
	l := s.LVMLogicalVolume
	lv, err := lvm.GetLV(ctx, l.VGName, s.Name)
	switch {
	case errors.Is(err, lvm.ErrNoVG):
		e.dropUnstarted(rec)
		return "", invalid("vg_not_found", "%s: volume group %q does not exist on this node: create it first (vgcreate) or choose one that vgs lists", vgField, l.VGName)
	case err != nil:
		return "", failed("lvm", err, "reading volume group %s", l.VGName)
	case lv != nil && !lv.HasTag(lvTag(s)):
		e.dropUnstarted(rec)
		return "", refused("lv_not_ours", "%s: logical volume %s/%s exists and salt-volumes did not create it for this volume (it lacks the tag %s): not touching it; choose another volume name, or give it as rawBlockDevice: {devicePath: /dev/%s/%s} to use it as it is",
			vgField, l.VGName, s.Name, lvTag(s), l.VGName, s.Name)
	case lv != nil && rec.LVUUID != "" && lv.UUID != rec.LVUUID:
		return "", refused("lv_not_ours", "%s: logical volume %s/%s has LVM UUID %s, not %s, the one salt-volumes created for this volume: not touching it",
			vgField, l.VGName, s.Name, lv.UUID, rec.LVUUID)
	case lv == nil && rec.LVUUID != "":
		return "", failed("lv_missing", nil, "logical volume %s/%s (LVM UUID %s), which salt-volumes created for this volume, is gone: its data is lost; delete the volume and create it again",
			l.VGName, s.Name, rec.LVUUID)
	case lv == nil && s.Source != nil:
		if err := e.createCloneLV(ctx, o, rec); err != nil {
			return "", err
		}
		if lv, err = lvm.GetLV(ctx, l.VGName, s.Name); err != nil || lv == nil {
			return "", failed("lvm", err, "reading logical volume %s/%s back", l.VGName, s.Name)
		}
	case lv == nil && l.ThinPool != "":
		if err := lvm.CreateThin(ctx, l.VGName, l.ThinPool, s.Name, s.SizeBytes, lvTag(s)); err != nil {
			e.dropUnstarted(rec)
			return "", failed("lvcreate", err, "creating thin logical volume %s/%s in pool %s (lvmLogicalVolume.thinPool)", l.VGName, s.Name, l.ThinPool)
		}
		o.changed = true
		o.step("lv-created", "lv", l.VGName+"/"+s.Name, "tag", lvTag(s), "pool", l.ThinPool)
		if lv, err = lvm.GetLV(ctx, l.VGName, s.Name); err != nil || lv == nil {
			return "", failed("lvm", err, "reading logical volume %s/%s back", l.VGName, s.Name)
		}
	case lv == nil:
		vg, err := lvm.GetVG(ctx, l.VGName)
		if err != nil {
			return "", failed("lvm", err, "reading volume group %s", l.VGName)
		}
		if need := roundUp(s.SizeBytes, vg.ExtentSize); need > vg.Free {
			e.dropUnstarted(rec)
			return "", invalid("size_too_large", "lvmLogicalVolume.size: %s is more than volume group %s has free (%s): use a smaller size or extend the VG (vgextend)",
				spec.FormatSize(s.SizeBytes), l.VGName, spec.FormatSize(vg.Free))
		}
		if err := lvm.Create(ctx, l.VGName, s.Name, s.SizeBytes, lvTag(s)); err != nil {
			return "", failed("lvcreate", err, "creating logical volume %s/%s", l.VGName, s.Name)
		}
		o.changed = true
		o.step("lv-created", "lv", l.VGName+"/"+s.Name, "tag", lvTag(s))
		if lv, err = lvm.GetLV(ctx, l.VGName, s.Name); err != nil || lv == nil {
			return "", failed("lvm", err, "reading logical volume %s/%s back", l.VGName, s.Name)
		}
	}
	if rec.LVUUID != lv.UUID {
		// Saved at once: from now on the LV is ours by record as well as by
		// tag, whatever happens next.
		rec.LVUUID, rec.DMUUID = lv.UUID, lv.DMUUID()
		if err := e.State.Save(rec); err != nil {
			return "", failed("state", err, "saving state of %s", s.Name)
		}
	}
	if name := dmByUUID(rec.DMUUID); name != "" {
		return name, nil
	}
	return e.activateLV(ctx, o, rec)
}

// checkFreshLV: an LV we have not written yet must hold nothing, or only
// our own filesystem (a prepare killed after mkfs). What an earlier LV left
// on the same extents is someone's data: refused, and the new LV removed
// again so the refusal changes nothing, unless the volume asks to wipe it.
func (e *Engine) checkFreshLV(ctx context.Context, o *op, rec *nodestate.Record, raw *rawDevice) error {
	s := o.s
	if r, _, _, err := openProbe(raw.real); err == nil && s.Mode == spec.ModeFilesystem && ours(s, r) {
		return nil
	}
	sigs, err := probe.Signatures(ctx, raw.real)
	if err != nil {
		return failed("probe", err, "reading %s", raw.path)
	}
	if len(sigs) == 0 {
		return nil
	}
	found := make([]string, len(sigs))
	for i, sg := range sigs {
		found[i] = sg.String()
	}
	what := strings.Join(found, ", ")
	if s.LVMLogicalVolume.WipeSignatures {
		if err := probe.WipeAll(ctx, raw.real); err != nil {
			return failed("wipe", err, "erasing what %s holds", raw.path)
		}
		o.changed = true
		o.step("signatures-wiped", "lv", raw.path, "found", what)
		return nil
	}
	if err := lvm.Remove(ctx, s.LVMLogicalVolume.VGName, rec.LVUUID); err != nil {
		return failed("lvremove", err, "removing the new logical volume %s after finding %s on it", raw.path, what)
	}
	o.step("lv-removed", "lv", raw.path, "found", what)
	if err := e.State.Remove(s.UUID); err != nil {
		return failed("state", err, "removing state of %s", s.Name)
	}
	return refused("lv_signatures", "lvmLogicalVolume: the new logical volume %s held %s, left by an earlier LV on the same extents: it was removed again and nothing changed; set lvmLogicalVolume.wipeSignatures: true to erase that and use the space",
		raw.path, what)
}

func roundUp(n, unit int64) int64 {
	if unit <= 0 {
		return n
	}
	return (n + unit - 1) / unit * unit
}

func (e *Engine) inspectLVM(s *spec.Spec, rec *nodestate.Record, res *Result) {
	res.PersistentPath = persistentPath(s, rec)
	var name string
	if rec != nil {
		name = deviceOf(rec)
	}
	if name != "" {
		res.DeviceName, res.DevicePath = name, "/dev/"+name
		res.Size, _ = blockdev.SizeOf(name)
	}
	switch {
	case rec == nil:
		res.State = StateAbsent
	case rec.Phase != nodestate.PhasePrepared:
		res.State = StateIncomplete
	case name == "":
		res.State = StateMissing
		res.Error = "logical volume " + s.LVMLogicalVolume.VGName + "/" + s.Name + " (LVM UUID " + rec.LVUUID + ") is not active or is gone: run salt-volume-exec restore"
	case s.Mode == spec.ModeFilesystem && !carriesUUID(s, name):
		res.State = StateDamaged
		res.Error = "/dev/" + name + " no longer carries the volume's " + expectedSignature(s) + ": " + recovery(s, "/dev/"+s.LVMLogicalVolume.VGName+"/"+s.Name)
	default:
		res.State = StatePrepared
		e.checkLink(s, res)
	}
}

// restoreLVM activates our LV if the boot did not, and links it.
func (e *Engine) restoreLVM(ctx context.Context, o *op, rec *nodestate.Record, res *Result) error {
	s := o.s
	name := deviceOf(rec)
	if name == "" {
		lv, err := lvm.GetLV(ctx, s.LVMLogicalVolume.VGName, s.Name)
		if err != nil || lv == nil || lv.UUID != rec.LVUUID || !lv.HasTag(lvTag(s)) {
			return failed("lv_missing", err, "logical volume %s/%s (LVM UUID %s) is not on this node", s.LVMLogicalVolume.VGName, s.Name, rec.LVUUID)
		}
		if name, err = e.activateLV(ctx, o, rec); err != nil {
			return err
		}
	}
	o.link = persistentPath(s, rec)
	return e.linkDevice(ctx, o, name, res)
}

// unprepareLVM keeps the LV and its data unless Wipe is set; with Wipe it
// zeroes the whole LV (verified) and removes it, only if the LV is the one
// we created (our tag and the recorded LVM UUID).
func (e *Engine) unprepareLVM(ctx context.Context, o *op, rec *nodestate.Record, opts UnprepareOptions, res *Result) error {
	s := o.s
	l := s.LVMLogicalVolume
	o.link = persistentPath(s, rec)
	name := deviceOf(rec)
	if name != "" {
		res.DeviceName, res.DevicePath = name, "/dev/"+name
		if err := e.refuseInUse(s, name, res); err != nil {
			return err
		}
	}
	if !opts.Wipe {
		if name != "" {
			res.Warnings = append(res.Warnings, "logical volume "+l.VGName+"/"+s.Name+" and its data are kept (delete with --wipe to remove it)")
		}
		if s.Mode == spec.ModeFilesystem {
			return e.removeLink(o, name)
		}
		return nil
	}
	if rec.LVUUID == "" {
		return nil // the prepare never created it
	}
	lv, err := lvm.GetLV(ctx, l.VGName, s.Name)
	if err != nil && !errors.Is(err, lvm.ErrNoVG) {
		return failed("lvm", err, "reading logical volume %s/%s", l.VGName, s.Name)
	}
	if lv == nil || lv.UUID != rec.LVUUID {
		res.Warnings = append(res.Warnings, "logical volume "+l.VGName+"/"+s.Name+" with LVM UUID "+rec.LVUUID+" is gone: nothing to remove")
		return e.removeLink(o, "")
	}
	if !lv.HasTag(lvTag(s)) {
		return refused("lv_not_ours", "logical volume %s/%s has lost the tag %s that salt-volumes put on it: not removing it (lvchange --addtag %s %s/%s if it is this volume's)",
			l.VGName, s.Name, lvTag(s), lvTag(s), l.VGName, s.Name)
	}
	if name == "" {
		if name, err = e.activateLV(ctx, o, rec); err != nil {
			return err
		}
		if err := e.refuseInUse(s, name, res); err != nil {
			return err
		}
	}
	if err := e.zeroAndVerify(o, nil, name, res); err != nil {
		return err
	}
	if err := lvm.Remove(ctx, l.VGName, rec.LVUUID); err != nil {
		return failed("lvremove", err, "removing logical volume %s/%s", l.VGName, s.Name)
	}
	o.step("lv-removed", "lv", l.VGName+"/"+s.Name)
	if rec.DMUUID != "" {
		// An unfinished clone's udev mark goes with its LV.
		_ = devlinks.Unhide(rec.DMUUID)
	}
	if s.Mode == spec.ModeFilesystem {
		return e.removeLink(o, "")
	}
	return nil
}

// prepareRawLV takes an existing LV as a Block volume as it is (seed 000):
// a device-mapper device has no partitions for a GPT of ours to name, and
// LVM's own UUID names it already. admitRaw found it blank and unused.
func (e *Engine) prepareRawLV(ctx context.Context, o *op, rec *nodestate.Record, raw *rawDevice, dm string, res *Result) error {
	if rec.DMUUID != dm {
		rec.DMUUID, o.unsaved = dm, true
	}
	o.markWritten(rec, writtenLV)
	if err := e.rememberDevice(rec, raw); err != nil {
		return err
	}
	o.link = persistentPath(o.s, rec)
	res.PersistentPath = o.link
	return e.linkDevice(ctx, o, raw.name, res)
}
