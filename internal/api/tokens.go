package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
)

// Tokens, the caller's own identity and the audit trail.

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, access.From(r.Context()))
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) {
	all, err := s.checker().List(r.Context())
	if err != nil {
		storeErr(w, err)
		return
	}
	items := make([]access.TokenView, 0, len(all))
	for _, t := range all {
		items = append(items, access.ViewToken(t))
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// createToken: {"name", "role", "expires": "90d"}; the answer carries the
// secret, the only time it is shown.
func (s *Server) createToken(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name    string `json:"name"`
		Role    string `json:"role"`
		Expires string `json:"expires"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid,
			Message: `the body must be {"name": "prometheus", "role": "viewer", "expires": "90d"} (expires may be left out: the token never expires)`})
		return
	}
	role, err := access.ParseRole("role", body.Role)
	if err != nil {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "role", Message: err.Error()})
		return
	}
	ttl, err := access.ParseTTL("expires", body.Expires)
	if err != nil {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "expires", Message: err.Error()})
		return
	}
	if s.checker().Records == nil {
		writeErr(w, http.StatusNotImplemented, saltvolumes.Error{Code: saltvolumes.CodeInternal, Message: "this server keeps no tokens"})
		return
	}
	if p := access.From(r.Context()); p != nil && p.Kind == "kubernetes" {
		// Its token would outlive the RoleBinding that allowed it, with
		// nothing to bound it: Kubernetes identities use their own tokens.
		noteOf(r.Context()).refused = true
		writeErr(w, http.StatusForbidden, saltvolumes.Error{Code: saltvolumes.CodeForbidden,
			Message: p.User + " may not make service tokens: a Kubernetes identity uses its own (kubectl create token SA --audience salt-volumes); service tokens are made with the bootstrap token or by a person logged in with Salt"})
		return
	}
	secret, tok, err := s.checker().CreateServiceBy(r.Context(), body.Name, role, ttl, access.From(r.Context()))
	var fe *access.FieldError
	if errors.As(err, &fe) {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: fe.Field, Message: fe.Msg})
		return
	}
	if err != nil {
		storeErr(w, err)
		return
	}
	s.Log.Info("service token created", "name", tok.Name, "role", tok.Role)
	v := access.ViewToken(tok)
	v.Token = secret
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) {
	tok, err := s.checker().Revoke(r.Context(), r.PathValue("name"))
	switch {
	case errors.Is(err, access.ErrNoToken):
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: err.Error()})
	case err != nil:
		storeErr(w, err)
	default:
		s.Log.Info("token revoked", "name", tok.Name, "kind", tok.Kind)
		writeJSON(w, http.StatusOK, access.ViewToken(tok))
	}
}

// auditList: ?user=, ?volume=, ?since=<duration> (back from now),
// ?limit= (the newest N).
func (s *Server) auditList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := access.Filter{User: q.Get("user"), Volume: q.Get("volume")}
	if v := q.Get("since"); v != "" {
		d, err := access.ParseTTL("since", v)
		if err != nil || d == 0 {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "since", Message: "since: " + strconv.Quote(v) + " is not a positive duration: write it like 24h or 7d"})
			return
		}
		f.Since = time.Now().Add(-d)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "limit", Message: "limit: " + strconv.Quote(v) + " is not a positive number"})
			return
		}
		f.Limit = n
	}
	if s.Audit == nil {
		writeJSON(w, http.StatusOK, map[string]any{"items": []access.Entry{}})
		return
	}
	items, err := s.Audit.List(r.Context(), f)
	if err != nil {
		storeErr(w, err)
		return
	}
	s.withJobs(items)
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// history: the audit entries of one volume, for everyone who may read it
// (the UI's "created by alice 3 h ago"): those of this volume's uuid.
// Refusals that only named it (a create of that name) are not its history:
// anyone refused could write into every volume's page.
func (s *Server) history(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	v, err := s.Store.Get(name)
	if err != nil {
		notFound(w, name)
		return
	}
	items := []access.Entry{}
	if s.Audit != nil {
		all, err := s.Audit.List(r.Context(), access.Filter{Volume: name})
		if err != nil {
			storeErr(w, err)
			return
		}
		for _, e := range all {
			if e.UUID == v.Spec.UUID {
				items = append(items, e)
			}
		}
	}
	s.withJobs(items)
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// withJobs fills in the Salt job of each allowed change this replica
// remembers: the first state run of the right kind (unprepared for a
// deletion, prepared for a create or a growth) started after the request.
// A follower remembers none (the leader runs the jobs): its entries come
// without.
func (s *Server) withJobs(items []access.Entry) {
	if s.Jobs == nil {
		return
	}
	byVolume := map[string][]saltvolumes.Job{}
	for i := range items {
		e := &items[i]
		// Snapshot jobs are the snapshot's own (its record names it), not
		// the volume's state runs.
		if e.Decision != "allowed" || e.Volume == "" || strings.Contains(e.Route, "forget=") || strings.Contains(e.Route, "/snapshots") {
			continue
		}
		jobs, ok := byVolume[e.Volume]
		if !ok {
			jobs = s.Jobs(e.Volume)
			byVolume[e.Volume] = jobs
		}
		sls := "salt_volumes.prepared"
		if e.Method == http.MethodDelete {
			sls = "salt_volumes.unprepared"
		}
		for _, j := range jobs {
			if j.SLS == sls && !j.Started.Before(e.Time) {
				e.JobID, e.Outcome = j.JID, j.Result
				break
			}
		}
	}
}
