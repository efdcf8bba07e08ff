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
// every sparse file no record claims (an orphan still takes its room), plus
// the data every sparse volume's snapshot pins (see snapshotPinned).
func (e *Engine) committed(recs []*nodestate.Record) int64 {
	sum := e.snapshotPinned()
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
	// A restore's copy (<uuid>.restore) takes its room beside its volume
	// until it is swapped in or dropped.
	if temps, _ := filepath.Glob(filepath.Join(e.State.Sparse(), "*.restore")); len(temps) > 0 {
		for _, p := range temps {
			if st, err := os.Lstat(p); err == nil && st.Mode().IsRegular() {
				sum += st.Size()
			}
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
	snaps, err := e.snapshotRecords("")
	if err != nil {
		return nil, failed("state", err, "reading snapshots")
	}
	// One lvs for the snapshots' fill levels and the thin pools, when
	// anything of ours may be on LVM.
	lvmToo := false
	for _, r := range recs {
		lvmToo = lvmToo || r.Spec.LVMLogicalVolume != nil || r.DMUUID != ""
	}
	for _, sn := range snaps {
		lvmToo = lvmToo || sn.LV != ""
	}
	if lvmToo {
		if lvs, ok := e.listLVs("the LVM snapshots' and thin pools' fill levels"); ok {
			fillFrom(snaps, lvs)
			c.ThinPools = thinPools(lvs)
		}
	}
	c.VGs = e.volumeGroups()
	c.Disks = candidateDisks(recs)
	for _, s := range snaps {
		c.Snapshots++
		c.SnapshotBytes += s.Allocated
		if s.StaleFreeze != "" {
			c.StaleFreezes++
		}
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

// snapshotPinned sums the bytes the sparse volumes' snapshots keep on the
// node: each its origin's data when it was taken, which a reflink shares
// at first and keeps once the origin changes it. A snapshot being taken
// counts from its first record on, so that two cannot both take the last
// room.
func (e *Engine) snapshotPinned() int64 {
	paths, _ := filepath.Glob(filepath.Join(e.State.Root, "snapshots", "*", "*.json"))
	var sum int64
	for _, p := range paths {
		if sn, err := readSnapshot(p); err == nil && sn.LV == "" {
			sum += sn.Allocated
		}
	}
	return sum
}

// snapshotRoomReserve is kept free on the filesystem of the sparse files
// by copies (a snapshot without reflink, a clone): 1 % of it, at least
// 64 MiB, so that the volumes on it never find it full because of one.
func snapshotRoomReserve(size int64) int64 { return max(size/100, 64<<20) }

// checkCopyRoom refuses a copy of data bytes of what (a snapshot, a clone)
// that the node has no room for: the data it pins must fit the overcommit
// rule with everything committed (pin: 0 for a clone, whose own size
// prepare has counted), and a copy that is not a reflink must fit the free
// space now, with snapshotRoomReserve to spare. Callers hold the global
// lock.
func (e *Engine) checkCopyRoom(what string, pin, data int64, reflink bool, counted int64) error {
	recs, errs := e.State.All()
	if len(errs) > 0 {
		return failed("state", errors.Join(errs...), "reading node state")
	}
	c, err := e.capacity(recs)
	if err != nil {
		return err
	}
	limit := int64(e.OvercommitRatio * float64(c.Size))
	// counted: what an earlier, killed try of the same copy reserved,
	// which its record still holds and Committed includes.
	if after := c.Committed - counted + pin; pin > 0 && after > limit {
		return refused("no_room", "%s keeps %s of data on %s, which would commit %s of %s, past the overcommit ratio %g (limit %s, already committed %s with snapshots): delete snapshots or volumes, or raise salt_volumes:overcommit_ratio in the minion config",
			what, spec.Approx(pin), c.Path, spec.Approx(after), spec.Approx(c.Size), e.OvercommitRatio, spec.Approx(limit), spec.Approx(c.Committed))
	}
	if reserve := snapshotRoomReserve(c.Size); !reflink && data > c.Free-reserve {
		return refused("no_room", "%s copies %s of data onto %s, which has %s free (%s of it kept free for the volumes): free space there, or put the state dir on a filesystem with reflink (xfs with reflink, btrfs), where a copy takes no room at first",
			what, spec.Approx(data), c.Path, spec.Approx(max(c.Free, 0)), spec.Approx(reserve))
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
