package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

func (c *cli) json(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (c *cli) show(v saltvolumes.View) error {
	if c.output == "json" {
		return c.json(v)
	}
	c.table([]saltvolumes.View{v})
	if u := v.Usage; u != nil {
		line := "on the node: " + u.State
		if u.Allocated > 0 {
			line += ", allocated " + spec.Approx(u.Allocated)
		}
		if len(u.Mountpoints) > 0 {
			line += fmt.Sprintf(", filesystem used %s, free %s, mounted at %s", spec.Approx(u.FSUsed), spec.Approx(u.FSFree), strings.Join(u.Mountpoints, " "))
		}
		if u.Error != "" {
			line += ": " + u.Error
		}
		fmt.Fprintf(c.out, "%s (reported %s ago)\n", line, time.Since(u.ReportedAt).Truncate(time.Second))
	}
	return nil
}

// detail is the one thing worth reading about a volume in its phase.
func detail(v saltvolumes.View) string {
	st := v.Status
	switch {
	case v.Deleting && (st.Phase == saltvolumes.Pending || st.Phase == saltvolumes.Unknown):
		return v.DeleteBlockedReason // the deletion waits for the creation
	case st.Message != "":
		return st.Message
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
	}
	return "raw:" + v.Spec.RawBlockDevice.DevicePath
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

func (c *cli) table(items []saltvolumes.View) {
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	// The PV column only where there are PVs (Kubernetes mode).
	withPV := false
	for _, v := range items {
		withPV = withPV || v.Status.PersistentVolume != nil
	}
	pvHead := ""
	if withPV {
		pvHead = "\tPV"
	}
	fmt.Fprintln(tw, "NAME\tNODE\tKIND\tMODE\tFS\tSIZE\tPHASE"+pvHead+"\tDEVICE\tAGE\tDETAIL")
	for _, v := range items {
		phase := v.Status.Phase.String()
		if withPV {
			phase += "\t" + pvColumn(v)
		}
		size := "-"
		if v.Status.Size > 0 {
			size = spec.FormatSize(v.Status.Size)
		} else if v.Spec.SparseLoopDevice != nil {
			size = string(v.Spec.SparseLoopDevice.Size)
		} else if v.Spec.LVMLogicalVolume != nil {
			size = string(v.Spec.LVMLogicalVolume.Size)
		}
		fs := v.Spec.FSType
		if fs == "" {
			fs = "-"
		}
		dev := v.Status.DeviceName
		if dev == "" {
			dev = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Spec.Name, v.Spec.Node, kind(v), v.Spec.Mode, fs, size,
			phase, dev, age(v.CreatedAt), detail(v))
	}
	tw.Flush()
}

func age(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
