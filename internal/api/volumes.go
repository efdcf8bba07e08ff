package api

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Volumes: create, read, delete, grow, forget, drain a node.

// ParseCreate reads a create request: the volume spec contract, with the
// uuid generated when absent and the node required.
func ParseCreate(body io.Reader) (*spec.Spec, error) {
	// Decoded strictly once (a key given twice is refused, as the node
	// binary refuses it); only then is a missing uuid filled in.
	sp, err := spec.ParseNew(body, uuid.NewString)
	if err != nil {
		return nil, err
	}
	if sp.Node == "" {
		return nil, &spec.FieldError{Field: "node", Msg: "missing: name the Salt minion that will hold the volume (salt-key -L lists them)"}
	}
	return sp, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	if !s.allowCreate() {
		w.Header().Set("Retry-After", "1")
		writeErr(w, http.StatusTooManyRequests, saltvolumes.Error{Code: saltvolumes.CodeLimit, Message: fmt.Sprintf("more than %g creates per second: slow down and retry", s.CreatesPerSecond)})
		return
	}
	sp, err := ParseCreate(r.Body)
	if err != nil {
		var fe *spec.FieldError
		if errors.As(err, &fe) {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: fe.Field, Message: fe.Error()})
			return
		}
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Message: err.Error()})
		return
	}
	n := noteOf(r.Context())
	n.volume, n.uuid, n.node = sp.Name, sp.UUID, sp.Node
	// A raw device may hold anyone's data: only an admin names one.
	if sp.RawBlockDevice != nil && !s.escalate(w, r, access.Admin, "create a volume on a raw device ("+sp.RawBlockDevice.DevicePath+")") {
		return
	}
	if sp.Source != nil && !s.mayClone(w, r, sp.Source) {
		return
	}
	if !s.inScope(w, r, sp.Node) {
		return
	}
	v, err := s.Requests.Create(r.Context(), sp)
	var lerr *requests.LimitError
	if errors.As(err, &lerr) {
		writeErr(w, http.StatusTooManyRequests, saltvolumes.Error{Code: saltvolumes.CodeLimit, Message: lerr.Error()})
		return
	}
	var uerr *store.UUIDError
	if errors.As(err, &uerr) {
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeExists, Field: "uuid", Message: fmt.Sprintf("uuid: %s already belongs to volume %q: leave uuid out to get a new one", sp.UUID, uerr.Owner)})
		return
	}
	if errors.Is(err, store.ErrExists) {
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeExists, Field: "name", Message: fmt.Sprintf("name: volume %q already exists: pick another name or delete it first", sp.Name)})
		return
	}
	if err != nil {
		storeErr(w, err)
		return
	}
	s.Log.Info("volume created", "volume", sp.Name, "node", sp.Node)
	w.Header().Set("Location", "/api/v1/volumes/"+sp.Name)
	writeJSON(w, http.StatusCreated, v.View())
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	node := r.URL.Query().Get("node")
	items := []saltvolumes.View{}
	for _, v := range s.Store.List() {
		if node == "" || v.Spec.Node == node {
			items = append(items, s.view(v))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	v, err := s.Store.Get(r.PathValue("name"))
	if err != nil {
		notFound(w, r.PathValue("name"))
		return
	}
	writeJSON(w, http.StatusOK, s.view(v))
}

// view is the volume's API view with what its node last reported.
func (s *Server) view(v *volume.Volume) saltvolumes.View {
	out := v.View()
	out.Usage = s.Health.Usage(v.Spec.Node, v.Spec.UUID)
	return out
}

// jobs lists the volume's last state runs with their step timings.
func (s *Server) jobs(w http.ResponseWriter, r *http.Request) {
	v, err := s.Store.Get(r.PathValue("name"))
	if err != nil {
		notFound(w, r.PathValue("name"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": s.Jobs(v.Spec.Name)})
}

// usage is a volume's usage history: ?since=<duration> (default and at
// most 24h).
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	v, err := s.Store.Get(r.PathValue("name"))
	if err != nil {
		notFound(w, r.PathValue("name"))
		return
	}
	window := health.HistoryWindow
	if q := r.URL.Query().Get("since"); q != "" {
		d, err := time.ParseDuration(q)
		if err != nil || d <= 0 {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "since", Message: "since: " + strconv.Quote(q) + " is not a positive duration: use e.g. 1h or 30m"})
			return
		}
		window = min(d, window)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"volume": v.Spec.Name, "current": s.Health.Usage(v.Spec.Node, v.Spec.UUID),
		"samples": s.Health.History(v.Spec.UUID, time.Now().Add(-window)),
	})
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	wipe, werr := flag(r, "wipe")
	forget, ferr := flag(r, "forget")
	if e := cmp.Or(werr, ferr); e != nil {
		writeErr(w, http.StatusBadRequest, *e)
		return
	}
	var v *volume.Volume
	var err error
	switch {
	case wipe && !s.escalate(w, r, access.Admin, "wipe volume "+name+" (?wipe=true)"):
		return
	case forget && !s.escalate(w, r, access.Admin, "forget volume "+name+" (?forget=true)"):
		return
	case noteOf(r.Context()).node != "" && !s.inScope(w, r, noteOf(r.Context()).node):
		return
	case wipe && forget:
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "forget", Message: "forget leaves the node untouched, so it cannot wipe: use one or the other"})
		return
	case forget:
		if v, err = s.Requests.Forget(r.Context(), name); err == nil && s.Snapshots != nil {
			// Left on the node as the volume is: the records go with it.
			if gone, ferr := s.Snapshots.Forget(r.Context(), []string{name}); ferr != nil {
				s.Log.Warn("forgetting the snapshots of a forgotten volume", "volume", name, "forgotten", gone, "error", ferr)
			} else if len(gone) > 0 {
				s.Log.Info("snapshots of a forgotten volume forgotten", "volume", name, "snapshots", gone)
			}
		}
	case s.beingRestored(w, r, name, "delete it"), s.heldBySnapshots(w, r, name):
		return
	default:
		v, err = s.Requests.Delete(r.Context(), name, wipe)
	}
	var de *requests.DeleteError
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, name)
	case errors.As(err, &de):
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeDeleteForbidden, Message: fmt.Sprintf("volume %q: %s", name, de.Reason)})
	case err != nil:
		storeErr(w, err)
	default:
		s.Log.Info("volume deletion requested", "volume", name, "wipe", wipe, "forget", forget)
		writeJSON(w, http.StatusAccepted, v.View())
	}
}

