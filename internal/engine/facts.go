package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/devlinks"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// Gathering the facts the decisions in decide.go take. Nothing here writes
// to a device; the one exception, CheckExclusive, opens and closes.

// gatherTarget reads everything decideTarget needs about a raw device.
func gatherTarget(ctx context.Context, raw *rawDevice, heldBy string, sigs *pendingSignatures) (targetFacts, error) {
	f := targetFacts{Path: raw.path, HeldBy: heldBy}
	if heldBy != "" {
		return f, nil
	}
	var err error
	if f.Usage, err = blockdev.UsageOf(raw.name); err != nil {
		return f, failed("usage", err, "checking whether %s is in use", raw.path)
	}
	dev := "/dev/" + raw.name
	f.Busy = blockdev.CheckExclusive(dev)
	if f.Busy != nil && f.Busy != blockdev.ErrBusy {
		return f, failed("usage", f.Busy, "checking whether %s is in use", raw.path)
	}
	if f.Own, _, _, err = openProbe(dev); err != nil {
		return f, failed("probe", err, "reading %s", raw.path)
	}
	if sigs == nil {
		sigs = startSignatures(ctx, dev)
	}
	if f.Signatures, err = sigs.wait(); err != nil {
		return f, refused("probe", "%s: cannot prove %s is blank: %v", devicePathField, raw.path, err)
	}
	f.Children, _ = blockdev.Children(raw.name)
	return f, nil
}

// pendingSignatures is libblkid's probe of a device, started before the
// checks that come first so that it runs beside them: it spends its time
// waiting on the device (and on starting wipefs), not on the CPU.
type pendingSignatures struct {
	done chan struct{}
	sigs []probe.Signature
	err  error
}

func startSignatures(ctx context.Context, dev string) *pendingSignatures {
	p := &pendingSignatures{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.sigs, p.err = probe.Signatures(ctx, dev)
	}()
	return p
}

func (p *pendingSignatures) wait() ([]probe.Signature, error) {
	<-p.done
	return p.sigs, p.err
}

// holdings maps the kernel name of every device that is, or is part of, a
// volume recorded on this node to that volume's name. except leaves out one
// volume (the one being prepared).
func (e *Engine) holdings(recs []*nodestate.Record, except string) map[string]string {
	held := map[string]string{}
	idx, _ := loopdev.NewIndex() // once: records times loop devices would be quadratic
	for _, r := range recs {
		if r.Spec.UUID == except {
			continue
		}
		// Without the disk of a partition whose GUID a volume set: its
		// sibling partitions may be volumes too, while the whole disk is
		// still refused (it contains the volume's partition).
		for _, n := range e.devicesIn(idx, r, false) {
			held[n] = r.Spec.Name
		}
	}
	return held
}

// devicesOf lists the kernel names of a recorded volume's devices: the
// loop devices of its sparse file, or its raw device (and the disk of a
// partition whose GUID we set), each with its partitions.
func (e *Engine) devicesOf(r *nodestate.Record) []string {
	idx, _ := loopdev.NewIndex()
	return e.devicesIn(idx, r, true)
}

// devicesIn is devicesOf with a loop index at hand; withParent adds the
// disk (and its partitions) of a partition whose GUID the volume set,
// which carries the volume's UUID in its table.
func (e *Engine) devicesIn(idx loopdev.Index, r *nodestate.Record, withParent bool) []string {
	var names []string
	if r.Spec.SparseLoopDevice != nil {
		devs := idx.Find(e.State.SparseFile(r.Spec.UUID))
		for _, d := range devs {
			names = append(names, d.Name)
		}
		if encrypted(r.Spec) {
			if m, ok := e.mapping(r.Spec, devs); ok {
				names = append(names, m.Device)
			}
		}
	} else {
		if n := deviceOf(r); n != "" {
			names = append(names, n)
		}
		if d, ok := parseDev(r.ParentNum); ok && withParent && r.Spec.Mode == spec.ModeBlock {
			if n, err := blockdev.Name(d); err == nil {
				names = append(names, n)
			}
		}
	}
	out := names
	for _, n := range names {
		kids, _ := blockdev.Children(n)
		out = append(out, kids...)
	}
	return out
}

