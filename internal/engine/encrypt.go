package engine

import (
	"context"
	"errors"
	"fmt"
	"os"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/internal/luks"
	"github.com/salt-volumes/salt-volumes/internal/mkfs"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// An encrypted volume is a LUKS2 container whose header carries
// luks.ContainerUUID(volume UUID), opened as luks.MapperName(volume UUID);
// the filesystem inside carries the volume UUID, so /dev/disk/by-uuid/<uuid>
// names the opened device and nothing else. The container is ours as a
// filesystem of ours is: by the UUID only we derive, under our record.

func encrypted(s *spec.Spec) bool { return s.Encryption != nil }

// holdsFS tells whether r is the volume's filesystem (what ours tells of a
// plain volume, and of an encrypted one's opened device).
func holdsFS(s *spec.Spec, r probe.Result) bool {
	return r.UUID == s.UUID && r.Kind == s.FSType || (s.FSType == spec.FSExt4 && r.UUID == s.UUID && (r.Kind == "ext2" || r.Kind == "ext3"))
}

// key returns what opens volume s's container: its key file (keyfile),
// or the key the master handed over for this run (master).
func (e *Engine) key(s *spec.Spec) (luks.Key, error) {
	if s.EncryptionProvider() == spec.ProviderMaster {
		k, ok := e.Keys[s.Name]
		if !ok {
			return luks.Key{}, refused("key_needed", "volume %s: its key is held by the Salt master (provider master) and none was handed over: apply the volume's state from the master (salt NODE salt_volumes.restore, or state.apply with the key in pillar at salt_volumes:keys:%s); nothing was changed", s.Name, s.Name)
		}
		if k == nil {
			return luks.Key{}, invalid("key", "volume %s: the key handed over is not base64: put 32 random bytes, base64-encoded, at salt_volumes:keys:%s (openssl rand -base64 32); nothing was changed", s.Name, s.Name)
		}
		if len(k) != luks.KeyBytes {
			return luks.Key{}, invalid("key", "volume %s: the key handed over is %d bytes, not %d: put 32 random bytes, base64-encoded, at salt_volumes:keys:%s (openssl rand -base64 32); nothing was changed", s.Name, len(k), luks.KeyBytes, s.Name)
		}
		return luks.BytesKey(k), nil
	}
	p := e.State.KeyFile(s.UUID)
	st, err := os.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return luks.Key{}, failed("key_missing", nil, "volume %s: its key %s is gone, and only it opens the volume's container: restore the file from a backup of the node's state dir", s.Name, p)
	case err != nil:
		return luks.Key{}, failed("key", err, "reading %s", p)
	case !st.Mode().IsRegular() || st.Size() != luks.KeyBytes:
		return luks.Key{}, failed("key", nil, "volume %s: %s is not a key of ours (a regular file of %d bytes): restore it from a backup of the node's state dir", s.Name, p, luks.KeyBytes)
	}
	return luks.FileKey(p), nil
}

// ensureKey makes the volume's key if it has none yet (keyfile). A key
// exists only before its container is formatted with it, or for its
// container.
func (e *Engine) ensureKey(o *op) (luks.Key, error) {
	k, err := e.key(o.s)
	if err == nil || o.s.EncryptionProvider() == spec.ProviderMaster {
		return k, err // the master makes and keeps its keys; the node never does
	}
	if AsError(err).Code != "key_missing" {
		return luks.Key{}, err
	}
	if err := e.State.Init(); err != nil {
		return luks.Key{}, failed("state", err, "preparing the state dir")
	}
	b, err := luks.NewKey()
	if err != nil {
		return luks.Key{}, failed("key", err, "making the key of %s", o.s.Name)
	}
	p := e.State.KeyFile(o.s.UUID)
	if err := nodestate.WriteFileAtomic(p, b, 0o400); err != nil {
		return luks.Key{}, failed("key", err, "writing the key of %s", o.s.Name)
	}
	o.changed = true
	o.step("key-created", "path", p)
	return luks.FileKey(p), nil
}

