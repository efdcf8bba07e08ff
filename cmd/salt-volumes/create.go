package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
)

// createOpts are create's flags.
type createOpts struct {
	node, size, device, vg, thinPool, mode, fsType, uuid, from, encryption string
	wipeSignatures, wait                                                   bool
	mkfsOptions, labels, annotations                                       []string
	timeout                                                                time.Duration
}

// createCmd asks for a new volume, and with --wait follows it to
// Available.
func (c *cli) createCmd() *cobra.Command {
	var o createOpts
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a volume: a sparse file, a raw device, an LVM volume, or a clone",
		Long: `Create a volume on a node. One of --size (a sparse file on a loop device;
with --vg, a new LVM logical volume in that volume group) or --device (a raw
disk, partition or existing LV on the node); or --from, a clone of a
snapshot (snapshot/NAME), or of a volume as it is now (volume/NAME), made
on its node with its mode and filesystem.

The command returns at once, the volume in phase Unknown; with --wait it
follows the volume to Available, printing each step on stderr and the
volume on stdout, or exits 1 with the reason when it ends Failed. Bad input
is refused before anything happens (exit 2, naming the field), a name
already taken is exit 3.

The volume's uuid is made here when --uuid is not given. A request that
gets no answer is sent again (twice, with the same uuid), and a name taken
by a volume with the uuid asked (and the node) is this create's own, made
by a request whose answer was lost: exit 0, and --wait follows it. When
no answer comes at all (exit 7), the message gives the uuid: run the
command again with --uuid UUID and it takes the volume for its own if it
was made.`,
		Example: `  salt-volumes create data-1 --node node-1 --size 10Gi --wait
  salt-volumes create logs-1 --node node-1 --size 500Gi --fs xfs --mkfs-option=-m --mkfs-option=reflink=1
  salt-volumes create raw-1 --node node-2 --device /dev/disk/by-id/nvme-SSD_1234 --mode Block
  salt-volumes create db-1 --node node-2 --vg vg0 --size 20Gi --label tier=db
  salt-volumes create secrets-1 --node node-1 --size 1Gi --encryption keyfile
  salt-volumes create data-2 --from snapshot/before-upgrade --wait -o json`,
		Args: exactArgs(1, "give exactly one volume NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "volume")
			if err != nil {
				return err
			}
			if o.node, err = argName(cmd, o.node, "node"); err != nil {
				return err
			}
			return c.create(cmd, &o, name)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.node, "node", "", "the Salt minion id of the `NODE` that holds the volume (required, but with --from)")
	f.StringVar(&o.size, "size", "", "size of a sparse file or, with --vg, of the logical volume: 10Gi, 500M, bytes")
	f.StringVar(&o.device, "device", "", "raw block device or partition on the node, e.g. /dev/sdb")
	f.StringVar(&o.vg, "vg", "", "LVM volume group to create the volume's logical volume in (with --size)")
	f.BoolVar(&o.wipeSignatures, "wipe-signatures", false, "with --vg: erase what an earlier LV left on the new LV's extents (refused otherwise)")
	f.StringVar(&o.thinPool, "thin-pool", "", "with --vg: make a thin LV in this thin pool of the VG (its snapshots are thin too)")
	f.StringVar(&o.mode, "mode", "Filesystem", "Filesystem or Block")
	f.StringVar(&o.fsType, "fs", "", "ext4 (default) or xfs; Filesystem mode only")
	f.StringVar(&o.uuid, "uuid", "", "volume UUID (default: a new random one); a volume of this name and UUID on --node found already is this create's own (exit 0)")
	f.StringArrayVar(&o.mkfsOptions, "mkfs-option", nil, "an option passed to mkfs (repeat for each)")
	f.StringVar(&o.encryption, "encryption", "", "encrypt the volume (LUKS2) with a key from `PROVIDER`: keyfile (a random key kept root-only on the node) or master (a key the Salt master keeps in pillar at salt_volumes:keys:NAME); sparse volumes (--size without --vg)")
	f.StringArrayVar(&o.labels, "label", nil, "`KEY=VALUE`: a label for the volume's PersistentVolume (repeat for each; ls --selector filters on them)")
	f.StringArrayVar(&o.annotations, "annotation", nil, "`KEY=VALUE`: an annotation for the volume's PersistentVolume (repeat for each)")
	f.StringVar(&o.from, "from", "", "snapshot/NAME or volume/NAME: a clone of that snapshot, or of the volume as it is now, on its node, of its mode and filesystem (--size: the same or larger)")
	f.BoolVar(&o.wait, "wait", false, "wait until the volume is Available (or Failed), printing its steps on stderr")
	timeoutFlag(cmd, &o.timeout, "with --wait: how long to wait")
	_ = cmd.RegisterFlagCompletionFunc("node", c.completeFlag(listNodes))
	_ = cmd.RegisterFlagCompletionFunc("from", c.completeFlag(listSnapshots, listVolumes))
	_ = cmd.RegisterFlagCompletionFunc("mode", fixed("Filesystem", "Block"))
	_ = cmd.RegisterFlagCompletionFunc("fs", fixed("ext4", "xfs"))
	_ = cmd.RegisterFlagCompletionFunc("encryption", fixed("keyfile", "master"))
	for _, free := range []string{"size", "device", "vg", "thin-pool", "uuid", "mkfs-option", "label", "annotation"} {
		_ = cmd.RegisterFlagCompletionFunc(free, cobra.NoFileCompletions)
	}
	return objects(cmd, objectFormats...)
}

