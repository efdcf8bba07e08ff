package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/kubeauth"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Snapshots: taken and deleted through the leader (its snapshot loop acts
// at once), read from the store on any replica.

func (s *Server) snapshotsOff(w http.ResponseWriter) bool {
	if s.Snapshots == nil {
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: "this control plane keeps no snapshots"})
		return true
	}
	return false
}

func snapshotErr(w http.ResponseWriter, name string, err error) {
	var se *snapshots.Error
	switch {
	case errors.As(err, &se):
		code := saltvolumes.CodeSnapshot
		if se.Status == http.StatusBadRequest {
			code = saltvolumes.CodeInvalid
		}
		writeErr(w, se.Status, saltvolumes.Error{Code: code, Field: se.Field, Message: se.Msg + "; nothing was changed"})
	case errors.Is(err, snapshots.ErrNotFound):
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: fmt.Sprintf("snapshot %q not found (salt-volumes snapshot ls lists them)", name)})
	default:
		storeErr(w, err)
	}
}

// takeSnapshot: POST /api/v1/volumes/{name}/snapshots {"name": "..."}.
func (s *Server) takeSnapshot(w http.ResponseWriter, r *http.Request) {
	if s.snapshotsOff(w) {
		return
	}
	name := r.PathValue("name")
	var body struct {
		Name string `json:"name"`
		// For: the snapshot is taken to be cloned as this new volume,
		// and deleted once it is Available (create --from volume/NAME).
		For string `json:"for"`
		// Size: a thick LVM snapshot's copy-on-write space ("2Gi").
		Size string `json:"size"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() || body.Name == "" {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "name",
			Message: `the body must be {"name": "SNAPSHOT"} (and "for": "VOLUME" for a snapshot that is only to be cloned): the new snapshot's name (lower-case letters, digits and '-')`})
		return
	}
	var cow int64
	if body.Size != "" {
		var err error
		if cow, err = spec.ParseSize(body.Size); err != nil {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "size",
				Message: "size: " + err.Error() + ": give a thick LVM snapshot's copy-on-write space, such as 2Gi, or leave it out"})
			return
		}
	}
	v, err := s.Store.Get(name)
	if errors.Is(err, store.ErrNotFound) {
		notFound(w, name)
		return
	}
	if err != nil {
		storeErr(w, err)
		return
	}
	n := noteOf(r.Context())
	n.volume, n.uuid, n.node = name, v.Spec.UUID, v.Spec.Node
	// A snapshot of a raw device is a copy of whatever is on it: it needs
	// the rights the device does.
	if v.Spec.RawBlockDevice != nil && !s.escalate(w, r, access.Admin, "snapshot a volume on a raw device ("+v.Spec.RawBlockDevice.DevicePath+")") {
		return
	}
	if !s.inScope(w, r, v.Spec.Node) {
		return
	}
	snap, created, err := s.Snapshots.TakeFor(r.Context(), v, body.Name, requester(r), body.For, cow)
	if err != nil {
		snapshotErr(w, body.Name, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		s.Log.Info("snapshot asked for", "snapshot", snap.Name, "volume", name, "node", v.Spec.Node)
	}
	w.Header().Set("Location", "/api/v1/snapshots/"+snap.Name)
	writeJSON(w, status, snap)
}