// keyBesideData warns when the volume's key is on the filesystem that
// holds its sparse file: a disk that leaves then carries both, and the
// key protects nothing. A filesystem of another disk mounted on the keys
// dir (or the state dir on another disk than the keys) separates them.
func (e *Engine) keyBesideData(s *spec.Spec) string {
	if s.EncryptionProvider() != spec.ProviderKeyfile {
		return ""
	}
	var k, d unix.Stat_t
	if unix.Stat(e.State.Keys(), &k) != nil || unix.Stat(e.State.Sparse(), &d) != nil || k.Dev != d.Dev {
		return ""
	}
	return fmt.Sprintf("the key of encrypted volume %s is on the same filesystem as its data (%s and %s): a disk that leaves carries both, so the encryption protects nothing there; mount a filesystem of another disk on %s (docs/encryption.md, \"The key\")",
		s.Name, e.State.Keys(), e.State.Sparse(), e.State.Keys())
}

// formatContainer writes the volume's LUKS2 header on its open sparse file
// and checks that the file now carries it.
func (e *Engine) formatContainer(ctx context.Context, o *op, f *os.File) error {
	s := o.s
	key, err := e.ensureKey(o)
	if err != nil {
		return err
	}
	if err := luks.Format(ctx, f.Name(), luks.ContainerUUID(s.UUID), key); err != nil {
		return failed("luks_format", err, "formatting the container of %s", s.Name)
	}
	if err := verifyWritten(s, f, s.SizeBytes, 512); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return failed("file", err, "syncing %s", f.Name())
	}
	o.changed = true
	o.step("luks-formatted", "container", luks.ContainerUUID(s.UUID))
	return nil
}

// unfinishedContainer decides about a header of ours that a prepare left
// before the record said the volume was written: luksFormat writes the
// header before the keyslot, so one cut short between the two leaves a
// header no key opens. Nothing was ever written through such a container:
// it is formatted again. One the key opens is kept (its filesystem may be
// in it already).
func (e *Engine) unfinishedContainer(ctx context.Context, o *op, file string) (contentAction, error) {
	key, err := e.key(o.s)
	if err != nil {
		return 0, err
	}
	ok, err := luks.Opens(ctx, file, key)
	if err != nil {
		return 0, failed("luks", err, "checking the container of %s", o.s.Name)
	}
	if ok {
		return keepContent, nil
	}
	o.step("luks-unfinished", "path", file)
	return rewriteContent, nil
}

// openContainer opens the container on loop device dev (once) and returns
// the opened device's kernel name.
func (e *Engine) openContainer(ctx context.Context, o *op, dev string) (string, error) {
	s := o.s
	name := luks.MapperName(s.UUID)
	if m, ok := luks.Mapped(name); ok {
		for _, sl := range m.Slaves {
			if sl == dev {
				return m.Device, nil
			}
		}
		return "", failed("open", nil, "%s is open on %v, not on /dev/%s which holds the volume's container: close it (cryptsetup close %s) and run again", name, m.Slaves, dev, name)
	}
	key, err := e.key(s)
	if err != nil {
		return "", err
	}
	if err := luks.Open(ctx, "/dev/"+dev, name, key); err != nil {
		return "", failed("open", err, "opening the container of %s", s.Name)
	}
	m, ok := luks.Mapped(name)
	if !ok {
		return "", failed("open", nil, "cryptsetup opened %s, but no device-mapper device shows it", name)
	}
	o.changed = true
	o.step("opened", "device", "/dev/"+m.Device, "name", name)
	return m.Device, nil
}