// heldBy names the volume whose devices the raw device is, contains, or is
// part of, including through a loop device stacked on either side.
func heldBy(raw *rawDevice, held map[string]string) string {
	family := []string{raw.name}
	if p, isPart, _ := blockdev.Partition(raw.name); isPart {
		family = append(family, p.Parent)
	}
	kids, _ := blockdev.Children(raw.name)
	family = append(family, kids...)
	for _, n := range append([]string(nil), family...) {
		if back, ok := blockdev.LoopBacking(n); ok {
			if bn, err := blockdev.Name(back); err == nil {
				family = append(family, bn)
			}
		}
	}
	for _, n := range family {
		if v, ok := held[n]; ok {
			return v
		}
	}
	return ""
}

func parseDev(s string) (blockdev.Dev, bool) {
	var d blockdev.Dev
	_, err := fmt.Sscanf(s, "%d:%d", &d.Major, &d.Minor)
	return d, err == nil && s == d.String()
}

// scanDevices lists the block devices worth reading: disks, partitions and
// bound loop devices with a size, not RAM disks. /proc/partitions lists
// exactly the devices that have a size, partitions included, in one read
// (unbound loop devices are not there); sysfs is the fallback.
func scanDevices() []string {
	sized, err := blockdev.Sized()
	if err != nil {
		return scanSysBlock()
	}
	var out []string
	for _, d := range sized {
		if strings.HasPrefix(d.Name, "ram") || strings.HasPrefix(d.Name, "zram") {
			continue
		}
		if d.Blocks == 1 {
			continue // an extended partition's placeholder: nothing to read
		}
		out = append(out, d.Name)
	}
	return out
}

func scanSysBlock() []string {
	ents, err := os.ReadDir(blockdev.SysBlock)
	if err != nil {
		return nil
	}
	var out []string
	for _, ent := range ents {
		n := ent.Name()
		if strings.HasPrefix(n, "ram") || strings.HasPrefix(n, "zram") {
			continue
		}
		if strings.HasPrefix(n, "loop") {
			// Unbound loop devices have nothing to read: a stat each.
			if _, err := os.Stat(filepath.Join(blockdev.SysBlock, n, "loop")); err != nil {
				continue
			}
		}
		if size, err := blockdev.SizeOf(n); err != nil || size == 0 {
			continue // an empty drive or a dead device: nothing to read, and opening it may stall
		}
		out = append(out, n)
	}
	return out
}

// nodeScan is what every block device of the node was found to hold, read
// once for the checks a new volume needs.
type nodeScan struct {
	names []string
	found []probe.Result
}

func scanNode() nodeScan {
	names := scanDevices()
	return nodeScan{names: names, found: probeAll(names)}
}

// carriers finds every device whose filesystem UUID, or one of whose GPT
// partition GUIDs, is u. It reads the devices' own superblocks and tables
// (no udev needed), and also follows the persistent links, which name
// whatever udev's full prober found where udev runs.
func (n nodeScan) carriers(s *spec.Spec) []carrier {
	var out []carrier
	seen := map[string]bool{}
	add := func(name, what string) {
		if !seen[name] {
			seen[name] = true
			out = append(out, carrier{name, what})
		}
	}
	for i, r := range n.found {
		name := n.names[i]
		if r.UUID == s.UUID {
			add(name, r.Kind+" filesystem UUID")
		}
		if r.GPT != nil {
			for _, ent := range r.GPT.Entries {
				if ent.GUID == s.UUID {
					add(name, "GPT partition GUID of partition "+strconv.Itoa(ent.Index))
				}
			}
		}
	}
	// Where udev runs, its links are current and come from libblkid, which
	// knows more UUID kinds than our probe. A link we wrote ourselves may be
	// stale after a reboot (loop numbers are reused), so without udev only
	// a target that really carries the UUID counts.
	udev := devlinks.UdevRunning()
	for _, link := range []string{"/dev/disk/by-uuid/" + s.UUID, "/dev/disk/by-partuuid/" + s.UUID} {
		if t := linkTarget(link); t != "" && deviceExists(t) && (udev || carriesUUID(s, t)) {
			add(t, "named by "+link)
		}
	}
	return out
}

// wantedLabel is a name a new volume will carry that fstab (LABEL=,
// PARTLABEL=) and udev's /dev/disk/by-label and by-partlabel links resolve
// to a device.
type wantedLabel struct {
	Kind  string // LABEL or PARTLABEL
	Value string
}

