package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/salt-volumes/salt-volumes/internal/volume"
)

var bucket = []byte("volumes")

// meta holds the store's format (format.go).
var meta = []byte("meta")

// openTimeout bounds the wait for the file lock another process holds.
var openTimeout = 5 * time.Second

// Bolt is the embedded backend: one file, one process (bbolt's file lock
// refuses a second serve). Revisions count writes since the file was
// opened: only this process writes, so they need not outlive it.
type Bolt struct {
	db *bolt.DB
	// createMu makes "name and uuid free? then reserve them" one step;
	// the write itself runs outside it, so concurrent creates share
	// fsyncs.
	createMu sync.Mutex
	reserved map[string]bool // names and uuids ("uuid:" prefix) being created
	// Guarded writes of one name wait for each other; writes of different
	// names never do, so that they share fsyncs (bolt.Batch).
	names  keyLocks
	cached                   // byUUID and rev are under its lock too
	byUUID map[string]string // uuid -> name, for the uniqueness check
	rev    int64
	// Skipped lists records that could not be read at open: they are left
	// in the file, reported, and do not stop the others from loading.
	Skipped []string
}

// Open opens (or creates) the store file and loads every volume. A file
// whose pages are corrupt is an error that names it and says what to do,
// never a panic (under systemd's Restart=on-failure a panic is a crash
// loop).
func Open(path string) (s *Bolt, err error) {
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
			return nil, fmt.Errorf("opening store %s: another salt-volumes serve (or store migrate) holds it", path)
		}
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	// A lone writer waits this long for company before its fsync; 2 ms
	// instead of bbolt's 10 keeps one API create snappy while a burst of
	// reconciles still shares fsyncs.
	db.MaxBatchDelay = 2 * time.Millisecond
	s = &Bolt{db: db, cached: cached{vols: map[string]*volume.Volume{}}, byUUID: map[string]string{}, reserved: map[string]bool{}}
	err = db.Update(func(tx *bolt.Tx) error {
		// The format first: a store of a newer format is left exactly as
		// it is (this transaction is rolled back).
		if m := tx.Bucket(meta); m != nil {
			if err := checkFormat(path, string(m.Get([]byte(formatKey)))); err != nil {
				return err
			}
		}
		m, err := tx.CreateBucketIfNotExists(meta)
		if err != nil {
			return err
		}
		if m.Get([]byte(formatKey)) == nil {
			if err := m.Put([]byte(formatKey), []byte(strconv.Itoa(Format))); err != nil {
				return err
			}
		}
		b, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			vol, err := decodeRecord(string(k), v)
			if err != nil {
				s.Skipped = append(s.Skipped, err.Error())
				return nil
			}
			s.rev++
			vol.Revision = s.rev
			s.vols[string(k)] = vol
			s.byUUID[vol.Spec.UUID] = vol.Spec.Name
			return nil
		})
	})
	if err != nil {
		db.Close()
		var fe *FormatError
		if errors.As(err, &fe) {
			return nil, err
		}
		return nil, fmt.Errorf("loading store %s: %w", path, err)
	}
	return s, nil
}

// decodeRecord reads one stored volume; bbolt and etcd store the same JSON.
func decodeRecord(key string, data []byte) (*volume.Volume, error) {
	var vol volume.Volume
	err := json.Unmarshal(data, &vol)
	if err == nil && vol.Spec.Name != key {
		err = fmt.Errorf("it names volume %q", vol.Spec.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("volume %q: %v", key, err)
	}
	return &vol, nil
}

// Close closes the file.
func (s *Bolt) Close() error { return s.db.Close() }

// Create adds a volume; it fails if the name or the uuid is taken.
func (s *Bolt) Create(ctx context.Context, v *volume.Volume) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name, uuidKey := v.Spec.Name, "uuid:"+v.Spec.UUID
	// Names and UUIDs are unique across the cluster: checked and reserved
	// under the create lock, so that concurrent creates cannot both pass.
	s.createMu.Lock()
	s.mu.RLock()
	_, exists := s.vols[name]
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
	defer s.names.lock(name)()
	return s.put(v, nil)
}

// Update writes v if the store still holds it at v.Revision.
func (s *Bolt) Update(ctx context.Context, v *volume.Volume) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	defer s.names.lock(v.Spec.Name)()
	cur, err := s.guard(v)
	if err != nil {
		return err
	}
	return s.put(v, cur)
}