// resize asks a volume to grow: a sparse one to {"size": "20Gi"}, a raw
// one to what its device has become, {"toDevice": true}.
func (s *Server) resize(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var body struct {
		Size     *spec.Size `json:"size"`
		ToDevice bool       `json:"toDevice"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() || (body.Size == nil) == !body.ToDevice || body.Size != nil && *body.Size == "" {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "size",
			Message: `the body must be {"size": "20Gi"} (a sparse volume: the size it grows to, a quantity or a number of bytes) or {"toDevice": true} (a raw volume: to what its device has become)`})
		return
	}
	size := ""
	if body.Size != nil {
		size = string(*body.Size)
	}
	if n := noteOf(r.Context()); n.node != "" && !s.inScope(w, r, n.node) {
		return
	}
	if s.beingRestored(w, r, name, "grow it") {
		return
	}
	v, err := s.Requests.Resize(r.Context(), name, size)
	var re *requests.ResizeError
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, name)
	case errors.As(err, &re) && re.Conflict:
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeResizeForbidden, Field: re.Field, Message: fmt.Sprintf("volume %q: %s", name, re.Reason)})
	case errors.As(err, &re):
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: re.Field, Message: fmt.Sprintf("volume %q: %s", name, re.Reason)})
	case err != nil:
		storeErr(w, err)
	default:
		s.Log.Info("volume growth requested", "volume", name, "size", size, "toDevice", body.ToDevice)
		writeJSON(w, http.StatusAccepted, v.View())
	}
}

// forgetNode drains a node that is gone for good: the volumes the body
// names ({"volumes": [...]}, as listed to the user) are forgotten
// whatever their phase, nothing runs on any node.
func (s *Server) forgetNode(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	var body struct {
		Volumes []string `json:"volumes"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "volumes",
			Message: `the body must be {"volumes": ["NAME", ...]}: the node's volumes to forget, as GET /api/v1/volumes?node=` + node + ` lists them`})
		return
	}
	if len(body.Volumes) == 0 {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "volumes", Message: "volumes: empty: name the volumes of node " + node + " to forget"})
		return
	}
	if !s.inScope(w, r, node) {
		return
	}
	got, err := s.Requests.ForgetNode(r.Context(), node, body.Volumes)
	var ne *requests.NodeForgetError
	switch {
	case errors.As(err, &ne):
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Field: "volumes",
			Message: ne.Error() + ": list the node's volumes again; nothing was forgotten"})
		return
	case err != nil:
		storeErr(w, err)
		return
	}
	items := make([]saltvolumes.View, 0, len(got))
	for _, v := range got {
		items = append(items, v.View())
	}
	if s.Snapshots != nil {
		if gone, ferr := s.Snapshots.Forget(r.Context(), body.Volumes); ferr != nil {
			s.Log.Warn("forgetting the snapshots of a drained node's volumes", "node", node, "forgotten", gone, "error", ferr)
		} else if len(gone) > 0 {
			s.Log.Info("snapshots of a drained node's volumes forgotten", "node", node, "snapshots", gone)
		}
	}
	s.Log.Warn("node drained: its volumes are forgotten without touching any disk", "node", node, "volumes", body.Volumes)
	writeJSON(w, http.StatusAccepted, map[string]any{"items": items})
}
