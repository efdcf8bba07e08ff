package api

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

// The replicas' own key signs what one replica vouches for to another (a
// watch ticket, a request passed to the leader): 32 random bytes, made by
// the first replica that needs it and kept in the store they share, so
// that nothing a caller holds (the bootstrap token included) derives it.
//
// Records have no create-if-absent: two replicas starting at once may
// each write one. Every key in the store is accepted and the first by
// record key signs, so both agree once each has read the other's; a
// signature that no known key checks reads the store again (at most once
// a second) before it is refused.
const (
	keysKind      = "replica-keys"
	keysReloadGap = time.Second
)

type keyring struct {
	mu     sync.Mutex
	keys   [][]byte
	loaded time.Time
}

func (s *Server) records() store.Records { return s.checker().Records }

// replicaKeys returns the keys, the signing one first.
func (s *Server) replicaKeys(ctx context.Context, reload bool) ([][]byte, error) {
	s.keys.mu.Lock()
	defer s.keys.mu.Unlock()
	if len(s.keys.keys) > 0 && (!reload || time.Since(s.keys.loaded) < keysReloadGap) {
		return s.keys.keys, nil
	}
	recs := s.records()
	if recs == nil {
		// No store (a test server): a key of this process alone.
		if len(s.keys.keys) == 0 {
			k, err := randomBytes(32)
			if err != nil {
				return nil, err
			}
			s.keys.keys = [][]byte{k}
		}
		return s.keys.keys, nil
	}
	keys, err := loadKeys(ctx, recs)
	if err == nil && len(keys) == 0 {
		var k, id []byte
		if k, err = randomBytes(32); err == nil {
			if id, err = randomBytes(8); err == nil {
				err = recs.PutRecord(ctx, keysKind, "k-"+hex.EncodeToString(id), []byte(hex.EncodeToString(k)))
			}
		}
		if err == nil {
			keys, err = loadKeys(ctx, recs)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the replicas' signing key: %w", err)
	}
	s.keys.keys, s.keys.loaded = keys, time.Now()
	return keys, nil
}

func loadKeys(ctx context.Context, recs store.Records) ([][]byte, error) {
	list, err := recs.ListRecords(ctx, keysKind)
	if err != nil {
		return nil, err
	}
	var keys [][]byte
	for _, r := range list {
		if k, err := hex.DecodeString(string(r.Data)); err == nil && len(k) == 32 {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

func randomBytes(n int) ([]byte, error) {
	b := make([]byte, n)
	_, err := rand.Read(b)
	return b, err
}

// purposeKey separates what a key signs: a ticket's signature is never a
// forward's.
func purposeKey(k []byte, purpose string) []byte {
	m := hmac.New(sha256.New, k)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

// sign is msg's signature for purpose with the signing key.
func (s *Server) sign(ctx context.Context, purpose string, msg []byte) ([]byte, error) {
	keys, err := s.replicaKeys(ctx, false)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, purposeKey(keys[0], purpose))
	m.Write(msg)
	return m.Sum(nil), nil
}

// verify says whether sig is msg's signature for purpose by any key of
// the replicas.
func (s *Server) verify(ctx context.Context, purpose string, msg, sig []byte) bool {
	for _, reload := range []bool{false, true} {
		keys, err := s.replicaKeys(ctx, reload)
		if err != nil {
			return false
		}
		for _, k := range keys {
			m := hmac.New(sha256.New, purposeKey(k, purpose))
			m.Write(msg)
			if hmac.Equal(m.Sum(nil), sig) {
				return true
			}
		}
	}
	return false
}
