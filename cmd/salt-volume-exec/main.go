// Command salt-volume-exec prepares, inspects, restores and removes local
// volumes on this node. stdout carries exactly one JSON document; progress
// and logs go to stderr as JSON lines.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/engine"
	"github.com/salt-volumes/salt-volumes/internal/freeze"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/toolpath"
)

const usage = `usage:
  salt-volume-exec [--state-dir DIR] prepare   --spec FILE|- [--keys-fd N]
  salt-volume-exec [--state-dir DIR] unprepare --spec FILE|- [--wipe]
  salt-volume-exec [--state-dir DIR] info      --spec FILE|-
  salt-volume-exec validate --spec FILE|-     (check a spec, print it normalised)
  salt-volume-exec [--state-dir DIR] list
  salt-volume-exec [--state-dir DIR] restore [--keys-fd N]
  salt-volume-exec [--state-dir DIR] last-restore  (the report the last restore left)
  salt-volume-exec [--state-dir DIR] snapshot        --spec FILE|- --name NAME [--size SIZE] [--freeze-limit 10s] [--owner ID]
                   (a sparse volume's point-in-time copy: reflink, else a sparse copy; a
                   mounted filesystem is never frozen longer than --freeze-limit, and a
                   copy that would need longer is refused before anything is frozen;
                   --owner ID, the control plane's: a snapshot of that name not taken
                   with ID is refused, exit 3 name_taken, and left as it is)
  salt-volume-exec [--state-dir DIR] snapshot-delete --spec FILE|- --name NAME [--thaw-stale] [--owner ID]
                   (--thaw-stale: first thaw a stale freeze an earlier snapshot of the
                   volume left, which no run thaws on its own once its limit is long
                   past: only if nobody else froze that filesystem since)
  salt-volume-exec [--state-dir DIR] snapshot-restore --spec FILE|- --name NAME
                   (a volume put back to its snapshot NAME in place, only while nothing
                   uses it; same UUID and persistent path. Sparse: the same loop device,
                   the snapshot stays. LVM: merged by LVM (lvconvert --merge) into the
                   same LV; a thin snapshot stays, a thick one is used up)
  salt-volume-exec [--state-dir DIR] snapshots [--spec FILE|-]

Global flags: --state-dir DIR, --log-level LEVEL, --overcommit-ratio R
(default 1, or $SALT_VOLUMES_OVERCOMMIT_RATIO: prepare refuses a sparse
volume that would commit more than R times the backing filesystem).
--keys-fd N (prepare, restore): the keys of encrypted volumes whose key the
Salt master keeps (provider master), read from file descriptor N as a JSON
object of volume names to base64 keys; the Salt module passes them there,
never on the command line, and the node keeps none of them.

Exit codes: 0 success, 1 failure, 2 invalid input, 3 refused to protect data.
`

var version = "dev"

