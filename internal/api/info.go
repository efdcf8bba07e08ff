package api

import (
	"net/http"
	"time"
)

// Info is GET /api/v1/info: what a client needs to know of this server
// to wait for its work, e.g. the CLI's --wait, which gives a job its
// timeout and a minute more before it gives up.
type Info struct {
	Version           string `json:"version"`
	JobTimeout        string `json:"jobTimeout"`
	JobTimeoutSeconds int64  `json:"jobTimeoutSeconds"`
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	jt := s.JobTimeout
	if jt <= 0 {
		jt = 10 * time.Minute // the reconciler's default (reconciler.New)
	}
	v := s.Version
	if v == "" {
		v = "dev"
	}
	writeJSON(w, http.StatusOK, Info{Version: v, JobTimeout: jt.String(), JobTimeoutSeconds: int64(jt / time.Second)})
}
