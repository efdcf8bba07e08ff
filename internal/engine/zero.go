package engine

import (
	"errors"
	"fmt"
	"os"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"golang.org/x/sys/unix"
)

// sampleCount is how many drawn blocks a verification reads, besides the
// first and the last.
const sampleCount = 16

func wipeUnverified(name string, err error) error {
	return &Error{KindFailed, "wipe_unverified", fmt.Sprintf("%s: /dev/%s could not be zeroed and verified (%v): the volume keeps its node record, so its device is offered to no other volume; make the device writable (blockdev --setrw) or replace it, then delete again",
		saltvolumes.ReasonWipeUnverified, name, err)}
}

// zeroAndVerify zeroes every byte of /dev/<name> (through f when the
// caller holds it open for writing, else through an exclusive open of its
// own), then reads back the first, the last and sampleCount drawn blocks,
// which must be zero. Any failure is WipeUnverified.
func (e *Engine) zeroAndVerify(o *op, f *os.File, name string, res *Result) error {
	if f == nil {
		var err error
		f, err = os.OpenFile("/dev/"+name, os.O_RDWR|os.O_EXCL|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.EBUSY) {
			return refused("in_use", "opening /dev/%s to wipe it: %v", name, err)
		}
		if err != nil {
			return wipeUnverified(name, err)
		}
		defer f.Close()
	}
	size, _, err := blockdev.Geometry(int(f.Fd()))
	if err != nil {
		return wipeUnverified(name, err)
	}
	report := o.progress("zeroing", "device", name)
	report(0, size)
	for off := int64(0); off < size; off += blockdev.ZeroChunk {
		n := min(blockdev.ZeroChunk, size-off)
		if err := blockdev.ZeroOut(f, off, n); err != nil {
			return wipeUnverified(name, err)
		}
		report(off+n, size)
	}
	if err := f.Sync(); err != nil {
		return wipeUnverified(name, err)
	}
	seed := uint64(time.Now().UnixNano())
	offsets := blockdev.SampleOffsets(size, seed, sampleCount)
	rf, rd, err := blockdev.OpenDirect("/dev/" + name)
	if err != nil {
		return wipeUnverified(name, err)
	}
	defer rf.Close()
	if _, err := blockdev.VerifyZero(rd, offsets); err != nil {
		return wipeUnverified(name, fmt.Errorf("%w (sample seed %d)", err, seed))
	}
	o.changed = true
	o.step("zero-verified", "device", name, "bytes", size, "seed", seed, "blocks", len(offsets))
	res.Wiped = &saltvolumes.WipeCheck{Device: "/dev/" + name, Bytes: size, Seed: seed, Offsets: offsets}
	return nil
}