// listSnapshots: GET /api/v1/snapshots[?volume=], and a volume's own at
// GET /api/v1/volumes/{name}/snapshots.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	if s.snapshotsOff(w) {
		return
	}
	vol := r.URL.Query().Get("volume")
	if n := r.PathValue("name"); n != "" {
		vol = n
	}
	items, err := s.Snapshots.List(r.Context(), vol)
	if err != nil {
		storeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	if s.snapshotsOff(w) {
		return
	}
	name := r.PathValue("name")
	snap, err := s.Snapshots.Get(r.Context(), name)
	if err != nil {
		snapshotErr(w, name, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

// snapshotToChange reads snapshot name for a change to it, and notes its
// volume and node for the audit; false when it answered already.
func (s *Server) snapshotToChange(w http.ResponseWriter, r *http.Request, name string) (saltvolumes.Snapshot, bool) {
	snap, err := s.Snapshots.Get(r.Context(), name)
	if err != nil {
		snapshotErr(w, name, err)
		return snap, false
	}
	n := noteOf(r.Context())
	n.volume, n.uuid, n.node = snap.Volume, snap.VolumeUUID, snap.Node
	return snap, true
}

// deleteSnapshot: DELETE /api/v1/snapshots/{name}; 202 while its node
// deletes it.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if s.snapshotsOff(w) {
		return
	}
	name := r.PathValue("name")
	snap, ok := s.snapshotToChange(w, r, name)
	if !ok || !s.inScope(w, r, snap.Node) {
		return
	}
	snap, err := s.Snapshots.Delete(r.Context(), name, requester(r))
	if err != nil {
		snapshotErr(w, name, err)
		return
	}
	writeJSON(w, http.StatusAccepted, snap)
}

// heldBySnapshots refuses a volume's deletion while it has snapshots: the
// node would refuse it too (has_snapshots), after the volume had left
// Available. A schedule of the volume goes first, or it takes more.
func (s *Server) heldBySnapshots(w http.ResponseWriter, r *http.Request, name string) bool {
	if s.Snapshots == nil {
		return false
	}
	snaps, err := s.Snapshots.List(r.Context(), name)
	if err != nil {
		storeErr(w, err)
		return true
	}
	if len(snaps) == 0 {
		return false
	}
	var ns []string
	for _, sn := range snaps {
		ns = append(ns, sn.Name)
	}
	shown, rm := strings.Join(ns, ", "), "salt-volumes snapshot rm "+strings.Join(ns, " ")
	if len(ns) > 10 {
		shown, rm = fmt.Sprintf("%s and %d more", strings.Join(ns[:10], ", "), len(ns)-10), "salt-volumes snapshot rm NAME..."
	}
	todo := fmt.Sprintf("delete them first (salt-volumes snapshot ls %s lists them; %s)", name, rm)
	if held := s.scheduleHeld(r, name); held != "" {
		todo = fmt.Sprintf("%s: remove the schedule first (salt-volumes snapshot unschedule %s; its snapshots stay), then delete the snapshots (salt-volumes snapshot ls %s lists them; %s)", held, name, name, rm)
	}
	writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeDeleteForbidden,
		Message: fmt.Sprintf("volume %q has snapshots (%s): a volume is deleted only once its snapshots are; %s; nothing was changed", name, shown, todo)})
	return true
}

// requester is who asked: the user the request's token names.
func requester(r *http.Request) string {
	if p := access.From(r.Context()); p != nil {
		return p.User
	}
	return ""
}

// mayClone lets a clone's create through when its caller may read the
// snapshot's data: a snapshot this control plane keeps, of a volume it
// knows, that is not on a raw device; anything else (a snapshot Salt took
// that no record names, one of a raw device or of a volume gone) only an
// admin may clone. It answers 403 (or 404 without snapshots) and returns
// false otherwise.
func (s *Server) mayClone(w http.ResponseWriter, r *http.Request, src *spec.Source) bool {
	what := fmt.Sprintf("clone snapshot %s of volume %s", src.Snapshot, src.VolumeUUID)
	if s.Snapshots == nil {
		return s.escalateOn(w, r, access.Admin, what+", which this control plane does not keep", "")
	}
	all, err := s.Snapshots.List(r.Context(), "")
	if err != nil {
		storeErr(w, err)
		return false
	}
	for _, sn := range all {
		if sn.VolumeUUID != src.VolumeUUID || sn.Name != src.Snapshot {
			continue
		}
		if node := noteOf(r.Context()).node; node != sn.Node {
			noteOf(r.Context()).refused = true
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "node",
				Message: fmt.Sprintf("node: snapshot %s is on %s: a clone is made on its snapshot's node; nothing was changed", sn.Name, sn.Node)})
			return false
		}
		if sn.Method == lvmThick && sn.Restore != nil && sn.Restore.Phase == snapshots.Restoring {
			// LVM merges a thick snapshot into its volume: it is being
			// used up, and a copy of it now would read a snapshot that
			// goes away under it.
			noteOf(r.Context()).refused = true
			writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeSnapshot, Field: "source",
				Message: fmt.Sprintf("source: volume %s is being restored from snapshot %s, which that uses up (a thick LVM snapshot merges into its volume): clone it before restoring, or clone another snapshot; nothing was changed", sn.Volume, sn.Name)})
			return false
		}
		v, err := s.Store.Get(sn.Volume)
		switch {
		case err != nil || v.Spec.UUID != sn.VolumeUUID:
			// Its name may be a new volume's now: every volume's admin.
			return s.escalateOn(w, r, access.Admin, what+", of a volume this control plane no longer has", "")
		case v.Spec.RawBlockDevice != nil:
			return s.escalateOn(w, r, access.Admin, what+", of a volume on a raw device ("+v.Spec.RawBlockDevice.DevicePath+")", v.Spec.Name)
		}
		if p := access.From(r.Context()); p != nil && p.Kind == "kubernetes" {
			// Reading a snapshot is its own right in RBAC.
			return s.kubeAllowed(w, r, p, noteOf(r.Context()), kubeauth.Attributes{Verb: "get", Resource: kubeauth.SnapshotResource, Name: sn.Name}, false)
		}
		return true
	}
	return s.escalateOn(w, r, access.Admin, what+", which no snapshot record of this control plane names (one taken through Salt)", "")
}