func main() {
	toolpath.Pin()
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == freeze.WatchdogCommand {
		// Not a user's command: snapshot re-executes this binary so that
		// a freeze outlives no run (internal/freeze).
		return freeze.RunWatchdog(args[1:])
	}
	defaultDir := "/var/lib/salt-volumes"
	if d := os.Getenv("SALT_VOLUMES_STATE_DIR"); d != "" {
		defaultDir = d
	}
	global := flag.NewFlagSet("salt-volume-exec", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	stateDir := global.String("state-dir", defaultDir, "node state directory")
	logLevel := global.String("log-level", "info", "stderr log level: debug, info, warn, error")
	defaultRatio := "1"
	if r := os.Getenv("SALT_VOLUMES_OVERCOMMIT_RATIO"); r != "" {
		defaultRatio = r
	}
	ratio := global.String("overcommit-ratio", defaultRatio, "prepare: refuse a sparse volume that would commit more than this times the backing filesystem")
	if err := global.Parse(args); err != nil {
		return fail(stdout, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: err.Error() + "\n" + usage})
	}
	rest := global.Args()
	if len(rest) == 0 {
		return fail(stdout, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: "missing command\n" + usage})
	}
	cmd, rest := rest[0], rest[1:]

	sub := flag.NewFlagSet(cmd, flag.ContinueOnError)
	sub.SetOutput(io.Discard)
	specFile := sub.String("spec", "", "volume spec JSON file, or - for stdin")
	wipe := sub.Bool("wipe", false, "unprepare: erase this volume's signatures on a raw device")
	snapName := sub.String("name", "", "snapshot, snapshot-delete, snapshot-restore: the snapshot's name")
	snapSize := sub.String("size", "", "snapshot: a thick LVM snapshot's copy-on-write space (default: a quarter of the LV)")
	thawStale := sub.Bool("thaw-stale", false, "snapshot-delete: first thaw a stale freeze an earlier snapshot run of the volume left, however old (only if nobody else froze that filesystem since)")
	owner := sub.String("owner", "", "snapshot, snapshot-delete: the control plane's id of the snapshot: a snapshot of that name not taken with it is refused (name_taken), never answered, taken over or deleted")
	freezeLimit := sub.String("freeze-limit", "", "snapshot: the longest a mounted sparse volume's filesystem may be frozen (default 10s)")
	keysFD := sub.Int("keys-fd", -1, "prepare, restore: read the keys of provider-master volumes from this file descriptor (JSON: volume name to base64 key), which the Salt module passes; keys never go on the command line")
	sub.StringVar(stateDir, "state-dir", *stateDir, "node state directory")
	sub.StringVar(ratio, "overcommit-ratio", *ratio, "overcommit ratio")
	if err := sub.Parse(rest); err != nil {
		return fail(stdout, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: err.Error() + "\n" + usage})
	}
	if sub.NArg() > 0 {
		return fail(stdout, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: fmt.Sprintf("unexpected argument %q\n%s", sub.Arg(0), usage)})
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fail(stdout, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: "--log-level: " + err.Error()})
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := cancelOnSignal()
	defer stop()
	e := engine.New(*stateDir, log)
	r, perr := strconv.ParseFloat(*ratio, 64)
	if perr != nil || r <= 0 || math.IsInf(r, 0) || math.IsNaN(r) {
		return fail(stdout, &engine.Error{Kind: engine.KindInvalid, Code: "usage",
			Message: fmt.Sprintf("--overcommit-ratio: %q is not a positive number: use e.g. 1 (no overcommit) or 1.5", *ratio)})
	}
	e.OvercommitRatio = r
	if *keysFD >= 0 {
		keys, err := readKeys(*keysFD)
		if err != nil {
			return fail(stdout, engine.AsError(err))
		}
		e.Keys = keys
	}

	readSpec := func() (*spec.Spec, error) {
		switch *specFile {
		case "":
			return nil, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: cmd + " needs --spec FILE (or --spec - to read stdin)"}
		case "-":
			return spec.Parse(stdin)
		}
		f, err := os.Open(*specFile)
		if err != nil {
			return nil, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: "--spec: " + err.Error()}
		}
		defer f.Close()
		return spec.Parse(f)
	}

	var out any
	var err error
	switch cmd {
	case "prepare", "unprepare", "info", "validate":
		var s *spec.Spec
		if s, err = readSpec(); err != nil {
			break
		}
		switch cmd {
		case "validate":
			out = map[string]any{"spec": s, "sizeBytes": s.SizeBytes, "persistentPath": s.PersistentPath(), "type": s.Type()}
		case "prepare":
			out, err = e.Prepare(ctx, s)
		case "unprepare":
			out, err = e.Unprepare(ctx, s, engine.UnprepareOptions{Wipe: *wipe})
		default:
			out, err = e.Info(ctx, s)
		}
	case "snapshot", "snapshot-delete", "snapshot-restore":
		var s *spec.Spec
		if s, err = readSpec(); err != nil {
			break
		}
		if *snapName == "" {
			err = &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: cmd + " needs --name NAME (the snapshot's name)"}
			break
		}
		if cmd == "snapshot-restore" {
			out, err = e.RestoreSnapshot(ctx, s, *snapName)
		} else if cmd == "snapshot" {
			var opts engine.SnapshotOptions
			if *snapSize != "" {
				if opts.COWSize, err = spec.ParseSize(*snapSize); err != nil {
					err = &engine.Error{Kind: engine.KindInvalid, Code: "invalid_size", Message: "--size: " + err.Error() + " (a thick LVM snapshot's copy-on-write space, e.g. 64Mi)"}
					break
				}
			}
			if *freezeLimit != "" {
				if opts.FreezeLimit, err = engine.CheckFreezeLimit(*freezeLimit); err != nil {
					break
				}
			}
			opts.Owner = *owner
			out, err = e.TakeSnapshot(ctx, s, *snapName, opts)
		} else if err = e.DeleteSnapshotOwned(ctx, s, *snapName, *thawStale, *owner); err == nil {
			out = map[string]any{"deleted": *snapName, "volumeUUID": s.UUID}
		}
	case "snapshots":
		uuid := ""
		if *specFile != "" {
			var s *spec.Spec
			if s, err = readSpec(); err != nil {
				break
			}
			uuid = s.UUID
		}
		var snaps []*engine.Snapshot
		if snaps, err = e.Snapshots(uuid); err == nil {
			out = map[string]any{"snapshots": snaps}
		}
	case "list":
		var vols []*engine.Result
		if vols, err = e.List(ctx); err == nil {
			var c *saltvolumes.Capacity
			if c, err = e.Capacity(); err == nil {
				out = map[string]any{"volumes": vols, "capacity": c}
			}
		}
	case "last-restore":
		var rep *engine.RestoreReport
		if rep, err = e.LastRestore(); err == nil {
			out = map[string]any{"restore": rep}
		}
	case "restore":
		var rep *engine.RestoreReport
		if rep, err = e.Restore(ctx); err == nil {
			emit(stdout, rep)
			if rep.Failed > 0 {
				return engine.KindFailed
			}
			return 0
		}
	case "version":
		out = map[string]string{"version": version}
	default:
		err = &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: fmt.Sprintf("unknown command %q\n%s", cmd, usage)}
	}
	if err != nil {
		e := engine.AsError(err)
		log.Error("failed", "command", cmd, "code", e.Code, "error", e.Message)
		return fail(stdout, e)
	}
	emit(stdout, out)
	return 0
}

