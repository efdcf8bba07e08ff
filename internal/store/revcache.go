package store

import "github.com/salt-volumes/salt-volumes/internal/volume"

// revCache is the cache of a backend fed by a watch (etcd, the API
// server's Volume objects), kept once for both. Every copy carries its
// revision: a copy no newer than the one held is dropped, and so is one no
// newer than a deletion this replica made (a tombstone, kept until the
// watch has passed the deletion's revision, so that an older put arriving
// late cannot bring the volume back). A relist after a compaction or a gone
// resourceVersion replaces the whole through resync. seen is the newest
// revision the cache reflects; moved is closed and replaced each time it
// advances, for waiters (a new leader catching up). Callers hold mu.
type revCache struct {
	cached
	tombs map[string]int64
	seen  int64
	moved chan struct{}
}

func newRevCache() revCache {
	return revCache{cached: cached{vols: map[string]*volume.Volume{}}, tombs: map[string]int64{}, moved: make(chan struct{})}
}

// put takes v unless the cache holds it at that revision or later, or
// deleted it since; it reports whether v was taken. uid is the backend's
// id of the volume's object, for the watchers ("" where there is none).
func (c *revCache) put(v *volume.Volume, uid string) bool {
	name := v.Spec.Name
	cur := c.vols[name]
	if (cur != nil && cur.Revision >= v.Revision) || c.tombs[name] >= v.Revision {
		return false
	}
	c.vols[name] = v
	typ := Added
	if cur != nil {
		typ = Modified
	}
	c.queue(Event{Type: typ, Volume: v, Prev: cur, UID: uid})
	return true
}

// drop removes name if the cache holds something older than rev; it
// reports whether it did.
func (c *revCache) drop(name string, rev int64, uid string) bool {
	cur := c.vols[name]
	if cur == nil || cur.Revision >= rev {
		return false
	}
	delete(c.vols, name)
	gone := cur.Clone()
	gone.Revision = rev
	c.queue(Event{Type: Deleted, Volume: gone, Prev: cur, UID: uid})
	return true
}

// tomb records this replica's deletion of name at rev.
func (c *revCache) tomb(name string, rev int64) { c.tombs[name] = rev }

// advance records that the cache reflects rev: tombstones the watch has
// passed go, waiters wake.
func (c *revCache) advance(rev int64) {
	if rev <= c.seen {
		return
	}
	c.seen = rev
	for name, r := range c.tombs {
		if r <= rev {
			delete(c.tombs, name)
		}
	}
	close(c.moved)
	c.moved = make(chan struct{})
}

// resync makes the cache a fresh listing at rev: names it lacks are
// dropped, the others put (through the backend's own put and drop, which
// may keep more per volume), and the cache has seen rev.
func (c *revCache) resync(fresh map[string]*volume.Volume, rev int64, put func(*volume.Volume), drop func(name string)) {
	for name := range c.vols {
		if _, ok := fresh[name]; !ok {
			drop(name)
		}
	}
	for _, v := range fresh {
		put(v)
	}
	c.advance(rev)
}
