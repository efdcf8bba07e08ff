// Package engine is the node engine behind salt-volume-exec: it prepares,
// inspects, restores and removes volumes on this machine.
package engine

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/luks"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"golang.org/x/sys/unix"
)

// Volume states reported by info, list and restore.
const (
	StatePrepared   = "prepared"
	StateDetached   = "detached"   // sparse: state and file, no loop device
	StateMissing    = "missing"    // state, but the file or device is gone
	StateOrphan     = "orphan"     // storage that is ours, but no state
	StateIncomplete = "incomplete" // a prepare started and did not finish
	StateAbsent     = "absent"     // nothing at all
	// StateDamaged: we wrote the volume, and its signature is gone. It is
	// never written again; the message says how to recover it.
	StateDamaged = "damaged"
	// StateLocked: an encrypted volume whose container is there but not
	// open (restore opens it where its key is at hand).
	StateLocked = "locked"
)

// Engine works under one state dir.
type Engine struct {
	State      nodestate.Dir
	Log        *slog.Logger
	UdevWait   time.Duration
	DetachWait time.Duration
	// OvercommitRatio bounds the sum of sparse sizes on the node against
	// the size of the filesystem holding them (1 = no overcommit).
	OvercommitRatio float64
	// Keys are the keys of provider-master volumes that the Salt master
	// handed over for this run, by volume name: held in memory only, so a
	// node taken away holds none of them.
	Keys map[string][]byte
}

// New returns an engine with the default waits.
func New(stateDir string, log *slog.Logger) *Engine {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Engine{
		State:           nodestate.Dir{Root: stateDir},
		Log:             log,
		UdevWait:        10 * time.Second,
		DetachWait:      10 * time.Second,
		OvercommitRatio: 1,
	}
}

// Result is the JSON document printed for one volume: the contract's
// Device, which the prepared state hands on to the control plane.
type Result = saltvolumes.Device

// Error kinds map to the binary's exit codes.
const (
	KindFailed  = 1
	KindInvalid = 2
	KindRefused = 3
)

// Error is a failure with a stable code and an exit kind.
type Error struct {
	Kind    int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

func invalid(code, format string, a ...any) error {
	return &Error{KindInvalid, code, fmt.Sprintf(format, a...)}
}

func refused(code, format string, a ...any) error {
	return &Error{KindRefused, code, fmt.Sprintf(format, a...)}
}

func failed(code string, err error, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	if err != nil {
		msg += ": " + err.Error()
	}
	return &Error{KindFailed, code, msg}
}

// AsError converts any error into an *Error (field errors are invalid input).
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var fe *spec.FieldError
	if errors.As(err, &fe) {
		return &Error{KindInvalid, "invalid_spec", fe.Error()}
	}
	return &Error{KindFailed, "failed", err.Error()}
}

// op carries one operation on one volume: its spec, what changed, and the
// step log.
type op struct {
	e       *Engine
	s       *spec.Spec
	changed bool
	// fresh: this run attached the volume's loop device, or wrote the raw
	// device through an exclusive open, a moment ago.
	fresh bool
	// probed: what admission found on the raw device, read under the
	// global lock a moment ago (nil if it did not read it).
	probed *probe.Result
	// unsaved: the record changed in memory, to be saved at the end.
	unsaved bool
	// sigs: libblkid's probe of the raw device, started before the locks.
	sigs *pendingSignatures
	// keyWithheld: a restore left the volume's container closed because
	// its key is the master's and none was handed over (not a failure).
	keyWithheld bool
	// final: the prepared record, staged while mkfs runs.
	final *pendingStage
	// link: the persistent path when the spec alone does not name it (an
	// LVM Block volume's, named by its LV's UUID).
	link string
}

func (o *op) persistentPath() string {
	if o.link != "" {
		return o.link
	}
	return o.s.PersistentPath()
}

func (o *op) step(name string, attrs ...any) {
	args := append([]any{"step", name, "volume", o.s.Name, "uuid", o.s.UUID}, attrs...)
	o.e.Log.Info("step", args...)
	failpoint.Hit(name)
}

// progressEvery spaces a long step's reports: each becomes a Salt event.
const progressEvery = time.Second

// progress reports a long step (a copy, a wipe) as step name with its
// bytes done and total: the first and the last report always, between
// them one for each whole percent more, at most one each progressEvery.
// So a step says at most 101 lines, however long it runs: the Salt module
// reads them from a pipe while it sends each as an event, which under
// salt-call with a slow master can take a minute, and a pipe that filled
// would stop the copy itself.
func (o *op) progress(name string, attrs ...any) func(done, total int64) {
	var last time.Time
	lastPct, ended := int64(-1), false
	return func(done, total int64) {
		if ended || total <= 0 {
			return
		}
		pct := done * 100 / total
		if done > 0 && done < total && (pct == lastPct || time.Since(last) < progressEvery) {
			return
		}
		last, lastPct, ended = time.Now(), pct, done >= total
		o.step(name, append(append([]any{}, attrs...), "done", done, "total", total)...)
	}
}

// lockVolume takes the volume's lock; callers hold it for the whole op.
func (e *Engine) lockVolume(u string) (*nodestate.Lock, error) {
	if err := e.State.Init(); err != nil {
		return nil, failed("state_dir", err, "preparing state dir %s", e.State.Root)
	}
	l, err := e.State.Lock(u)
	if err != nil {
		return nil, failed("lock", err, "locking volume %s", u)
	}
	return l, nil
}

// openProbe reads what a device or file holds.
func openProbe(path string) (probe.Result, int64, int, error) {
	f, rd, err := blockdev.OpenDirect(path)
	if err != nil {
		return probe.Result{}, 0, 0, err
	}
	defer f.Close()
	size, ss, err := geometry(f)
	if err != nil {
		return probe.Result{}, 0, 0, err
	}
	r, err := probe.Device(rd, size, ss)
	return r, size, ss, err
}

// geometry works for block devices and regular files alike.
func geometry(f *os.File) (int64, int, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if st.Mode()&os.ModeDevice != 0 {
		return blockdev.Geometry(int(f.Fd()))
	}
	return st.Size(), 512, nil
}

// ours tells whether a probe shows this volume's own signature.
func ours(s *spec.Spec, r probe.Result) bool {
	if encrypted(s) {
		return r.Kind == "LUKS" && r.UUID == luks.ContainerUUID(s.UUID)
	}
	if s.Mode == spec.ModeFilesystem {
		return holdsFS(s, r)
	}
	if r.Kind != "gpt" || r.GPT == nil {
		return false
	}
	p, ok := r.GPT.Partition(1)
	return ok && p.GUID == s.UUID
}

func (e *Engine) usage(name string, res *Result) (blockdev.Usage, error) {
	u, err := blockdev.UsageOf(name)
	if err != nil {
		return u, failed("usage", err, "checking whether %s is in use", name)
	}
	res.InUse, res.Mountpoints, res.Holders = u.InUse(), u.Mountpoints, u.Holders
	if len(u.Mountpoints) > 0 {
		var st unix.Statfs_t
		if unix.Statfs(u.Mountpoints[0], &st) == nil {
			res.FSUsed = int64(st.Blocks-st.Bfree) * st.Bsize
			res.FSFree = int64(st.Bavail) * st.Bsize
		}
	}
	return u, nil
}

func baseResult(s *spec.Spec) *Result {
	return &Result{
		Name:           s.Name,
		UUID:           s.UUID,
		Type:           s.Type(),
		Mode:           s.Mode,
		FSType:         s.FSType,
		PersistentPath: s.PersistentPath(),
	}
}
