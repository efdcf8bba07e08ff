// Package store keeps volume objects in an embedded bbolt file. Reads are
// served from memory; every write goes to disk before it is visible, so a
// control plane killed at any point restarts from what it last reported.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/salt-volumes/salt-volumes/internal/volume"
)

var bucket = []byte("volumes")

// ErrNotFound is returned for a volume the store does not hold.
var ErrNotFound = errors.New("volume not found")

// ErrExists is returned when creating a volume whose name is taken.
var ErrExists = errors.New("a volume with this name already exists")

// UUIDError is returned when creating a volume whose UUID another volume
// already has.
type UUIDError struct{ UUID, Owner string }

func (e *UUIDError) Error() string {
	return fmt.Sprintf("uuid %s already belongs to volume %q", e.UUID, e.Owner)
}

// openTimeout bounds the wait for the file lock another process holds.
var openTimeout = 5 * time.Second

// Store is the volume store. It is safe for concurrent use.
type Store struct {
	db *bolt.DB
	// createMu makes "name and uuid free? then reserve them" one step;
	// the write itself runs outside it, so concurrent creates share
	// fsyncs.
	createMu sync.Mutex
	reserved map[string]bool // names and uuids ("uuid:" prefix) being created
	mu       sync.RWMutex
	cache    map[string]*volume.Volume
	byUUID   map[string]string // uuid -> name, for the uniqueness check
	// Skipped lists records that could not be read at open: they are left
	// in the file, reported, and do not stop the others from loading.
	Skipped []string
}

// Open opens (or creates) the store file and loads every volume. A file
// whose pages are corrupt is an error that names it and says what to do,
// never a panic (under systemd's Restart=on-failure a panic is a crash
// loop).
func Open(path string) (s *Store, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store directory: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			s, err = nil, fmt.Errorf("store %s is corrupt (%v): stop salt-volumes serve, move the file aside "+
				"(check it with bbolt check), and start again: volumes prepared by salt_volumes state runs are adopted again as their nodes report them", path, p)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: openTimeout})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("opening store %s: another salt-volumes serve holds it", path)
		}
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	// A lone writer waits this long for company before its fsync; 2 ms
	// instead of bbolt's 10 keeps one API create snappy while a burst of
	// reconciles still shares fsyncs.
	db.MaxBatchDelay = 2 * time.Millisecond
	s = &Store{db: db, cache: map[string]*volume.Volume{}, byUUID: map[string]string{}, reserved: map[string]bool{}}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			var vol volume.Volume
			err := json.Unmarshal(v, &vol)
			if err == nil && vol.Spec.Name != string(k) {
				err = fmt.Errorf("it names volume %q", vol.Spec.Name)
			}
			if err != nil {
				s.Skipped = append(s.Skipped, fmt.Sprintf("volume %q: %v", k, err))
				return nil
			}
			s.cache[string(k)] = &vol
			s.byUUID[vol.Spec.UUID] = vol.Spec.Name
			return nil
		})
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("loading store %s: %w", path, err)
	}
	return s, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// Get returns a copy of the named volume.
func (s *Store) Get(name string) (*volume.Volume, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.cache[name]
	if !ok {
		return nil, ErrNotFound
	}
	c := v.Clone()
	return c, nil
}

// Names lists the volume names, sorted.
func (s *Store) Names() []string {
	s.mu.RLock()
	out := make([]string, 0, len(s.cache))
	for n := range s.cache {
		out = append(out, n)
	}
	s.mu.RUnlock()
	sort.Strings(out)
	return out
}

// List returns copies of all volumes, sorted by name.
func (s *Store) List() []*volume.Volume {
	s.mu.RLock()
	out := make([]*volume.Volume, 0, len(s.cache))
	for _, v := range s.cache {
		out = append(out, v.Clone())
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.Name < out[j].Spec.Name })
	return out
}

// OnNode returns copies of the volumes of one node (no copy of the others).
func (s *Store) OnNode(node string) []*volume.Volume {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*volume.Volume
	for _, v := range s.cache {
		if v.Spec.Node == node {
			out = append(out, v.Clone())
		}
	}
	return out
}

// Len is the number of volumes.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.cache)
}

// Create adds a volume; it fails if the name or the uuid is taken.
func (s *Store) Create(v *volume.Volume) error {
	name, uuidKey := v.Spec.Name, "uuid:"+v.Spec.UUID
	// Names and UUIDs are unique across the cluster: checked and reserved
	// under the create lock, so that concurrent creates cannot both pass.
	s.createMu.Lock()
	s.mu.RLock()
	_, exists := s.cache[name]
	owner := s.byUUID[v.Spec.UUID]
	s.mu.RUnlock()
	switch {
	case exists || s.reserved[name]:
		s.createMu.Unlock()
		return fmt.Errorf("%w: %q", ErrExists, name)
	case owner != "":
		s.createMu.Unlock()
		return &UUIDError{UUID: v.Spec.UUID, Owner: owner}
	case s.reserved[uuidKey]:
		s.createMu.Unlock()
		return &UUIDError{UUID: v.Spec.UUID, Owner: "a volume being created"}
	}
	s.reserved[name], s.reserved[uuidKey] = true, true
	s.createMu.Unlock()
	defer func() {
		s.createMu.Lock()
		delete(s.reserved, name)
		delete(s.reserved, uuidKey)
		s.createMu.Unlock()
	}()
	return s.Put(v)
}

// Put writes a volume. Concurrent writers share one fsync (bolt.Batch).
func (s *Store) Put(v *volume.Volume) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	name := v.Spec.Name
	if err := s.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Put([]byte(name), data)
	}); err != nil {
		return fmt.Errorf("saving volume %q: %w", name, err)
	}
	s.mu.Lock()
	if old, ok := s.cache[name]; ok && old.Spec.UUID != v.Spec.UUID {
		delete(s.byUUID, old.Spec.UUID)
	}
	s.cache[name] = v.Clone()
	s.byUUID[v.Spec.UUID] = name
	s.mu.Unlock()
	return nil
}

// Delete removes a volume.
func (s *Store) Delete(name string) error {
	if err := s.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Delete([]byte(name))
	}); err != nil {
		return fmt.Errorf("deleting volume %q: %w", name, err)
	}
	s.mu.Lock()
	if old, ok := s.cache[name]; ok && s.byUUID[old.Spec.UUID] == name {
		delete(s.byUUID, old.Spec.UUID)
	}
	delete(s.cache, name)
	s.mu.Unlock()
	return nil
}
