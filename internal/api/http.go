package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/store"
)

// Request plumbing: bodies, query strings, tokens and error answers.

// MaxBody bounds a request body: a volume spec is a few hundred bytes.
const MaxBody = 64 << 10

// secureHeaders: API answers carry tokens' results and must not be cached
// or framed; the UI must not be framed either (clickjacking a delete).
func secureHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/metrics" {
			w.Header().Set("Cache-Control", "no-store")
			w.Header().Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
		}
		h.ServeHTTP(w, r)
	})
}

// query refuses a request whose query string names a parameter the
// endpoint does not know, or names one twice: a misspelt option (?wpie=true)
// must not be ignored and the request carried out without it.
func query(h http.HandlerFunc, known ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Message: "the query string cannot be read: " + err.Error()})
			return
		}
		for name, vals := range q {
			switch {
			case !slices.Contains(known, name):
				msg := fmt.Sprintf("%s: %s %s takes no such query parameter", name, r.Method, r.URL.Path)
				if len(known) > 0 {
					msg += " (it knows " + strings.Join(known, ", ") + ")"
				}
				writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: name, Message: msg})
				return
			case len(vals) > 1:
				writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: name, Message: name + ": given more than once: give it once"})
				return
			}
		}
		h(w, r)
	}
}

// flag reads a boolean query parameter: true/false or 1/0, in any case;
// absent is false. Anything else is refused, never read as false: a client
// asking for forget=yes must not get its storage deleted instead.
func flag(r *http.Request, name string) (bool, *saltvolumes.Error) {
	vals, ok := r.URL.Query()[name]
	if !ok {
		return false, nil
	}
	switch strings.ToLower(vals[0]) {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, &saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: name,
		Message: fmt.Sprintf("%s: %q is not a boolean: give true or false (or 1 or 0)", name, vals[0])}
}

// bearer returns the token of an "Authorization: Bearer <token>" header
// ("" for none or another scheme); the scheme's case does not matter (RFC
// 6750 follows RFC 7235 there).
func bearer(h string) string {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimLeft(tok, " ")
}

// auth lets any valid token through (a viewer's and up). Tokens travel in
// "Authorization: Bearer <token>" only: a token in a URL is a token in
// logs and browser history (the watch stream takes a one-time ticket there
// instead: ticket.go).
func (s *Server) auth(h http.HandlerFunc) http.Handler { return s.need(access.Viewer, h) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeErr(w http.ResponseWriter, status int, e saltvolumes.Error) {
	writeJSON(w, status, map[string]saltvolumes.Error{"error": e})
}

// storeErr answers a write the store could not take: 503 when the backend
// is out of reach (etcd without quorum; the message says so), 500 else.
func storeErr(w http.ResponseWriter, err error) {
	var ce *store.ConflictError
	if errors.As(err, &ce) {
		w.Header().Set("Retry-After", "1")
		writeErr(w, http.StatusConflict, saltvolumes.Error{Code: saltvolumes.CodeBusy, Message: err.Error()})
		return
	}
	if errors.Is(err, store.ErrUnavailable) {
		w.Header().Set("Retry-After", "5")
		writeErr(w, http.StatusServiceUnavailable, saltvolumes.Error{Code: saltvolumes.CodeUnavailable,
			Message: err.Error() + ": nothing was changed (or the change is unknown: retrying is safe); reads go on from this replica's cache"})
		return
	}
	writeErr(w, http.StatusInternalServerError, saltvolumes.Error{Code: saltvolumes.CodeInternal, Message: err.Error()})
}

func notFound(w http.ResponseWriter, name string) {
	writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Message: fmt.Sprintf("volume %q not found", name)})
}
