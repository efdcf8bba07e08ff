package api

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// Replicas: a follower serves reads and passes writes to the leader.

// Role is a replica's part.
type Role struct {
	Leader bool
	// LeaderID names the replica that leads ("" while none does), URL is
	// where its API answers.
	LeaderID, URL string
}

// forwardedHeader marks a request one replica passed to the leader: the
// leader answers it itself, whatever it believes about its role. Its
// value is signed with the replicas' key (keys.go) over the request's
// method, URL and time, so that only a replica's forward is believed: a
// client that sends the header itself is treated as if it had not.
const (
	forwardedHeader  = "X-Salt-Volumes-Forwarded"
	forwardedPurpose = "salt-volumes forwarded request v1"
	forwardedTTL     = 30 * time.Second
)

func forwardedMsg(r *http.Request, at int64) []byte {
	return []byte(fmt.Sprintf("%d\n%s\n%s", at, r.Method, r.URL.RequestURI()))
}

// markForwarded signs r as passed on by this replica.
func (s *Server) markForwarded(r *http.Request) error {
	at := time.Now().Unix()
	sig, err := s.sign(r.Context(), forwardedPurpose, forwardedMsg(r, at))
	if err != nil {
		return err
	}
	r.Header.Set(forwardedHeader, strconv.FormatInt(at, 10)+"."+base64.RawURLEncoding.EncodeToString(sig))
	return nil
}

// forwarded says whether r was passed on by a replica.
func (s *Server) forwarded(r *http.Request) bool {
	v := r.Header.Get(forwardedHeader)
	if v == "" {
		return false
	}
	ts, enc, ok := strings.Cut(v, ".")
	at, err := strconv.ParseInt(ts, 10, 64)
	sig, err2 := base64.RawURLEncoding.DecodeString(enc)
	if !ok || err != nil || err2 != nil {
		return false
	}
	if age := time.Since(time.Unix(at, 0)); age > forwardedTTL || age < -forwardedTTL {
		return false
	}
	return s.verify(r.Context(), forwardedPurpose, forwardedMsg(r, at), sig)
}

// fromLeader serves what only the leader holds in memory (node reports,
// usage history, job step logs): a follower passes the request on to the
// leader, token and all, and relays the answer.
func (s *Server) fromLeader(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.Role == nil || s.forwarded(r) {
			h(w, r)
			return
		}
		role := s.Role()
		target, err := url.Parse(role.URL)
		if role.Leader || role.URL == "" || err != nil {
			h(w, r)
			return
		}
		if !Forwardable(target) {
			// The caller's token goes with the request: never in clear
			// to another host.
			writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable,
				Message: fmt.Sprintf("this replica follows %s, which holds node reports, usage and job logs, but advertises %s: your token is not sent in clear to another host; ask the leader, or give the replicas https advertiseURLs", role.LeaderID, role.URL)})
			return
		}
		p := httputil.NewSingleHostReverseProxy(target)
		p.Transport = s.LeaderTransport
		p.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
			writeErr(w, http.StatusBadGateway, saltvolumes.Error{Code: saltvolumes.CodeUnavailable,
				Message: fmt.Sprintf("this replica follows %s, which holds node reports, usage and job logs, and could not be reached: %v", role.LeaderID, err)})
		}
		if err := s.markForwarded(r); err != nil {
			writeErr(w, http.StatusInternalServerError, saltvolumes.Error{Code: saltvolumes.CodeInternal, Message: "passing the request to the leader: " + err.Error()})
			return
		}
		p.ServeHTTP(w, r)
	}
}

// Forwardable says whether a follower may pass a request, with its
// caller's token, to the leader at u: over https, or on this host.
func Forwardable(u *url.URL) bool {
	if u.Scheme == "https" {
		return true
	}
	host := u.Hostname()
	ip := net.ParseIP(host)
	return u.Scheme == "http" && (host == "localhost" || ip != nil && ip.IsLoopback())
}

func (r Role) String() string {
	switch {
	case r.Leader:
		return "leader"
	case r.LeaderID != "" && r.URL != "":
		return "follower of " + r.LeaderID + " at " + r.URL
	case r.LeaderID != "":
		return "follower of " + r.LeaderID
	}
	return "follower (no leader elected)"
}

// readyz answers 200 on every replica that serves, leader or follower,
// and names the role.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.Ready != nil {
		if err := s.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	if s.Role != nil {
		fmt.Fprintf(w, "ok: %s\n", s.Role())
		return
	}
	io.WriteString(w, "ok\n")
}