// Delete removes the volume if the store still holds it at v.Revision.
func (s *Bolt) Delete(ctx context.Context, v *volume.Volume) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name := v.Spec.Name
	defer s.names.lock(name)()
	cur, err := s.guard(v)
	if err != nil {
		return err
	}
	if err := s.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Delete([]byte(name))
	}); err != nil {
		return fmt.Errorf("deleting volume %q: %w", name, err)
	}
	s.mu.Lock()
	defer s.unlockAndSend()
	if s.byUUID[cur.Spec.UUID] == name {
		delete(s.byUUID, cur.Spec.UUID)
	}
	delete(s.vols, name)
	s.rev++
	gone := cur.Clone()
	gone.Revision = s.rev
	s.queue(Event{Type: Deleted, Volume: gone, Prev: cur})
	return nil
}

// keyLocks are mutexes by name, made when wanted and dropped when free.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int
}

// lock locks name and returns its unlock.
func (k *keyLocks) lock(name string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[name]
	if l == nil {
		l = &keyLock{}
		k.m[name] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.m, name)
		}
		k.mu.Unlock()
	}
}

// guard returns the cached volume if it is at v.Revision (the caller holds
// the name's lock, so it cannot change before the write).
func (s *Bolt) guard(v *volume.Volume) (*volume.Volume, error) {
	s.mu.RLock()
	cur := s.vols[v.Spec.Name]
	s.mu.RUnlock()
	if cur == nil {
		return nil, &ConflictError{Name: v.Spec.Name}
	}
	if cur.Revision != v.Revision {
		return nil, &ConflictError{Name: v.Spec.Name, Current: cur.Clone()}
	}
	return cur, nil
}

// put writes v (prev: what it replaces, nil for a create). Concurrent
// writers share one fsync (bolt.Batch).
func (s *Bolt) put(v *volume.Volume, prev *volume.Volume) error {
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
	defer s.unlockAndSend()
	if prev != nil && prev.Spec.UUID != v.Spec.UUID && s.byUUID[prev.Spec.UUID] == name {
		delete(s.byUUID, prev.Spec.UUID)
	}
	s.rev++
	v.Revision = s.rev
	c := v.Clone()
	s.vols[name] = c
	s.byUUID[v.Spec.UUID] = name
	typ := Modified
	if prev == nil {
		typ = Added
	}
	s.queue(Event{Type: typ, Volume: c, Prev: prev})
	return nil
}

// cached is the in-memory copy both backends serve reads from, and their
// watchers; each backend keeps it current under mu.
type cached struct {
	mu       sync.RWMutex
	vols     map[string]*volume.Volume
	watchers cacheWatchers
	// Changes are queued under mu and sent after it is released (readers
	// do not wait for the watchers), in order: sendMu is taken before mu
	// is let go.
	pending []Event
	sendMu  sync.Mutex
}

// queue notes a change for the watchers (mu held for writing).
func (c *cached) queue(ev Event) { c.pending = append(c.pending, ev) }

// unlockAndSend releases mu and sends what was queued under it.
func (c *cached) unlockAndSend() {
	evs := c.pending
	c.pending = nil
	c.sendMu.Lock()
	c.mu.Unlock()
	defer c.sendMu.Unlock()
	for _, ev := range evs {
		c.watchers.send(ev)
	}
}

// Get returns a copy of the named volume.
func (c *cached) Get(name string) (*volume.Volume, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	v, ok := c.vols[name]
	if !ok {
		return nil, ErrNotFound
	}
	return v.Clone(), nil
}

// Names lists the volume names, sorted.
func (c *cached) Names() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]string, 0, len(c.vols))
	for n := range c.vols {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// List returns copies of all volumes, sorted by name.
func (c *cached) List() []*volume.Volume {
	c.mu.RLock()
	out := make([]*volume.Volume, 0, len(c.vols))
	for _, v := range c.vols {
		out = append(out, v.Clone())
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.Name < out[j].Spec.Name })
	return out
}

// OnNode returns copies of one node's volumes (no copy of the others).
func (c *cached) OnNode(node string) []*volume.Volume {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []*volume.Volume
	for _, v := range c.vols {
		if v.Spec.Node == node {
			out = append(out, v.Clone())
		}
	}
	return out
}

// Len is the number of volumes.
func (c *cached) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.vols)
}

// Watch calls fn after every change the cache takes, in order.
func (c *cached) Watch(fn func(Event)) func() { return c.watchers.add(fn) }

// cacheWatchers are the Watch callbacks of one store; send is called
// under the store's sendMu, which orders the calls.
type cacheWatchers struct {
	mu   sync.Mutex
	next int
	fns  map[int]func(Event)
}

func (w *cacheWatchers) add(fn func(Event)) func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fns == nil {
		w.fns = map[int]func(Event){}
	}
	id := w.next
	w.next++
	w.fns[id] = fn
	return func() {
		w.mu.Lock()
		delete(w.fns, id)
		w.mu.Unlock()
	}
}

func (w *cacheWatchers) send(ev Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, fn := range w.fns {
		fn(ev)
	}
}
