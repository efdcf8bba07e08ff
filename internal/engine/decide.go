package engine

import (
	"fmt"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/luks"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// The decisions that protect data are pure functions of facts gathered from
// the host (facts.go), so that each refusal is a table test that needs no
// root and no devices (decide_test.go); test/nodeexec proves the same rules
// on real loop devices.

const devicePathField = "rawBlockDevice.devicePath"

// targetFacts describe a raw device before the first write to it.
type targetFacts struct {
	Path  string // as the user gave it
	Usage blockdev.Usage
	// Busy is set when an exclusive open failed: a mount in another mount
	// namespace, or a stacked device that sysfs does not show.
	Busy error
	// Signatures is libblkid's full list, named first as it is the more
	// precise; Own is our in-process probe, which also sees a backup GPT or
	// an md superblock at the end of the device.
	Own        probe.Result
	Signatures []probe.Signature
	Children   []string
	// HeldBy names a volume of this node whose device is, contains or is
	// contained by this one.
	HeldBy string
}

// decideTarget refuses a raw device that is not blank, unused and whole.
func decideTarget(f targetFacts) error {
	switch {
	case f.HeldBy != "":
		return refused("device_conflict", "%s: %s is, contains or is part of the device of volume %s on this node: give a device no volume uses", devicePathField, f.Path, f.HeldBy)
	case f.Usage.InUse():
		return refused("in_use", "%s: %s is %s: refusing to touch it", devicePathField, f.Path, f.Usage)
	case f.Busy != nil:
		return refused("in_use", "%s: %s is %v: refusing to touch it", devicePathField, f.Path, f.Busy)
	case len(f.Signatures) > 0:
		names := make([]string, len(f.Signatures))
		for i, s := range f.Signatures {
			names[i] = s.String()
		}
		return refused("foreign_data", "%s: %s holds a %s that is not this volume's: refusing to overwrite it (wipe it yourself if it is really unused, e.g. wipefs -a %s)", devicePathField, f.Path, strings.Join(names, ", "), f.Path)
	case !f.Own.Empty():
		return refused("foreign_data", "%s: %s holds a %s that is not this volume's: refusing to overwrite it (wipe it yourself if it is really unused, e.g. wipefs -a %s)", devicePathField, f.Path, f.Own, f.Path)
	case len(f.Children) > 0:
		return refused("foreign_data", "%s: %s has partitions (%s): refusing to overwrite them", devicePathField, f.Path, strings.Join(f.Children, ", "))
	}
	return nil
}

// contentAction is what prepare does with the storage's current content.
type contentAction int

const (
	keepContent    contentAction = iota // it is this volume's: write nothing
	writeContent                        // blank: format or partition it
	rewriteContent                      // our own interrupted write: redo it, forcing mkfs
)

// contentFacts describe what the volume's storage holds now.
type contentFacts struct {
	Where     string       // the file or device, for messages
	Ours      bool         // it carries this volume's own signature
	Found     probe.Result // what is there
	Formatted bool         // the record says we finished writing it
	// OurFile is set for a sparse file we created under our record: any
	// content that is not ours comes from our own interrupted write.
	OurFile bool
}

// decideContent never formats a volume twice: once the record says we wrote
// it, a missing signature means damage, and damage is reported with the way
// to recover, not erased by a new mkfs.
func decideContent(s *spec.Spec, c contentFacts) (contentAction, error) {
	switch {
	case c.Ours:
		return keepContent, nil
	case c.Formatted:
		return 0, refused("damaged", "volume %s: %s was prepared by salt-volumes but no longer carries the volume's %s (found %s): not writing it again, its data may be recoverable (%s), then run prepare again",
			s.Name, c.Where, expectedSignature(s), c.Found, recovery(s, c.Where))
	case c.Found.Empty():
		return writeContent, nil
	case c.OurFile:
		return rewriteContent, nil
	}
	return 0, refused("foreign_data", "%s: %s holds a %s that salt-volumes did not write: refusing to overwrite it", devicePathField, c.Where, c.Found)
}

func expectedSignature(s *spec.Spec) string {
	if encrypted(s) {
		return "LUKS2 header " + luks.ContainerUUID(s.UUID)
	}
	if s.Mode == spec.ModeBlock {
		return "GPT partition " + s.UUID
	}
	return s.FSType + " filesystem " + s.UUID
}

func recovery(s *spec.Spec, where string) string {
	switch {
	case encrypted(s):
		return "cryptsetup repair " + where + " rebuilds a LUKS2 header from its second copy; a header backup (cryptsetup luksHeaderRestore) brings one back"
	case s.Mode == spec.ModeBlock:
		return "gdisk " + where + " can rebuild the primary table from the backup"
	case s.FSType == spec.FSXFS:
		return "xfs_repair " + where + " finds a secondary superblock"
	}
	return "e2fsck -b 32768 " + where + " uses a backup superblock"
}

// carrier is a device that carries a UUID, as a filesystem UUID or a GPT
// partition GUID.
type carrier struct {
	Name string // kernel name
	What string
}

// decideUUID refuses a volume UUID that a device outside this volume
// already carries: adopting it, linking it or later wiping it would act on
// someone else's data.
func decideUUID(s *spec.Spec, carriers []carrier, mine map[string]bool) error {
	for _, c := range carriers {
		if !mine[c.Name] {
			return refused("uuid_in_use", "uuid: %s is already carried by /dev/%s (%s), which is not this volume's storage: choose another uuid", s.UUID, c.Name, c.What)
		}
	}
	return nil
}

// labelHolder is a device that carries a label a new volume wants.
type labelHolder struct {
	carrier
	Label wantedLabel
}

// decideLabels refuses a label a new volume would write that a device
// outside this volume already carries: udev links whichever device it saw
// last, so the node's fstab (LABEL=data) could mount ours in place of its
// own at the next boot.
func decideLabels(holders []labelHolder, mine map[string]bool) error {
	for _, h := range holders {
		if mine[h.Name] {
			continue
		}
		field, fix, link := "mkfsOptions", "choose another -L label or leave it out", "by-label"
		if h.Label.Kind == "PARTLABEL" {
			field, fix, link = "name", "choose another volume name (it becomes the GPT partition name)", "by-partlabel"
		}
		return refused("label_in_use", "%s: %s=%s is already carried by /dev/%s (%s): the node's fstab and /dev/disk/%s could find this volume in its place; %s",
			field, h.Label.Kind, h.Label.Value, h.Name, h.What, link, fix)
	}
	return nil
}

// linkFacts describe the persistent link before we write or remove it.
type linkFacts struct {
	Target string // kernel name the link names; "" if there is no link
	Exists bool   // that device exists
	// Carries is set when that device carries the volume's UUID.
	Carries bool
}

// linkIsOurs: a link is ours to replace or remove when it is absent, names
// our device, dangles, or names a device that does not carry the volume's
// UUID (a stale name, e.g. a loop number reused after a reboot). A link to
// another device that carries the UUID belongs to that device.
func linkIsOurs(l linkFacts, ourDevice string) bool {
	return l.Target == "" || l.Target == ourDevice || !l.Exists || !l.Carries
}

// wipeFacts describe a raw volume's device right before --wipe.
type wipeFacts struct {
	Written string // what the record says we wrote
	Ours    bool   // the device still carries this volume's signature
	// For a GPT on a whole disk: the disk GUID we recorded, the one found,
	// and whether the table holds exactly the one partition we laid out.
	RecordedDiskGUID, DiskGUID string
	OurLayout                  bool
}

type wipeAction int

const (
	wipeNothing wipeAction = iota
	wipeSuperblock
	wipeTable
	resetGUID
)

// decideWipe erases only what we wrote and can still prove is ours.
func decideWipe(s *spec.Spec, device string, w wipeFacts) (wipeAction, error) {
	if !w.Ours {
		return wipeNothing, refused("foreign_data", "%s no longer carries volume %s: not wiping", device, s.UUID)
	}
	switch w.Written {
	case spec.FSExt4, spec.FSXFS:
		return wipeSuperblock, nil
	case "gpt":
		if w.OurLayout && (w.RecordedDiskGUID == "" || w.RecordedDiskGUID == w.DiskGUID) {
			return wipeTable, nil
		}
		return wipeNothing, refused("foreign_data", "the partition table of %s is not the one salt-volumes wrote (disk GUID %s, recorded %s): not wiping", device, w.DiskGUID, w.RecordedDiskGUID)
	case "guid":
		return resetGUID, nil
	}
	return wipeNothing, fmt.Errorf("the record of volume %s does not say what was written (%q): not wiping", s.Name, w.Written)
}
