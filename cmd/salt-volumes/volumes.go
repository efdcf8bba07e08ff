package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// showVolumes prints a list of volumes in the -o format.
func (c *cli) showVolumes(items []saltvolumes.View) error {
	return c.emit(listOf(items), volumeNames(items), func(wide bool) error { return c.volumeTable(items, wide) })
}

// showVolume prints one volume: in a table, with what its node last
// reported of it under the row.
func (c *cli) showVolume(v saltvolumes.View) error {
	return c.emit(v, volumeNames([]saltvolumes.View{v}), func(wide bool) error {
		if err := c.volumeTable([]saltvolumes.View{v}, wide); err != nil {
			return err
		}
		if u := v.Usage; u != nil {
			text := "on the node: " + u.State
			if u.Allocated > 0 {
				text += ", allocated " + spec.Approx(u.Allocated)
			}
			if len(u.Mountpoints) > 0 {
				text += fmt.Sprintf(", filesystem used %s, free %s, mounted at %s", spec.Approx(u.FSUsed), spec.Approx(u.FSFree), strings.Join(u.Mountpoints, " "))
			}
			if u.Error != "" {
				text += ": " + u.Error
			}
			line(c.out, "%s (reported %s ago)", text, time.Since(u.ReportedAt).Truncate(time.Second))
		}
		return nil
	})
}

func volumeNames(items []saltvolumes.View) []string {
	names := make([]string, len(items))
	for i, v := range items {
		names[i] = v.Spec.Name
	}
	return named("volume", names...)
}

// detail is the one thing worth reading about a volume in its phase.
func detail(v saltvolumes.View) string {
	st := v.Status
	switch {
	case v.Deleting && (st.Phase == saltvolumes.Pending || st.Phase == saltvolumes.Unknown):
		return v.DeleteBlockedReason // the deletion waits for the creation
	case st.Message != "":
		return st.Message
	case st.Step != "" && st.Progress != nil && st.Progress.Total > 0:
		return fmt.Sprintf("step %s (%d %%)", st.Step, percent(*st.Progress))
	case st.Step != "":
		return "step " + st.Step
	case st.PersistentPath != "":
		return st.PersistentPath
	}
	return ""
}

func kind(v saltvolumes.View) string {
	switch {
	case v.Spec.SparseLoopDevice != nil:
		return "sparse"
	case v.Spec.LVMLogicalVolume != nil:
		return "lvm:" + v.Spec.LVMLogicalVolume.VGName
	case v.Spec.RawBlockDevice != nil:
		return "raw:" + v.Spec.RawBlockDevice.DevicePath
	}
	return "-"
}

// pvColumn is the PV's phase and claim (Kubernetes mode).
func pvColumn(v saltvolumes.View) string {
	pv := v.Status.PersistentVolume
	switch {
	case pv == nil:
		return "-"
	case pv.Terminating:
		return "Terminating"
	case pv.Claim != "":
		return pv.Phase + ":" + pv.Claim
	}
	return pv.Phase
}

func (c *cli) volumeTable(items []saltvolumes.View, wide bool) error {
	// The PV column only where there are PVs (Kubernetes mode).
	withPV := false
	for _, v := range items {
		withPV = withPV || v.Status.PersistentVolume != nil
	}
	head := []string{"NAME", "NODE", "KIND", "MODE", "FS", "SIZE", "PHASE"}
	if withPV {
		head = append(head, "PV")
	}
	head = append(head, "DEVICE", "AGE", "DETAIL")
	if wide {
		head = append(head, "UUID", "REASON", "JOB", "LABELS")
	}
	t := c.newTable(head...)
	for _, v := range items {
		size := "-"
		if v.Status.Size > 0 {
			size = spec.FormatSize(v.Status.Size)
		} else if v.Spec.SparseLoopDevice != nil {
			size = string(v.Spec.SparseLoopDevice.Size)
		} else if v.Spec.LVMLogicalVolume != nil {
			size = string(v.Spec.LVMLogicalVolume.Size)
		}
		row := []string{v.Spec.Name, v.Spec.Node, kind(v), v.Spec.Mode, or(v.Spec.FSType, "-"), size, v.Status.Phase.String()}
		if withPV {
			row = append(row, pvColumn(v))
		}
		row = append(row, or(v.Status.DeviceName, "-"), age(v.CreatedAt), detail(v))
		if wide {
			row[len(row)-1] = or(row[len(row)-1], "-")
			var kv []string
			for k, val := range volumeLabels(v) {
				kv = append(kv, k+"="+val)
			}
			slices.Sort(kv)
			row = append(row, v.Spec.UUID, or(v.Status.Reason, "-"), or(v.Status.JobID, "-"), or(strings.Join(kv, ","), "-"))
		}
		t.row(row...)
	}
	return t.flush()
}