// maxKeysDoc bounds what --keys-fd reads: thousands of volumes' keys.
const maxKeysDoc = 1 << 20

// readKeys reads the keys the Salt module hands over on file descriptor
// fd: a JSON object of volume names to base64-encoded keys. Errors name
// the volume, never a key's bytes.
func readKeys(fd int) (map[string][]byte, error) {
	if fd < 3 {
		return nil, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: fmt.Sprintf("--keys-fd: %d is one of stdin, stdout and stderr: pass the keys on a descriptor of their own (3 or more)", fd)}
	}
	// A descriptor that is not open fails the read below (EBADF).
	f := os.NewFile(uintptr(fd), "keys")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeysDoc+1))
	if err != nil {
		return nil, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: fmt.Sprintf("--keys-fd: reading descriptor %d: %v", fd, err)}
	}
	if len(b) > maxKeysDoc {
		return nil, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: fmt.Sprintf("--keys-fd: more than %d bytes of keys", maxKeysDoc)}
	}
	var doc map[string]string
	if err := json.Unmarshal(b, &doc); err != nil {
		// Not the JSON error itself: it may quote what it read.
		return nil, &engine.Error{Kind: engine.KindInvalid, Code: "usage", Message: "--keys-fd: not a JSON object of volume names to base64 keys"}
	}
	// A key that is not base64 is kept as nil: the volume it names is
	// refused when it needs it, and every other volume goes on.
	keys := make(map[string][]byte, len(doc))
	for name, v := range doc {
		k, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			k = nil
		}
		keys[name] = k
	}
	return keys, nil
}

// cancelOnSignal returns a context cancelled by SIGINT or SIGTERM, so that
// the mkfs or wipefs we run stops with us. The handler is installed beside
// the run, not before it: installing it costs 0.1-0.25 ms (the runtime
// starts a thread to wait for signals), and every run of the binary waits
// for it otherwise. A signal that comes before it is installed kills the
// process as an unhandled one would, which every step is made to survive
// (see the crash tests).
func cancelOnSignal() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(ch)
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func emit(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func fail(w io.Writer, e *engine.Error) int {
	emit(w, map[string]any{"error": map[string]string{"code": e.Code, "message": e.Message}})
	return e.Kind
}