// labelsOf lists the labels a volume's first prepare will write: the
// filesystem label mkfsOptions set, and the GPT partition name (the volume
// name) of a whole disk used in Block mode.
func labelsOf(s *spec.Spec, raw *rawDevice) []wantedLabel {
	var out []wantedLabel
	if l := s.FSLabel(); l != "" && s.Mode == spec.ModeFilesystem {
		out = append(out, wantedLabel{"LABEL", l})
	}
	if raw != nil && s.Mode == spec.ModeBlock {
		if _, isPart, err := blockdev.Partition(raw.name); err == nil && !isPart {
			out = append(out, wantedLabel{"PARTLABEL", s.Name})
		}
	}
	return out
}

// labelHolders finds the devices that already carry one of the wanted
// labels: what our probe reads, and where udev runs, what its links name
// (libblkid knows every filesystem's label).
func (n nodeScan) labelHolders(want []wantedLabel) []labelHolder {
	var out []labelHolder
	for _, w := range want {
		for i, r := range n.found {
			if w.Kind == "LABEL" && r.Label == w.Value {
				out = append(out, labelHolder{carrier{n.names[i], r.Kind + " filesystem label"}, w})
			}
			if w.Kind == "PARTLABEL" && r.GPT != nil {
				for _, ent := range r.GPT.Entries {
					if ent.Name == w.Value {
						out = append(out, labelHolder{carrier{n.names[i], "GPT name of partition " + strconv.Itoa(ent.Index)}, w})
					}
				}
			}
		}
		if devlinks.UdevRunning() {
			dir := "/dev/disk/by-label/"
			if w.Kind == "PARTLABEL" {
				dir = "/dev/disk/by-partlabel/"
			}
			if t := linkTarget(dir + udevEncode(w.Value)); t != "" && deviceExists(t) {
				out = append(out, labelHolder{carrier{t, "named by udev's link"}, w})
			}
		}
	}
	return out
}

// udevEncode escapes a label as udev names its link: bytes outside
// [0-9A-Za-z#+-.:=@_] (and outside valid UTF-8) become \xNN.
func udevEncode(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= '0' && c <= '9', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', strings.IndexByte("#+-.:=@_", c) >= 0:
			b.WriteByte(c)
		case c >= 0x80:
			r, size := utf8.DecodeRuneInString(v[i:])
			if r == utf8.RuneError {
				fmt.Fprintf(&b, "\\x%02x", c)
				continue
			}
			b.WriteString(v[i : i+size])
			i += size - 1
		default:
			fmt.Fprintf(&b, "\\x%02x", c)
		}
	}
	return b.String()
}

// probeAll probes the named devices at once: each probe waits on the
// device (a loop device's reads go through a kernel worker), so a node with
// many volumes would otherwise pay for them one after another. A device
// that cannot be read (gone meanwhile) has an empty result.
func probeAll(names []string) []probe.Result {
	out := make([]probe.Result, len(names))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if r, _, _, err := openProbe("/dev/" + n); err == nil {
				out[i] = r
			}
		}()
	}
	wg.Wait()
	return out
}

// linkTarget is the kernel name a /dev/disk link names ("" if no link).
func linkTarget(link string) string {
	t, err := os.Readlink(link)
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

func deviceExists(name string) bool {
	_, err := os.Stat(filepath.Join(blockdev.SysBlock, name))
	return err == nil
}

// gatherLink reads what linkIsOurs needs.
func gatherLink(s *spec.Spec, link string) linkFacts {
	l := linkFacts{Target: linkTarget(link)}
	if l.Target == "" {
		return l
	}
	l.Exists = deviceExists(l.Target)
	if l.Exists {
		l.Carries = carriesUUID(s, l.Target)
	}
	return l
}

// carriesUUID tells whether a device's own signature carries the volume's
// UUID, in the form the link names: the filesystem UUID, or the GUID of the
// partition in its disk's table.
func carriesUUID(s *spec.Spec, name string) bool {
	if p, isPart, _ := blockdev.Partition(name); isPart {
		r, _, ss, err := openProbe("/dev/" + p.Parent)
		if err == nil && r.GPT != nil {
			if ent, ok := r.GPT.Partition(p.Number); ok && ent.GUID == s.UUID && ent.Start(ss) == p.Start {
				return true
			}
		}
	}
	r, _, _, err := openProbe("/dev/" + name)
	return err == nil && r.UUID == s.UUID
}
