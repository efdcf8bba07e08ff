package reconciler

import (
	"fmt"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// absentGrace: a volume the node's report does not list fails only if it
// settled this long before the report arrived; a report taken before a
// prepare finished may arrive after the volume settled.
const absentGrace = 30 * time.Second

// handleNode takes a node's health or restore event: shown as it comes,
// acted upon only once confirmed (nodeconfirm.go). A node reports only on
// itself: the envelope's id must be the one in the tag.
func (r *Reconciler) handleNode(ev events.Event) {
	n, _ := ev.AsNodeEvent()
	if !n.Authenticated || n.Node != n.Minion {
		r.Metrics.Rejected.Health.Inc()
		r.warn.Warn("node report not from the node it is about ignored", "tag", ev.Tag, "from", n.Node)
		return
	}
	if ev.Kind() == events.KindNodeRestore {
		// Counted from the node's confirmed status, which carries the
		// report of its last restore.
		r.confirmNode(n.Node)
		return
	}
	rep, err := health.Parse(n.Node, n.Data, time.Now())
	if err != nil {
		r.warn.Warn("node report unreadable", "node", n.Node, "error", err)
		return
	}
	switch r.Nodes.Record(rep) {
	case health.RefusedTooMany:
		r.warn.Warn("node report refused: it lists more volumes than a node can hold", "node", n.Node, "volumes", len(rep.Volumes), "limit", health.MaxReportVolumes)
		return
	case health.RefusedUnknownNode:
		// A node with no volume of ours is shown once Salt confirms it
		// runs there: a status run, read back from the job cache.
		r.confirmUnknownNode(n.Node)
		return
	}
	if rep.Error != "" {
		r.warn.Warn("node cannot list its volumes", "node", n.Node, "error", rep.Error)
		return
	}
	for _, v := range r.store.OnNode(n.Node) {
		if healthNews(v, rep.Find(v.Spec.UUID)) {
			r.confirmNode(n.Node)
			return
		}
	}
}

func healthReason(reason string) bool {
	return reason == ReasonDetached || reason == ReasonStorageLost || reason == ReasonDamaged || reason == legacyReasonLocked
}

// legacyReasonLocked is how builds before the Locked phase failed a volume
// whose container was closed: a store they wrote still moves on reports.
const legacyReasonLocked = "Locked"

// healthNews says whether a report may change the volume, so that steady
// heartbeats queue nothing.
func healthNews(v *volume.Volume, d *saltvolumes.Device) bool {
	st := v.Status
	switch {
	case waiting(v) || v.DeleteRequested:
		return false
	case st.Phase == volume.Failed:
		return healthReason(st.Reason)
	case st.Phase == volume.Locked:
		// Only what moves it: incomplete or orphan (a run in progress)
		// leaves it Locked, and a steady report asks the node nothing.
		return d == nil || d.State == "prepared" || d.State == "detached" || d.State == "missing" || d.State == "damaged"
	case st.Phase != volume.Available:
		return false
	case d == nil || d.State != "prepared":
		return true
	}
	return d.DeviceName != st.DeviceName || d.DevicePath != st.DevicePath || d.Size != st.Size || d.InUse != st.InUse
}

// applyHealth moves a volume by what its node reports: storage lost,
// detached or damaged fails it with a reason; an encrypted container not
// open locks it; healthy again brings it back. Only Available volumes and
// volumes failed or locked for such a reason are touched: a job in flight
// or a deletion owns the volume's phase.
func (r *Reconciler) applyHealth(v *volume.Volume, o observation) effect {
	st := &v.Status
	if o.node != v.Spec.Node || !healthNews(v, o.device) {
		return unchanged
	}
	move := func(phase volume.Phase, reason, msg string) effect {
		if st.Phase == phase && st.Reason == reason && st.Message == msg {
			return unchanged
		}
		r.log.Warn("node reports the volume unhealthy", "volume", v.Spec.Name, "node", v.Spec.Node, "phase", phase, "reason", reason, "message", msg)
		st.Phase, st.Reason, st.Message, st.Step = phase, reason, msg, ""
		return changed
	}
	fail := func(reason, msg string) effect { return move(volume.Failed, reason, msg) }
	d := o.device
	if d == nil {
		if o.at.Sub(st.UpdatedAt) < absentGrace {
			return unchanged
		}
		return fail(ReasonStorageLost, fmt.Sprintf("%s has no record of this volume any more (its state dir lost it): check the node; delete or forget the volume", v.Spec.Node))
	}
	switch d.State {
	case "detached":
		return fail(ReasonDetached, fmt.Sprintf("the loop device of %s was detached on %s (a reboot without restore?): run `salt %s salt_volumes.restore`", orElse(d.BackingFile, v.Spec.Name), v.Spec.Node, v.Spec.Node))
	case "locked":
		if v.Spec.EncryptionProvider() == spec.ProviderMaster {
			return move(volume.Locked, ReasonContainerClosed, fmt.Sprintf("the encrypted container of %s is not open on %s and its key is the master's: the node's beacon opens it once its minion has the key from pillar (salt_volumes:keys:%s), unless pillar salt_volumes:open_locked is false; or run `salt %s salt_volumes.restore`", v.Spec.Name, v.Spec.Node, v.Spec.Name, v.Spec.Node))
		}
		return move(volume.Locked, ReasonContainerClosed, fmt.Sprintf("the encrypted container of %s is not open on %s: run `salt %s salt_volumes.restore` (it opens what the node holds keys for)", v.Spec.Name, v.Spec.Node, v.Spec.Node))
	case "missing":
		return fail(ReasonStorageLost, fmt.Sprintf("%s reports: %s", v.Spec.Node, d.Error))
	case "damaged":
		return fail(ReasonDamaged, fmt.Sprintf("%s reports: %s", v.Spec.Node, d.Error))
	case "prepared":
		if err := d.Check(&v.Spec); err != nil {
			r.Metrics.Rejected.Device.Inc()
			r.warn.Warn("health report with device info that does not describe the volume ignored", "volume", v.Spec.Name, "error", err)
			return unchanged
		}
		if st.Phase == volume.Failed || st.Phase == volume.Locked {
			r.log.Info("node reports the volume healthy again", "volume", v.Spec.Name, "node", v.Spec.Node, "was", st.Reason)
			st.Phase, st.Reason, st.Message = volume.Available, "", ""
		}
		st.ApplyDevice(d)
		return changed
	}
	return unchanged // incomplete, orphan: a run in progress or not ours to judge
}

func orElse(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// knownOn is the set of volume UUIDs the store holds on node.
func (r *Reconciler) knownOn(node string) map[string]bool {
	vs := r.store.OnNode(node)
	out := make(map[string]bool, len(vs))
	for _, v := range vs {
		out[v.Spec.UUID] = true
	}
	return out
}

// unknownNodeGap spaces confirmations of nodes the control plane does not
// know, all nodes together: forged reports under a stream of made-up node
// names cost at most one status request per gap.
const unknownNodeGap = time.Second

func (r *Reconciler) confirmUnknownNode(node string) {
	r.unknownMu.Lock()
	now := time.Now()
	if now.Sub(r.unknownAt) < unknownNodeGap {
		r.unknownMu.Unlock()
		return
	}
	r.unknownAt = now
	r.unknownMu.Unlock()
	r.confirmNode(node)
}