// formatInside makes the volume's filesystem on its opened container dm,
// unless it is there. A container we formatted holds nothing but what we
// wrote through it: until the record says the filesystem was made, what
// it shows (the cipher's view of zeros) is ours to write over.
func (e *Engine) formatInside(ctx context.Context, o *op, rec *nodestate.Record, dm string) error {
	s := o.s
	path, err := blockdev.EnsureNode(dm)
	if err != nil {
		return failed("node", err, "making /dev/%s", dm)
	}
	r, size, ss, err := openProbe(path)
	if err != nil {
		return failed("probe", err, "reading %s", path)
	}
	if holdsFS(s, r) {
		return nil
	}
	if rec.Written == written(s, false) {
		inside := *s
		inside.Encryption = nil
		return refused("damaged", "volume %s: its opened container %s no longer carries the volume's %s (found %s): not writing it again, its data may be recoverable (%s), then run prepare again",
			s.Name, path, expectedSignature(&inside), r, recovery(&inside, path))
	}
	if err := mkfs.Format(ctx, s.FSType, s.UUID, s.MkfsOptions, mkfs.Target{Path: path}, true); err != nil {
		return failed("mkfs", err, "formatting %s", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return failed("mkfs_check", err, "reading back %s", path)
	}
	defer f.Close()
	back, err := probe.Device(f, size, ss)
	if err != nil || !holdsFS(s, back) {
		return failed("mkfs_check", err, "after mkfs, the opened container %s of %s holds %s, not a %s filesystem with UUID %s", path, s.Name, back, s.FSType, s.UUID)
	}
	o.changed = true
	o.step("formatted", "fsType", s.FSType, "device", path)
	return nil
}

// mapping returns the volume's opened container if it is open on one of
// the loop devices of its file: a device-mapper device of that name on
// anything else is not the volume.
func (e *Engine) mapping(s *spec.Spec, loops []loopdev.Device) (luks.Mapping, bool) {
	m, ok := luks.Mapped(luks.MapperName(s.UUID))
	if !ok {
		return m, false
	}
	for _, sl := range m.Slaves {
		for _, l := range loops {
			if sl == l.Name {
				return m, true
			}
		}
	}
	return m, false
}

// checkContainerFree refuses a deletion while the opened container, or a
// loop device of the volume's file, is used by anything but the container
// itself: before anything is closed.
func (e *Engine) checkContainerFree(o *op, devs []loopdev.Device, res *Result) error {
	m, open := e.mapping(o.s, devs)
	if open {
		if err := e.refuseInUse(o.s, m.Device, res); err != nil {
			res.DeviceName, res.DevicePath = m.Device, "/dev/"+m.Device
			return err
		}
	}
	for _, d := range devs {
		u, err := e.usage(d.Name, res)
		if err != nil {
			return err
		}
		var others []string
		for _, h := range u.Holders {
			if !open || h != m.Device {
				others = append(others, h)
			}
		}
		if len(u.Mountpoints) > 0 || len(others) > 0 {
			res.DeviceName, res.DevicePath = d.Name, d.Path
			return refused("in_use", "volume %s: /dev/%s (the container's loop device) is used by %v %v besides the container: stop what uses it before deleting the volume", o.s.Name, d.Name, u.Mountpoints, others)
		}
	}
	return nil
}

// eraseSparse crypto-erases the container in the volume's file. It fails
// closed: a file that cannot be read, or that the record says holds our
// header but does not, is reported, never deleted as if erased. A prepare
// cut short before the header leaves nothing to erase.
func (e *Engine) eraseSparse(ctx context.Context, o *op, rec *nodestate.Record, file string) error {
	f, err := e.State.OpenSparse(o.s.UUID, os.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return failed("wipe", err, "opening %s to erase it", file)
	}
	r, err := probe.Device(f, o.s.SizeBytes, 512)
	f.Close()
	if err != nil {
		return failed("wipe", err, "reading %s", file)
	}
	if r.Kind != "LUKS" {
		if rec.Formatted() {
			return refused("wipe_unverified", "%s: volume %s: its record says the file holds our LUKS2 header, but it holds %s: not deleting it as erased; look at it, then delete without --wipe", saltvolumes.ReasonWipeUnverified, o.s.Name, r)
		}
		return nil
	}
	return e.cryptoErase(ctx, o, file)
}

// closeContainer closes the volume's opened container if it is open,
// after checking that nothing uses it.
func (e *Engine) closeContainer(ctx context.Context, o *op, devs []loopdev.Device, res *Result) error {
	name := luks.MapperName(o.s.UUID)
	m, ok := e.mapping(o.s, devs)
	if !ok {
		return nil
	}
	res.DeviceName, res.DevicePath = m.Device, "/dev/"+m.Device
	if err := e.refuseInUse(o.s, m.Device, res); err != nil {
		return err
	}
	if err := luks.Close(ctx, name); err != nil {
		return failed("close", err, "closing %s", name)
	}
	o.changed = true
	o.step("closed", "name", name)
	return nil
}

// cryptoErase destroys every keyslot of the volume's container on dev and
// reads the header back to prove it: without a keyslot no key opens the
// data, whatever copies of the key survive. A file that no longer holds
// our container (a rerun after the header was erased and the file kept)
// is checked the same way.
func (e *Engine) cryptoErase(ctx context.Context, o *op, dev string) error {
	h, err := luks.Dump(ctx, dev)
	if err != nil {
		return failed("wipe", err, "reading the header of %s", dev)
	}
	if h.UUID != luks.ContainerUUID(o.s.UUID) {
		return refused("foreign_data", "%s holds the LUKS container %s, not volume %s's: not erasing it", dev, h.UUID, o.s.Name)
	}
	if h.Keyslots > 0 {
		if err := luks.Erase(ctx, dev); err != nil {
			return failed("wipe", err, "erasing the keyslots of %s", dev)
		}
		if h, err = luks.Dump(ctx, dev); err != nil {
			return failed("wipe", err, "reading back the header of %s", dev)
		}
	}
	if h.Keyslots != 0 {
		return failed("wipe", nil, "%s: %d keyslots left after cryptsetup erase", dev, h.Keyslots)
	}
	o.changed = true
	o.step("wiped", "device", dev, "what", "luks-keyslots")
	return nil
}

// removeKey deletes the volume's key, last: until the volume is gone it may
// still open it. With wipe its bytes are overwritten in place first (on
// ext4 and xfs the same blocks; a copy-on-write filesystem may keep the
// old ones, as docs/encryption.md says).
func (e *Engine) removeKey(o *op, wipe bool) error {
	p := e.State.KeyFile(o.s.UUID)
	if wipe {
		if err := overwrite(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return failed("key", err, "overwriting %s", p)
		}
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return failed("key", err, "removing %s", p)
	}
	o.changed = true
	o.step("key-removed", "path", p)
	return nil
}

// overwrite writes zeros over the file at p, in place, and syncs them.
func overwrite(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err == nil {
		_, err = f.WriteAt(make([]byte, st.Size()), 0)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// finishEncrypted opens the container on loop device dev, makes the
// filesystem inside if it is not there yet, and links the opened device.
func (e *Engine) finishEncrypted(ctx context.Context, o *op, rec *nodestate.Record, dev string, res *Result) error {
	dm, err := e.openContainer(ctx, o, dev)
	if err != nil {
		return err
	}
	if o.s.Mode == spec.ModeFilesystem {
		if err := e.formatInside(ctx, o, rec, dm); err != nil {
			return err
		}
	}
	o.markWritten(rec, written(o.s, false))
	if growing(o.s, rec) {
		if err := e.growContainer(ctx, o, dm, dev); err != nil {
			return err
		}
	}
	return e.linkOpened(ctx, o, dm, res)
}

// linkOpened fills in the device fields of the opened container dm: a
// Filesystem volume's link is /dev/disk/by-uuid (udev's, or ours); a Block
// volume's path is /dev/mapper/sv-<uuid>, which device-mapper's own udev
// rules (or libdevmapper, without udev) make and remove with the device.
func (e *Engine) linkOpened(ctx context.Context, o *op, dm string, res *Result) error {
	if o.s.Mode == spec.ModeFilesystem {
		return e.linkDevice(ctx, o, dm, res)
	}
	path, size, err := e.node(ctx, o, dm)
	if err != nil {
		return err
	}
	res.DeviceName, res.DevicePath, res.Size = dm, path, size
	return nil
}

// growContainer has the opened container dm take the whole of its grown
// loop device dev (the filesystem inside grows next, as a plain one does).
func (e *Engine) growContainer(ctx context.Context, o *op, dm, dev string) error {
	outer, err := blockdev.SizeOf(dev)
	if err != nil {
		return failed("sysfs", err, "reading the size of %s", dev)
	}
	inner, err := blockdev.SizeOf(dm)
	if err != nil {
		return failed("sysfs", err, "reading the size of %s", dm)
	}
	if inner+spec.LUKSHeaderBytes >= outer {
		return nil // grown already (a rerun)
	}
	key, err := e.key(o.s)
	if err != nil {
		return err
	}
	if err := luks.Resize(ctx, luks.MapperName(o.s.UUID), key); err != nil {
		return failed("grow", err, "growing the container of %s", o.s.Name)
	}
	o.changed = true
	o.step("container-grown", "device", "/dev/"+dm)
	return nil
}
