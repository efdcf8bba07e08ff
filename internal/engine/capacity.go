package engine

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"

	"github.com/google/uuid"
	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// backingFS measures the filesystem that holds (or will hold) the sparse
// files: the nearest existing ancestor of the sparse dir, so that a node
// that has no volume yet still answers.
func (e *Engine) backingFS() (path string, size, free int64, err error) {
	dir := e.State.Sparse()
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return dir, 0, 0, failed("statfs", err, "reading the size of the filesystem holding %s", e.State.Root)
	}
	return dir, int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

// committed sums what the node's sparse volumes may grow to: the spec size
// of every sparse record (a record comes before its file), plus the size of
// every sparse file no record claims (an orphan still takes its room).
func (e *Engine) committed(recs []*nodestate.Record) int64 {
	var sum int64
	known := map[string]bool{}
	for _, r := range recs {
		if r.Spec.SparseLoopDevice != nil {
			sum += r.Spec.SizeBytes
			known[r.Spec.UUID] = true
		}
	}
	ents, _ := os.ReadDir(e.State.Sparse())
	for _, ent := range ents {
		if u, err := uuid.Parse(ent.Name()); err != nil || known[u.String()] || ent.Name() != u.String() {
			continue
		}
		if st, err := os.Lstat(filepath.Join(e.State.Sparse(), ent.Name())); err == nil && st.Mode().IsRegular() {
			sum += st.Size()
		}
	}
	return sum
}

// Capacity reports the node's sparse capacity.
func (e *Engine) Capacity() (*saltvolumes.Capacity, error) {
	recs, errs := e.State.All()
	if len(errs) > 0 {
		return nil, failed("state", errors.Join(errs...), "reading node state")
	}
	c, err := e.capacity(recs)
	if err != nil {
		return nil, err
	}
	snaps, err := e.Snapshots("")
	if err != nil {
		return nil, failed("state", err, "reading snapshots")
	}
	for _, s := range snaps {
		c.Snapshots++
		c.SnapshotBytes += s.Allocated
		if s.Warning != "" {
			c.SnapshotWarnings = append(c.SnapshotWarnings, "snapshot "+s.Name+" of "+s.Volume+": "+s.Warning)
		}
	}
	return c, nil
}

func (e *Engine) capacity(recs []*nodestate.Record) (*saltvolumes.Capacity, error) {
	path, size, free, err := e.backingFS()
	if err != nil {
		return nil, err
	}
	return &saltvolumes.Capacity{Path: path, Size: size, Free: free, Committed: e.committed(recs), OvercommitRatio: e.OvercommitRatio}, nil
}

// checkOvercommit refuses a new sparse volume that would take the node's
// committed sizes past its overcommit ratio. Callers hold the global lock
// and pass every record, so two prepares cannot both take the last room.
func (e *Engine) checkOvercommit(s *spec.Spec, recs []*nodestate.Record) error {
	c, err := e.capacity(recs)
	if err != nil {
		return err
	}
	limit := int64(e.OvercommitRatio * float64(c.Size))
	if after := c.Committed + s.SizeBytes; after > limit {
		return refused("overcommit", "sparseLoopDevice.size: %s would commit %s of %s on %s, past the overcommit ratio %g (limit %s, already committed %s): use a smaller size, delete volumes, or raise salt_volumes:overcommit_ratio in the minion config",
			spec.Approx(s.SizeBytes), spec.Approx(after), spec.Approx(c.Size), c.Path, e.OvercommitRatio, spec.Approx(limit), spec.Approx(c.Committed))
	}
	return nil
}

// allocated is the room a file really takes (st_blocks counts 512-byte units).
func allocated(st os.FileInfo) int64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return 0
}
