package api

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net/http"
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// A watch ticket lets a browser open the watch stream, whose EventSource
// cannot send a header, without the long-lived token in the URL (and so in
// proxies' logs and the history): one use, within TicketTTL. Tickets are
// signed with a key derived from the API token, so any replica that shares
// the token accepts one another replica issued; each replica refuses a
// ticket it has seen (a replay on another replica within the TTL is not
// caught).
const TicketTTL = 30 * time.Second

const nonceLen = 16

type tickets struct {
	mu   sync.Mutex
	used map[string]time.Time // nonce -> expiry
}

func (s *Server) ticketKey() []byte {
	m := hmac.New(sha256.New, []byte(s.Token))
	m.Write([]byte("salt-volumes watch ticket v1"))
	return m.Sum(nil)
}

// issueTicket makes a ticket valid until now+TicketTTL.
func (s *Server) issueTicket(now time.Time) (string, time.Time, error) {
	exp := now.Add(TicketTTL)
	b := make([]byte, 8+nonceLen, 8+nonceLen+sha256.Size)
	binary.BigEndian.PutUint64(b, uint64(exp.UnixMilli()))
	if _, err := rand.Read(b[8:]); err != nil {
		return "", time.Time{}, err
	}
	m := hmac.New(sha256.New, s.ticketKey())
	m.Write(b)
	return base64.RawURLEncoding.EncodeToString(m.Sum(b)), exp, nil
}

var errTicket = errors.New("watch ticket invalid, expired or already used: ask POST /api/v1/watch/ticket for a new one")

// redeemTicket checks a ticket and spends it.
func (s *Server) redeemTicket(t string, now time.Time) error {
	b, err := base64.RawURLEncoding.DecodeString(t)
	if err != nil || len(b) != 8+nonceLen+sha256.Size {
		return errTicket
	}
	m := hmac.New(sha256.New, s.ticketKey())
	m.Write(b[:8+nonceLen])
	if !hmac.Equal(m.Sum(nil), b[8+nonceLen:]) {
		return errTicket
	}
	exp := time.UnixMilli(int64(binary.BigEndian.Uint64(b)))
	if !now.Before(exp) {
		return errTicket
	}
	nonce := string(b[8 : 8+nonceLen])
	s.tickets.mu.Lock()
	defer s.tickets.mu.Unlock()
	if s.tickets.used == nil {
		s.tickets.used = map[string]time.Time{}
	}
	for n, e := range s.tickets.used {
		if !now.Before(e) {
			delete(s.tickets.used, n)
		}
	}
	if _, seen := s.tickets.used[nonce]; seen {
		return errTicket
	}
	s.tickets.used[nonce] = exp
	return nil
}

// watchTicket answers POST /api/v1/watch/ticket.
func (s *Server) watchTicket(w http.ResponseWriter, r *http.Request) {
	t, exp, err := s.issueTicket(time.Now())
	if err != nil {
		writeErr(w, http.StatusInternalServerError, saltvolumes.Error{Code: saltvolumes.CodeInternal, Message: "watch ticket: " + err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ticket": t, "expires": exp.UTC().Format(time.RFC3339)})
}

// authWatch takes the bearer token, or a watch ticket in the query.
func (s *Server) authWatch(h http.HandlerFunc) http.Handler {
	withToken := s.auth(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := r.URL.Query().Get("ticket")
		if t == "" {
			withToken.ServeHTTP(w, r)
			return
		}
		if err := s.redeemTicket(t, time.Now()); err != nil {
			writeErr(w, http.StatusUnauthorized, saltvolumes.Error{Code: saltvolumes.CodeUnauthorized, Field: "ticket", Message: err.Error()})
			return
		}
		h(w, r)
	})
}
