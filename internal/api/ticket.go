package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
)

// recheckKey carries a watch stream's check of its credential: it ends
// the stream once the token is revoked, expired, logged out, or its
// person has no role any more.
type recheckKey struct{}

var errStreamLifetime = errors.New("a Kubernetes identity's ticket stream lasts 5 minutes: open another")

// A watch ticket lets a browser open the watch stream, whose EventSource
// cannot send a header, without the long-lived token in the URL (and so in
// proxies' logs and the history): one use, within TicketTTL. A ticket is
// signed with the replicas' own random key (keys.go), so any replica
// accepts one another issued, and it names the credential it was asked
// with (by hash), so that the stream it opens ends when that credential
// stops being valid. Each replica refuses a ticket it has seen (a replay
// on another replica within the TTL is not caught).
const TicketTTL = 30 * time.Second

const (
	nonceLen  = 16
	ticketLen = 8 + nonceLen + 1 + sha256.Size
	// A Kubernetes identity's ticket cannot be checked again (serve keeps
	// no Kubernetes token): its stream ends after kubeTicketStream and the
	// client opens another with a new ticket.
	kubeTicketStream = 5 * time.Minute
	credOurs         = 0
	credKube         = 1
	ticketPurpose    = "salt-volumes watch ticket v2"
)

type tickets struct {
	mu    sync.Mutex
	used  map[string]time.Time // nonce -> expiry
	swept time.Time
}

// ticketCred is the credential a ticket was asked with.
type ticketCred struct {
	kind byte
	hash []byte // SHA-256 of the secret
}

// issueTicket makes a ticket for cred valid until now+TicketTTL.
func (s *Server) issueTicket(ctx context.Context, now time.Time, cred ticketCred) (string, time.Time, error) {
	exp := now.Add(TicketTTL)
	b := make([]byte, ticketLen, ticketLen+sha256.Size)
	binary.BigEndian.PutUint64(b, uint64(exp.UnixMilli()))
	if _, err := rand.Read(b[8 : 8+nonceLen]); err != nil {
		return "", time.Time{}, err
	}
	b[8+nonceLen] = cred.kind
	copy(b[8+nonceLen+1:], cred.hash)
	sig, err := s.sign(ctx, ticketPurpose, b)
	if err != nil {
		return "", time.Time{}, err
	}
	return base64.RawURLEncoding.EncodeToString(append(b, sig...)), exp, nil
}

var errTicket = errors.New("watch ticket invalid, expired or already used: ask POST /api/v1/watch/ticket for a new one")

// redeemTicket checks a ticket and spends it.
func (s *Server) redeemTicket(ctx context.Context, t string, now time.Time) (ticketCred, error) {
	b, err := base64.RawURLEncoding.DecodeString(t)
	if err != nil || len(b) != ticketLen+sha256.Size {
		return ticketCred{}, errTicket
	}
	if !s.verify(ctx, ticketPurpose, b[:ticketLen], b[ticketLen:]) {
		return ticketCred{}, errTicket
	}
	exp := time.UnixMilli(int64(binary.BigEndian.Uint64(b)))
	if !now.Before(exp) {
		return ticketCred{}, errTicket
	}
	nonce := string(b[8 : 8+nonceLen])
	s.tickets.mu.Lock()
	defer s.tickets.mu.Unlock()
	if s.tickets.used == nil {
		s.tickets.used = map[string]time.Time{}
	}
	if now.Sub(s.tickets.swept) >= time.Second {
		// Spent tickets past their expiry go, at most once a second
		// (not a scan per redemption).
		s.tickets.swept = now
		for n, e := range s.tickets.used {
			if !now.Before(e) {
				delete(s.tickets.used, n)
			}
		}
	}
	if _, seen := s.tickets.used[nonce]; seen {
		return ticketCred{}, errTicket
	}
	s.tickets.used[nonce] = exp
	return ticketCred{kind: b[8+nonceLen], hash: b[8+nonceLen+1 : ticketLen]}, nil
}

// watchTicket answers POST /api/v1/watch/ticket.
func (s *Server) watchTicket(w http.ResponseWriter, r *http.Request) {
	cred := ticketCred{kind: credOurs}
	if p := access.From(r.Context()); p != nil && p.Kind == "kubernetes" {
		cred.kind = credKube
	}
	h := sha256.Sum256([]byte(bearer(r.Header.Get("Authorization"))))
	cred.hash = h[:]
	t, exp, err := s.issueTicket(r.Context(), time.Now(), cred)
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
		now := time.Now()
		cred, err := s.redeemTicket(r.Context(), t, now)
		if err != nil {
			writeErr(w, http.StatusUnauthorized, saltvolumes.Error{Code: saltvolumes.CodeUnauthorized, Field: "ticket", Message: err.Error()})
			return
		}
		check := func(ctx context.Context) error {
			if time.Since(now) >= kubeTicketStream {
				return errStreamLifetime
			}
			return nil
		}
		if cred.kind == credOurs {
			hash := hex.EncodeToString(cred.hash)
			check = func(ctx context.Context) error {
				p, err := s.checker().CheckHash(ctx, hash)
				if err == nil {
					err = s.bound(ctx, p)
				}
				return err
			}
			if err := check(r.Context()); err != nil {
				writeErr(w, http.StatusUnauthorized, saltvolumes.Error{Code: saltvolumes.CodeUnauthorized, Field: "ticket",
					Message: "the token this ticket was asked with is no longer valid: log in again"})
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), recheckKey{}, check)))
	})
}
