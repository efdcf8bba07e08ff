package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
)

// create asks for a new volume, and with --wait follows it to Available.
func (c *cli) create(ctx context.Context, in []string) error {
	fs := c.flags("create")
	node := fs.String("node", "", "Salt minion id that holds the volume (required)")
	size := fs.String("size", "", "size of a sparse file or, with --vg, of the logical volume: 10Gi, 500M, bytes")
	device := fs.String("device", "", "raw block device or partition on the node, e.g. /dev/sdb")
	vg := fs.String("vg", "", "LVM volume group to create the volume's logical volume in (with --size)")
	wipeSigs := fs.Bool("wipe-signatures", false, "with --vg: erase what an earlier LV left on the new LV's extents (refused otherwise)")
	thinPool := fs.String("thin-pool", "", "with --vg: make a thin LV in this thin pool of the VG (its snapshots are thin too)")
	mode := fs.String("mode", "Filesystem", "Filesystem or Block")
	fsType := fs.String("fs", "", "ext4 (default) or xfs; Filesystem mode only")
	id := fs.String("uuid", "", "volume UUID (default: a new random one)")
	var mkfs multi
	fs.Var(&mkfs, "mkfs-option", "option passed to mkfs (repeat for each)")
	var labels, annotations multi
	fs.Var(&labels, "label", "KEY=VALUE: a label for the volume's PersistentVolume (repeat for each)")
	fs.Var(&annotations, "annotation", "KEY=VALUE: an annotation for the volume's PersistentVolume (repeat for each)")
	from := fs.String("from", "", "snapshot/NAME or volume/NAME: a clone of that snapshot, or of the volume as it is now, on its node, of its mode and filesystem (--size: the same or larger)")
	wait := fs.Bool("wait", false, "wait until the volume is Available (or Failed)")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
	pos, cl, err := c.open(fs, in, 1, "give exactly one volume NAME")
	if err != nil {
		return err
	}
	var source map[string]any
	var helper string // the snapshot taken for this clone alone, if any
	if *from != "" {
		// Resolved here: the volume spec names the snapshot by its
		// volume's uuid and its name, on the clone's own node.
		kind, name, _ := strings.Cut(*from, "/")
		if (kind != "snapshot" && kind != "volume") || name == "" {
			return failf(exitUsage, "create: --from %q: write snapshot/NAME (salt-volumes snapshot ls lists them) or volume/NAME", *from)
		}
		if *device != "" || *thinPool != "" {
			return failf(exitUsage, "create: --from makes a clone where its snapshot is (a sparse file, or an LV in the snapshot's VG and pool): leave out --device and --thin-pool")
		}
		var snap saltvolumes.Snapshot
		var err error
		if kind == "volume" {
			// A snapshot for this clone alone, taken now: the control
			// plane deletes it once the clone is Available (or after an
			// hour, if this command never gets to create the clone).
			// A name taken already would leave the helper snapshot
			// behind: its clone could never be made.
			var ce *client.Error
			if _, err := cl.Get(ctx, pos[0]); err == nil {
				return failf(exitUsage, "create: volume %s exists: pick another name for the clone (nothing was taken)", pos[0])
			} else if !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
				return err
			}
			helper = cloneHelperName(pos[0])
			if snap, err = cl.TakeSnapshotFor(ctx, name, helper, pos[0]); err == nil {
				snap, err = c.waitSnapshot(ctx, cl, snap.Name, false, *timeout)
			}
		} else {
			snap, err = cl.Snapshot(ctx, name)
		}
		if err != nil {
			return err
		}
		if snap.Phase != "Ready" {
			return failf(exitUsage, "create: --from %s: the snapshot is %s, not Ready: %s", *from, snap.Phase, snap.Message)
		}
		if *node != "" && *node != snap.Node {
			return failf(exitUsage, "create: --node %s: snapshot %s is on %s, and a clone is made on its snapshot's node: leave --node out", *node, name, snap.Node)
		}
		*node = snap.Node
		if snap.LV != "" {
			// An LVM snapshot's clone is an LV in the same VG.
			snapVG, _, _ := strings.Cut(snap.LV, "/")
			if *vg != "" && *vg != snapVG {
				return failf(exitUsage, "create: --vg %s: snapshot %s is in volume group %s, where its clone is made too: leave --vg out", *vg, snap.Name, snapVG)
			}
			*vg = snapVG
		} else if *vg != "" {
			return failf(exitUsage, "create: --vg: snapshot %s is a sparse volume's: its clone is a sparse volume too; leave --vg out", snap.Name)
		}
		if *size == "" {
			*size = fmt.Sprint(snap.Size)
		}
		if src, err := cl.Get(ctx, snap.Volume); err == nil {
			if !isSet(fs, "mode") {
				*mode = cmp.Or(src.Spec.Mode, *mode)
			}
			if *fsType == "" {
				*fsType = src.Spec.FSType
			}
		}
		source = map[string]any{"volumeUUID": snap.VolumeUUID, "snapshot": snap.Name}
	}
	if *node == "" {
		return failf(exitUsage, "create: --node: missing: the Salt minion id that will hold the volume")
	}
	if (*size == "") == (*device == "") {
		return failf(exitUsage, "create: give exactly one of --size (sparse file, or an LV with --vg) and --device (raw device)")
	}
	if *vg != "" && *size == "" {
		return failf(exitUsage, "create: --vg needs --size, the logical volume's size")
	}
	if *wipeSigs && *vg == "" {
		return failf(exitUsage, "create: --wipe-signatures is for a logical volume: give --vg too")
	}
	if *thinPool != "" && *vg == "" {
		return failf(exitUsage, "create: --thin-pool is for a logical volume: give --vg too")
	}
	sp := map[string]any{"name": pos[0], "node": *node, "mode": *mode}
	if *id != "" {
		sp["uuid"] = *id
	}
	if *fsType != "" {
		sp["fsType"] = *fsType
	}
	if len(mkfs) > 0 {
		sp["mkfsOptions"] = []string(mkfs)
	}
	if len(labels)+len(annotations) > 0 {
		md := map[string]any{}
		for flag, kvs := range map[string]multi{"label": labels, "annotation": annotations} {
			if len(kvs) == 0 {
				continue
			}
			m := map[string]string{}
			for _, kv := range kvs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return failf(exitUsage, "create: --%s %q: write KEY=VALUE", flag, kv)
				}
				m[k] = v
			}
			md[flag+"s"] = m
		}
		sp["template"] = map[string]any{"metadata": md}
	}
	switch {
	case *vg != "":
		l := map[string]any{"vgName": *vg, "size": *size}
		if *wipeSigs {
			l["wipeSignatures"] = true
		}
		if *thinPool != "" {
			l["thinPool"] = *thinPool
		}
		sp["lvmLogicalVolume"] = l
	case *size != "":
		sp["sparseLoopDevice"] = map[string]any{"size": *size}
	default:
		sp["rawBlockDevice"] = map[string]any{"devicePath": *device}
	}
	if source != nil {
		sp["source"] = source
	}
	v, err := cl.Create(ctx, sp)
	if err != nil {
		if helper != "" {
			// Its clone was refused: the snapshot taken for it alone
			// goes too (the control plane would keep it an hour).
			_, _ = cl.DeleteSnapshot(ctx, helper)
		}
		return err
	}
	if !*wait {
		return c.show(v)
	}
	return c.waitFor(ctx, cl, v.Spec.Name, "Available", *timeout)
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// cloneHelperName names the snapshot a clone of a volume as it is now is
// made from: unique to this command, since taking a snapshot of a name that
// exists answers the one taken then (an earlier, failed try's, whose data
// is stale by now), and no two clone names share one when cut to fit.
func cloneHelperName(clone string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	// "clone-" + at most 48 of the name + "-" + 8 hex digits: 63.
	return "clone-" + strings.TrimRight(clone[:min(48, len(clone))], "-.") + "-" + hex.EncodeToString(b[:])
}