func (c *cli) create(cmd *cobra.Command, o *createOpts, name string) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	// The uuid is made here when not given, as the server would make it:
	// a create asked again after no answer knows its own volume by it.
	given := o.uuid != ""
	if !given {
		o.uuid = uuid.NewString()
	}
	var source map[string]any
	var helper string // the snapshot taken for this clone alone, if any
	if o.from != "" {
		// Resolved here: the volume spec names the snapshot by its
		// volume's uuid and its name, on the clone's own node.
		kind, from, _ := strings.Cut(o.from, "/")
		if (kind != "snapshot" && kind != "volume") || from == "" {
			return usagef(cmd, "--from %q: write snapshot/NAME (salt-volumes snapshot ls lists them) or volume/NAME", o.from)
		}
		if o.device != "" || o.thinPool != "" {
			return usagef(cmd, "--from makes a clone where its snapshot is (a sparse file, or an LV in the snapshot's VG and pool): leave out --device and --thin-pool")
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
			if v, err := cl.Get(ctx, name); err == nil {
				if given && strings.EqualFold(v.Spec.UUID, o.uuid) {
					// An earlier try of this command (the same --uuid)
					// made it, its answer lost: ours.
					return c.created(cmd, cl, o, v, true)
				}
				return failf(exitRefused, "create: volume %s exists: pick another name for the clone (nothing was taken)", name)
			} else if !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
				return err
			}
			helper = cloneHelperName(name)
			d, terr := c.waitTimeout(cmd, cl, o.timeout)
			if terr != nil {
				return terr
			}
			if snap, err = cl.TakeSnapshotFor(ctx, from, helper, name); err == nil {
				snap, err = c.waitSnapshot(ctx, cl, snap.Name, false, d)
			}
		} else {
			snap, err = cl.Snapshot(ctx, from)
		}
		if err != nil {
			return err
		}
		if snap.Phase != "Ready" {
			return failf(exitUsage, "create: --from %s: the snapshot is %s, not Ready: %s", o.from, cleanCell(snap.Phase), cleanCell(snap.Message))
		}
		if o.node != "" && o.node != snap.Node {
			return failf(exitUsage, "create: --node %s: snapshot %s is on %s, and a clone is made on its snapshot's node: leave --node out", o.node, from, snap.Node)
		}
		o.node = snap.Node
		if snap.LV != "" {
			// An LVM snapshot's clone is an LV in the same VG.
			snapVG, _, _ := strings.Cut(snap.LV, "/")
			if o.vg != "" && o.vg != snapVG {
				return failf(exitUsage, "create: --vg %s: snapshot %s is in volume group %s, where its clone is made too: leave --vg out", o.vg, snap.Name, snapVG)
			}
			o.vg = snapVG
		} else if o.vg != "" {
			return failf(exitUsage, "create: --vg: snapshot %s is a sparse volume's: its clone is a sparse volume too; leave --vg out", snap.Name)
		}
		if o.size == "" {
			o.size = fmt.Sprint(snap.Size)
		}
		if src, err := cl.Get(ctx, snap.Volume); err == nil {
			if !cmd.Flags().Changed("mode") {
				o.mode = cmp.Or(src.Spec.Mode, o.mode)
			}
			if o.fsType == "" {
				o.fsType = src.Spec.FSType
			}
		}
		source = map[string]any{"volumeUUID": snap.VolumeUUID, "snapshot": snap.Name}
	}
	sp, err := o.spec(cmd, name)
	if err != nil {
		return err
	}
	if source != nil {
		sp["source"] = source
	}
	v, mine, answered, err := c.createOnce(ctx, cl, sp, name, o)
	if err != nil {
		if helper == "" {
			return err
		}
		var ce *client.Error
		if answered && errors.As(err, &ce) {
			// Its clone was refused, every try answered: the snapshot
			// taken for it alone goes too (the control plane would keep
			// it an hour).
			_, _ = cl.DeleteSnapshot(ctx, helper)
			return err
		}
		// Whether the clone was recorded is not known: its snapshot
		// stays, or a clone recorded would be made from one Deleting.
		return hint(err, "the snapshot %s taken for the clone is kept: if salt-volumes get %s finds no volume, salt-volumes snapshot rm %s removes it (the control plane does within an hour)", helper, name, helper)
	}
	return c.created(cmd, cl, o, v, mine)
}