// lvmThick is a thick LVM snapshot's method, which its restore uses up.
const lvmThick = "lvm-thick"

// restoreSnapshot: POST /api/v1/snapshots/{name}/restore; 202 while the
// volume's node puts it back to the snapshot (the snapshot's restore says
// how it went), the running restore's answer when one runs already.
func (s *Server) restoreSnapshot(w http.ResponseWriter, r *http.Request) {
	if s.snapshotsOff(w) {
		return
	}
	name := r.PathValue("name")
	snap, ok := s.snapshotToChange(w, r, name)
	if !ok {
		return
	}
	if p := access.From(r.Context()); p != nil && p.Kind == "kubernetes" {
		if !s.kubeAllowed(w, r, p, noteOf(r.Context()), kubeauth.Attributes{Verb: "delete", Resource: kubeauth.Resource, Name: snap.Volume}, false) {
			return
		}
		// A thick LVM snapshot merges into its volume and is gone: its
		// restore deletes it, so it asks what deleting it asks too. (Our
		// own roles ask the same of both routes already: op.)
		if snap.Method == lvmThick && !s.kubeAllowed(w, r, p, noteOf(r.Context()), kubeauth.Attributes{Verb: "delete", Resource: kubeauth.SnapshotResource, Name: snap.Name}, false) {
			return
		}
	}
	if !s.inScope(w, r, snap.Node) {
		return
	}
	v, err := s.Store.Get(snap.Volume)
	if errors.Is(err, store.ErrNotFound) {
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeSnapshot, Field: "volume",
			Message: fmt.Sprintf("snapshot %s is of volume %s, which is gone: nothing to restore; nothing was changed", name, snap.Volume)})
		return
	}
	if err != nil {
		storeErr(w, err)
		return
	}
	// A restore rolls back the data under whoever holds the volume: like a
	// deletion, not for an operator while a claim holds it (its pods may
	// be scaled down for a moment only) or while it is in use; an admin
	// may (the node still refuses a volume in use).
	if why := heldFor(v); why != "" && !s.escalateOn(w, r, access.Admin, "restore volume "+v.Spec.Name+" in place while "+why, v.Spec.Name) {
		return
	}
	snap, started, err := s.Snapshots.Restore(r.Context(), v, name, requester(r))
	if err != nil {
		snapshotErr(w, name, err)
		return
	}
	if started {
		s.Log.Info("restore asked for", "snapshot", name, "volume", snap.Volume, "node", snap.Node, "by", requester(r))
	}
	w.Header().Set("Location", "/api/v1/snapshots/"+snap.Name)
	writeJSON(w, http.StatusAccepted, snap)
}

// heldFor says who holds volume v ("": nobody the control plane knows of):
// it is in use on its node, or a claim holds its PersistentVolume.
func heldFor(v *volume.Volume) string {
	if v.Status.InUse {
		return "it is in use on " + v.Spec.Node
	}
	if pv := v.Status.PersistentVolume; pv != nil && (pv.Phase == "Bound" || pv.Phase == "Pending") {
		return fmt.Sprintf("its PersistentVolume %s is %s (claim %s)", pv.Name, pv.Phase, pv.Claim)
	}
	return ""
}

// beingRestored refuses a change to a volume (409) while it is being
// restored from one of its snapshots: the node would run both, one after
// the other, and the second would undo or follow what nobody asked of the
// first.
func (s *Server) beingRestored(w http.ResponseWriter, r *http.Request, vol, what string) bool {
	if s.Snapshots == nil {
		return false
	}
	from, err := s.Snapshots.Restoring(r.Context(), vol)
	if err != nil {
		storeErr(w, err)
		return true
	}
	if from == "" {
		return false
	}
	writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeSnapshot, Field: "volume",
		Message: fmt.Sprintf("volume %q is being restored from snapshot %s: %s once that has finished (salt-volumes snapshot get %s); nothing was changed", vol, from, what, from)})
	return true
}
