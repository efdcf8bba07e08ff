package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Records keeps the control plane's small records beside its volumes:
// access tokens and sessions, audit entries. They live in the same backend
// as the volumes, so every replica reads the same ones, and a read goes to
// the backend itself, not to a cache: a token revoked through one replica
// is refused by the next request to any other.
type Records interface {
	// PutRecord writes (or replaces) one record.
	PutRecord(ctx context.Context, kind, key string, data []byte) error
	// GetRecord reads one (ErrNoRecord when absent).
	GetRecord(ctx context.Context, kind, key string) ([]byte, error)
	// ListRecords returns a kind's records sorted by key.
	ListRecords(ctx context.Context, kind string) ([]Record, error)
	// DeleteRecord removes one; an absent record is not an error.
	DeleteRecord(ctx context.Context, kind, key string) error
}

// Record is one stored record.
type Record struct {
	Key  string
	Data []byte
}

// ErrNoRecord is GetRecord's answer for a key it does not hold.
var ErrNoRecord = errors.New("no such record")

// recordName bounds kinds and keys to what every backend can name: a
// Kubernetes object name is a DNS label set, lower case, digits and '-'.
var recordName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,98}[a-z0-9])?$`)

func checkRecord(kind, key string) error {
	if !recordName.MatchString(kind) {
		return fmt.Errorf("record kind %q: lower-case letters, digits and '-' only", kind)
	}
	if key != "" && !recordName.MatchString(key) {
		return fmt.Errorf("record key %q: lower-case letters, digits and '-' only, at most 100", key)
	}
	return nil
}

var recordsBucket = []byte("records")

// PutRecord writes one record in the kind's own bucket under "records".
func (s *Bolt) PutRecord(_ context.Context, kind, key string, data []byte) error {
	if err := checkRecord(kind, key); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		top, err := tx.CreateBucketIfNotExists(recordsBucket)
		if err != nil {
			return err
		}
		b, err := top.CreateBucketIfNotExists([]byte(kind))
		if err != nil {
			return err
		}
		return b.Put([]byte(key), data)
	})
}

// GetRecord reads one record.
func (s *Bolt) GetRecord(_ context.Context, kind, key string) ([]byte, error) {
	if err := checkRecord(kind, key); err != nil {
		return nil, err
	}
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		b := kindBucket(tx, kind)
		if b == nil {
			return ErrNoRecord
		}
		v := b.Get([]byte(key))
		if v == nil {
			return ErrNoRecord
		}
		out = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

// ListRecords returns a kind's records in key order (bbolt's own).
func (s *Bolt) ListRecords(_ context.Context, kind string) ([]Record, error) {
	if err := checkRecord(kind, ""); err != nil {
		return nil, err
	}
	var out []Record
	err := s.db.View(func(tx *bolt.Tx) error {
		b := kindBucket(tx, kind)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			out = append(out, Record{Key: string(k), Data: append([]byte(nil), v...)})
			return nil
		})
	})
	return out, err
}

// DeleteRecord removes one record.
func (s *Bolt) DeleteRecord(_ context.Context, kind, key string) error {
	if err := checkRecord(kind, key); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := kindBucket(tx, kind)
		if b == nil {
			return nil
		}
		return b.Delete([]byte(key))
	})
}

func kindBucket(tx *bolt.Tx, kind string) *bolt.Bucket {
	top := tx.Bucket(recordsBucket)
	if top == nil {
		return nil
	}
	return top.Bucket([]byte(kind))
}

// recordKey: <prefix>/records/<kind>/<key>, outside the volumes' watch.
func (s *Etcd) recordKey(kind, key string) string { return s.prefix + "/records/" + kind + "/" + key }

// PutRecord writes one record; a put is safe to replay.
func (s *Etcd) PutRecord(ctx context.Context, kind, key string, data []byte) error {
	if err := checkRecord(kind, key); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.cli.Put(ctx, s.recordKey(kind, key), string(data)); err != nil {
		return unavailable("writing a "+kind+" record", err)
	}
	return nil
}

// GetRecord reads one record from etcd (a linearizable read).
func (s *Etcd) GetRecord(ctx context.Context, kind, key string) ([]byte, error) {
	if err := checkRecord(kind, key); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.recordKey(kind, key))
	if err != nil {
		return nil, unavailable("reading a "+kind+" record", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, ErrNoRecord
	}
	return resp.Kvs[0].Value, nil
}

// ListRecords returns a kind's records in key order (etcd's own).
func (s *Etcd) ListRecords(ctx context.Context, kind string) ([]Record, error) {
	if err := checkRecord(kind, ""); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	p := s.recordKey(kind, "")
	resp, err := s.cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, unavailable("listing "+kind+" records", err)
	}
	out := make([]Record, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, Record{Key: strings.TrimPrefix(string(kv.Key), p), Data: kv.Value})
	}
	return out, nil
}

// DeleteRecord removes one record.
func (s *Etcd) DeleteRecord(ctx context.Context, kind, key string) error {
	if err := checkRecord(kind, key); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.cli.Delete(ctx, s.recordKey(kind, key)); err != nil {
		return unavailable("deleting a "+kind+" record", err)
	}
	return nil
}
