package engine

import (
	"context"
	"errors"
	"os"

	"github.com/salt-volumes/salt-volumes/internal/gpt"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/mkfs"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

func (e *Engine) prepareSparse(ctx context.Context, o *op, rec *nodestate.Record, res *Result) error {
	s := o.s
	file := e.State.SparseFile(s.UUID)
	res.BackingFile = file
	grow := growing(s, rec)
	if s.Source != nil && rec.Phase != nodestate.PhasePrepared {
		if _, err := e.cloneSparse(ctx, o); err != nil {
			return err
		}
	}

	f, created, fresh, grown, err := e.openSparseFile(s, grow)
	if err != nil {
		return err
	}
	defer f.Close()
	if created {
		o.changed = true
		o.step("file-created", "path", file)
	} else if grown {
		o.changed = true
		o.step("file-grown", "path", file, "size", s.SizeBytes)
	}

	// Format (or partition) the file before attaching it, so that udev, where
	// it runs, sees the final signature on the loop device's first event.
	// A file this run created holds nothing but zeros: no need to read it.
	var r probe.Result
	if !fresh {
		if r, err = probe.Device(f, s.SizeBytes, 512); err != nil {
			return failed("probe", err, "reading %s", file)
		}
	}
	act, err := decideContent(s, contentFacts{Where: file, Ours: ours(s, r), Found: r, Formatted: rec.Formatted(), OurFile: true})
	if err != nil {
		return err
	}
	if act == keepContent && encrypted(s) && !rec.Formatted() {
		if act, err = e.unfinishedContainer(ctx, o, file); err != nil {
			return err
		}
	}
	if act != keepContent {
		if err := e.writeSparse(ctx, o, f, act == rewriteContent); err != nil {
			return err
		}
	}
	if grow && s.Mode == spec.ModeBlock && !encrypted(s) {
		if err := e.growTable(o, f, s.SizeBytes, 512); err != nil {
			return err
		}
	}
	if !encrypted(s) {
		o.markWritten(rec, written(s, false))
	}

	dev, err := e.ensureLoop(ctx, o, file, fresh)
	if err != nil {
		return err
	}
	if grow {
		if err := e.growLoop(o, dev); err != nil {
			return err
		}
	}
	res.DeviceName, res.DevicePath = dev.Name, dev.Path
	if encrypted(s) {
		err = e.finishEncrypted(ctx, o, rec, dev.Name, res)
	} else {
		err = e.finishDevice(ctx, o, dev.Name, res)
	}
	if err != nil {
		return err
	}
	// A clone larger than its snapshot: its filesystem to the file's end
	// (asked on every run until the volume is prepared: a crash after the
	// copy forgets whether it was larger; growing a full one is nothing).
	cloneGrow := s.Source != nil && rec.Phase != nodestate.PhasePrepared
	if (grow || cloneGrow) && s.Mode == spec.ModeFilesystem {
		if err := e.growFS(ctx, o, res.DeviceName); err != nil {
			return err
		}
	}
	if encrypted(s) {
		if w := e.keyBesideData(s); w != "" {
			res.Warnings = append(res.Warnings, w)
		}
	}
	if grow {
		// Last: until now the record's size says a growth is unfinished.
		rec.Spec, o.unsaved = s, true
		o.step("grown", "size", s.SizeBytes)
	}
	return nil
}

// ensureLoop returns the loop device of the sparse file, attaching one if
// there is none. A fresh file has none: looking would read every bound
// loop device's status.
func (e *Engine) ensureLoop(ctx context.Context, o *op, file string, fresh bool) (loopdev.Device, error) {
	if !fresh {
		devs, err := loopdev.Find(file)
		if err != nil {
			return loopdev.Device{}, failed("loop", err, "looking for the loop device of %s", file)
		}
		if len(devs) > 0 {
			return devs[0], nil
		}
	}
	dev, err := loopdev.Attach(ctx, file)
	if err != nil {
		return dev, failed("attach", err, "attaching %s", file)
	}
	o.changed, o.fresh = true, true
	o.step("attached", "device", dev.Path)
	return dev, nil
}

// writeSparse formats or partitions the open sparse file and checks that
// it now carries the volume's signature.
func (e *Engine) writeSparse(ctx context.Context, o *op, f *os.File, force bool) error {
	s := o.s
	if encrypted(s) {
		// The filesystem is made inside, once the container is open.
		return e.formatContainer(ctx, o, f)
	}
	if s.Mode == spec.ModeFilesystem {
		if err := mkfs.Format(ctx, s.FSType, s.UUID, s.MkfsOptions, mkfs.Target{File: f}, force); err != nil {
			return failed("mkfs", err, "formatting %s", f.Name())
		}
		if err := verifyWritten(s, f, s.SizeBytes, 512); err != nil {
			return err
		}
		// mkfs syncs what it wrote; this covers the file's new size too,
		// before any record says the volume is written.
		if err := f.Sync(); err != nil {
			return failed("file", err, "syncing %s", f.Name())
		}
		o.changed = true
		o.step("formatted", "fsType", s.FSType)
		return nil
	}
	if _, _, err := gpt.CreateFresh(f, s.SizeBytes, 512, s.UUID, s.Name); err != nil {
		return failed("gpt", err, "writing the GPT of %s", f.Name())
	}
	o.changed = true
	o.step("partitioned")
	return nil
}

// verifyWritten fails unless what we just wrote really carries the volume:
// mkfs can exit 0 without writing the filesystem we asked for.
func verifyWritten(s *spec.Spec, f interface {
	ReadAt([]byte, int64) (int, error)
}, size int64, ss int) error {
	r, err := probe.Device(f, size, ss)
	if err != nil {
		return failed("mkfs_check", err, "reading back %s", s.Name)
	}
	if !ours(s, r) {
		return failed("mkfs_check", nil, "after mkfs, volume %s holds %s, not a %s filesystem with UUID %s", s.Name, r, s.FSType, s.UUID)
	}
	return nil
}

// openSparseFile opens (creating it at its exact size if needed) the
// volume's sparse file. A zero-length file is what a crash between create
// and truncate leaves behind. fresh tells that this run created the file:
// a new inode, which no loop device can be bound to yet.
func (e *Engine) openSparseFile(s *spec.Spec, grow bool) (f *os.File, created, fresh, grown bool, err error) {
	file := e.State.SparseFile(s.UUID)
	f, err = e.State.OpenSparse(s.UUID, os.O_RDWR|os.O_CREATE|os.O_EXCL)
	fresh = err == nil
	if errors.Is(err, os.ErrExist) {
		f, err = e.State.OpenSparse(s.UUID, os.O_RDWR)
	}
	if err != nil {
		return nil, false, false, false, refused("sparse_file", "opening %s: %v", file, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, false, false, failed("file", err, "reading %s", file)
	}
	switch st.Size() {
	case s.SizeBytes:
		return f, false, false, false, nil
	case 0:
		// Not synced here: what is written into the file next is synced
		// before the record says so, and a size lost to a crash is the
		// zero-length case above.
		if err := f.Truncate(s.SizeBytes); err != nil {
			f.Close()
			return nil, false, false, false, failed("file", err, "sizing %s", file)
		}
		return f, true, fresh, false, nil
	}
	if grow && st.Size() < s.SizeBytes {
		// Synced before anything is laid out over the new room.
		if err := f.Truncate(s.SizeBytes); err == nil {
			err = f.Sync()
		}
		if err != nil {
			f.Close()
			return nil, false, false, false, failed("file", err, "growing %s", file)
		}
		return f, false, false, true, nil
	}
	f.Close()
	return nil, false, false, false, refused("size_mismatch", "%s is %d bytes, but the volume is %d bytes: a volume only grows, and only through prepare with its new size", file, st.Size(), s.SizeBytes)
}

// written names what prepare writes for a spec: the filesystem type, a GPT
// on a whole disk or file, or the GUID of an existing partition.
func written(s *spec.Spec, partition bool) string {
	switch {
	case encrypted(s) && s.Mode == spec.ModeBlock:
		return "luks"
	case encrypted(s):
		return "luks+" + s.FSType
	case s.Mode == spec.ModeFilesystem:
		return s.FSType
	case partition:
		return "guid"
	}
	return "gpt"
}

// markWritten records that the volume's signature is on its storage, so it
// is never written again. It is saved with the prepared phase: a crash
// before that save finds our own signature there and keeps it.
func (o *op) markWritten(rec *nodestate.Record, what string) {
	if rec.Written != what {
		rec.Written, o.unsaved = what, true
	}
}