// created prints the volume a create made, or follows it with --wait;
// earlier says an earlier try made it (its answer lost).
func (c *cli) created(cmd *cobra.Command, cl *client.Client, o *createOpts, v saltvolumes.View, earlier bool) error {
	if earlier {
		line(c.errw, "volume %s exists with uuid %s, as asked: an earlier try made it", v.Spec.Name, v.Spec.UUID)
	}
	if !o.wait {
		return c.showVolume(v)
	}
	d, err := c.waitTimeout(cmd, cl, o.timeout)
	if err != nil {
		return err
	}
	_, err = c.follow(cmd.Context(), cl, v.Spec.Name, "Available", d)
	return err
}

// resendAfter are the pauses before a request that got no answer is sent
// again, within one command (a variable for the tests).
var resendAfter = []time.Duration{time.Second, 2 * time.Second}

// createOnce creates the volume of sp (whose uuid is o.uuid) once,
// however many requests it takes: one that gets no answer is sent again,
// and a name taken by a volume of this uuid (the node asked, too) is
// this create's own, made by a request whose answer was lost, or by an
// earlier run of the command with the same --uuid: mine. answered: every
// request got an answer, so an error is the server's refusal, and
// nothing was made.
func (c *cli) createOnce(ctx context.Context, cl *client.Client, sp map[string]any, name string, o *createOpts) (v saltvolumes.View, mine, answered bool, err error) {
	answered = true
	for try := 0; ; try++ {
		v, err = cl.Create(ctx, sp)
		if err == nil {
			return v, false, answered, nil
		}
		var te *client.TransportError
		if errors.As(err, &te) {
			answered = false
			if te.Retryable() && try < len(resendAfter) && sleep(ctx, resendAfter[try]) {
				continue
			}
			if te.Retryable() {
				err = hint(err, "no answer creating volume %s (uuid %s): it may have been made; salt-volumes get %s says, and running this command again with --uuid %s takes that volume for its own", name, o.uuid, name, o.uuid)
			}
			return v, false, false, err
		}
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status == http.StatusConflict && ce.Body.Code == saltvolumes.CodeExists {
			if got, gerr := cl.Get(ctx, name); gerr == nil && strings.EqualFold(got.Spec.UUID, o.uuid) && got.Spec.Node == o.node {
				return got, true, answered, nil
			}
		}
		return v, false, answered, err
	}
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// spec is the volume spec the flags describe, as the API reads it.
func (o *createOpts) spec(cmd *cobra.Command, name string) (map[string]any, error) {
	switch {
	case o.node == "":
		return nil, usagef(cmd, "--node: missing: the Salt minion id that will hold the volume")
	case (o.size == "") == (o.device == ""):
		return nil, usagef(cmd, "give exactly one of --size (sparse file, or an LV with --vg) and --device (raw device)")
	case o.vg != "" && o.size == "":
		return nil, usagef(cmd, "--vg needs --size, the logical volume's size")
	case o.wipeSignatures && o.vg == "":
		return nil, usagef(cmd, "--wipe-signatures is for a logical volume: give --vg too")
	case o.thinPool != "" && o.vg == "":
		return nil, usagef(cmd, "--thin-pool is for a logical volume: give --vg too")
	}
	sp := map[string]any{"name": name, "node": o.node, "mode": o.mode}
	sp["uuid"] = o.uuid
	if o.fsType != "" {
		sp["fsType"] = o.fsType
	}
	if len(o.mkfsOptions) > 0 {
		sp["mkfsOptions"] = o.mkfsOptions
	}
	if o.encryption != "" {
		sp["encryption"] = map[string]any{"provider": o.encryption}
	}
	if len(o.labels)+len(o.annotations) > 0 {
		md := map[string]any{}
		for _, f := range []struct {
			flag string
			kvs  []string
		}{{"label", o.labels}, {"annotation", o.annotations}} {
			if len(f.kvs) == 0 {
				continue
			}
			m := map[string]string{}
			for _, kv := range f.kvs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, usagef(cmd, "--%s %q: write KEY=VALUE", f.flag, kv)
				}
				m[k] = v
			}
			md[f.flag+"s"] = m
		}
		sp["template"] = map[string]any{"metadata": md}
	}
	switch {
	case o.vg != "":
		l := map[string]any{"vgName": o.vg, "size": o.size}
		if o.wipeSignatures {
			l["wipeSignatures"] = true
		}
		if o.thinPool != "" {
			l["thinPool"] = o.thinPool
		}
		sp["lvmLogicalVolume"] = l
	case o.size != "":
		sp["sparseLoopDevice"] = map[string]any{"size": o.size}
	default:
		sp["rawBlockDevice"] = map[string]any{"devicePath": o.device}
	}
	return sp, nil
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
