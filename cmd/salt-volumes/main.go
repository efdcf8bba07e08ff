// Command salt-volumes is the control plane: `serve` runs it, the other
// commands are its CLI client.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	saltvolumes "github.com/salt-volumes/salt-volumes"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/config"
	"github.com/salt-volumes/salt-volumes/internal/server"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/ui"
)

var version = "dev"

// Exit codes (documented in README).
const (
	exitOK       = 0
	exitFailed   = 1 // server error, or the volume ended Failed while waiting
	exitUsage    = 2 // bad flags or a spec the server refused as invalid
	exitRefused  = 3 // conflict: name taken, deletion forbidden by the criteria
	exitNotFound = 4
	exitTimeout  = 5
)

const usage = `salt-volumes: local persistent volumes on Salt-managed nodes

Server:
  salt-volumes serve --config FILE

Client (finds the server through SALT_VOLUMES_URL and SALT_VOLUMES_TOKEN or
SALT_VOLUMES_TOKEN_FILE, or --url/--token/--token-file):
  salt-volumes create NAME --node N (--size Q | --device PATH) [--mode Block] [--fs xfs]
                      [--mkfs-option OPT]... [--uuid U] [--wait] [--timeout D]
  salt-volumes ls [--node N] [-o table|json]
  salt-volumes get NAME [-o table|json]
  salt-volumes rm NAME [--wipe | --forget] [--wait] [--timeout D]
  salt-volumes wait NAME --for Available|Deleted [--timeout D]
  salt-volumes watch [--node N] [-o table|json]
  salt-volumes nodes [-o table|json]
  salt-volumes pv NAME [--storage-class S] [--hostname H] [--reclaim-policy Retain|Delete]
                  [--mount-option O]...      a local PersistentVolume (YAML) for kubectl
  salt-volumes storageclass [--name S] [--mount-option O]...   its StorageClass (YAML)
  salt-volumes version

Exit codes: 0 ok, 1 failed, 2 invalid input, 3 refused (conflict or deletion
not allowed now), 4 not found, 5 timed out.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, rest := args[0], args[1:]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &cli{out: stdout, errw: stderr}
	switch cmd {
	case "serve":
		return c.serve(ctx, rest)
	case "create":
		return c.create(ctx, rest)
	case "ls", "list":
		return c.list(ctx, rest)
	case "get":
		return c.get(ctx, rest)
	case "rm", "delete":
		return c.rm(ctx, rest)
	case "wait":
		return c.wait(ctx, rest)
	case "watch":
		return c.watch(ctx, rest)
	case "nodes":
		return c.nodes(ctx, rest)
	case "pv":
		return c.pv(ctx, rest)
	case "storageclass":
		return c.storageClass(rest)
	case "version":
		fmt.Fprintln(stdout, version)
		return exitOK
	}
	fmt.Fprintf(stderr, "salt-volumes: unknown command %q\n\n%s", cmd, usage)
	return exitUsage
}

type cli struct {
	out, errw io.Writer
	url       string
	token     string
	tokenFile string
	output    string
}

func (c *cli) fail(code int, format string, a ...any) int {
	fmt.Fprintf(c.errw, "salt-volumes: "+format+"\n", a...)
	return code
}

// flags adds the client flags every command shares.
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.errw)
	fs.StringVar(&c.url, "url", os.Getenv("SALT_VOLUMES_URL"), "API address (SALT_VOLUMES_URL)")
	fs.StringVar(&c.token, "token", "", "API token (default SALT_VOLUMES_TOKEN; prefer the variable: flags show in ps)")
	fs.StringVar(&c.tokenFile, "token-file", os.Getenv("SALT_VOLUMES_TOKEN_FILE"), "file holding the API token (SALT_VOLUMES_TOKEN_FILE)")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	return fs
}

// parse accepts flags before and after positional arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func (c *cli) client() (*client.Client, error) {
	if c.token == "" {
		c.token = os.Getenv("SALT_VOLUMES_TOKEN")
	}
	if c.token == "" && c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		c.token = strings.TrimSpace(string(b))
	}
	if c.url == "" {
		return nil, errors.New("no server: set SALT_VOLUMES_URL (e.g. http://127.0.0.1:8080) or pass --url")
	}
	if c.token == "" {
		return nil, errors.New("no token: set SALT_VOLUMES_TOKEN or SALT_VOLUMES_TOKEN_FILE, or pass --token-file")
	}
	if c.output != "table" && c.output != "json" {
		return nil, fmt.Errorf("-o %s: use table or json", c.output)
	}
	return &client.Client{URL: c.url, Token: c.token}, nil
}

// apiErr maps an API error to a message and exit code.
func (c *cli) apiErr(err error) int {
	var ce *client.Error
	if errors.As(err, &ce) {
		code := exitFailed
		switch ce.Status {
		case 400:
			code = exitUsage
		case 401:
			code = exitFailed
		case 404:
			code = exitNotFound
		case 409:
			code = exitRefused
		}
		return c.fail(code, "%s", ce.Body.Message)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return c.fail(exitTimeout, "%v", err)
	}
	return c.fail(exitFailed, "%v", err)
}

func (c *cli) serve(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	path := fs.String("config", "/etc/salt-volumes/config.yaml", "configuration file (YAML)")
	if _, err := parse(fs, args); err != nil {
		return exitUsage
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return c.fail(exitUsage, "config logLevel: %q: use debug, info, warn or error", cfg.LogLevel)
	}
	log := slog.New(slog.NewJSONHandler(c.errw, &slog.HandlerOptions{Level: level}))
	if err := server.Run(ctx, cfg, log, ui.Handler(), nil); err != nil {
		return c.fail(exitFailed, "%v", err)
	}
	return exitOK
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func (c *cli) create(ctx context.Context, args []string) int {
	fs := c.flags("create")
	node := fs.String("node", "", "Salt minion id that holds the volume (required)")
	size := fs.String("size", "", "sparse file size: 10Gi, 500M, bytes")
	device := fs.String("device", "", "raw block device or partition on the node, e.g. /dev/sdb")
	mode := fs.String("mode", "Filesystem", "Filesystem or Block")
	fsType := fs.String("fs", "", "ext4 (default) or xfs; Filesystem mode only")
	id := fs.String("uuid", "", "volume UUID (default: a new random one)")
	var mkfs multi
	fs.Var(&mkfs, "mkfs-option", "option passed to mkfs (repeat for each)")
	wait := fs.Bool("wait", false, "wait until the volume is Available (or Failed)")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 {
		return c.fail(exitUsage, "create: give exactly one volume NAME")
	}
	if *node == "" {
		return c.fail(exitUsage, "create: --node: missing: the Salt minion id that will hold the volume")
	}
	if (*size == "") == (*device == "") {
		return c.fail(exitUsage, "create: give exactly one of --size (sparse file) and --device (raw device)")
	}
	sp := map[string]any{"name": pos[0], "node": *node, "mode": *mode}
	if *id != "" {
		sp["uuid"] = *id
	}
	if *fsType != "" {
		sp["fsType"] = *fsType
	}
	if len(mkfs) > 0 {
		sp["mkfsOptions"] = []string(mkfs)
	}
	if *size != "" {
		sp["sparseLoopDevice"] = map[string]any{"size": *size}
	} else {
		sp["rawBlockDevice"] = map[string]any{"devicePath": *device}
	}
	cl, err := c.client()
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	v, err := cl.Create(ctx, sp)
	if err != nil {
		return c.apiErr(err)
	}
	if !*wait {
		return c.show(v)
	}
	return c.waitFor(ctx, cl, v.Spec.Name, "Available", *timeout)
}

func (c *cli) list(ctx context.Context, args []string) int {
	fs := c.flags("ls")
	node := fs.String("node", "", "only this node's volumes")
	if pos, err := parse(fs, args); err != nil || len(pos) > 0 {
		return c.fail(exitUsage, "ls takes no arguments (filter with --node)")
	}
	cl, err := c.client()
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	items, err := cl.List(ctx, *node)
	if err != nil {
		return c.apiErr(err)
	}
	if c.output == "json" {
		return c.json(map[string]any{"items": items})
	}
	c.table(items)
	return exitOK
}

func (c *cli) get(ctx context.Context, args []string) int {
	fs := c.flags("get")
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 {
		return c.fail(exitUsage, "get: give one volume NAME")
	}
	cl, err := c.client()
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	v, err := cl.Get(ctx, pos[0])
	if err != nil {
		return c.apiErr(err)
	}
	return c.show(v)
}

func (c *cli) rm(ctx context.Context, args []string) int {
	fs := c.flags("rm")
	wipe := fs.Bool("wipe", false, "raw devices: also erase the signatures the volume wrote")
	forget := fs.Bool("forget", false, "a Failed volume whose node is gone: drop it without running anything on the node")
	wait := fs.Bool("wait", false, "wait until the volume is gone")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait: how long to wait")
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 {
		return c.fail(exitUsage, "rm: give one volume NAME")
	}
	cl, err := c.client()
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	if *wipe && *forget {
		return c.fail(exitUsage, "rm: --forget leaves the node untouched, so it cannot --wipe: use one or the other")
	}
	if *forget {
		_, err = cl.Forget(ctx, pos[0])
	} else {
		_, err = cl.Delete(ctx, pos[0], *wipe)
	}
	if err != nil {
		return c.apiErr(err)
	}
	if *wait {
		return c.waitFor(ctx, cl, pos[0], "Deleted", *timeout)
	}
	fmt.Fprintf(c.out, "volume %s: deletion requested\n", pos[0])
	return exitOK
}

func (c *cli) wait(ctx context.Context, args []string) int {
	fs := c.flags("wait")
	target := fs.String("for", "Available", "Available or Deleted")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait")
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 {
		return c.fail(exitUsage, "wait: give one volume NAME")
	}
	if *target != "Available" && *target != "Deleted" {
		return c.fail(exitUsage, "wait: --for %s: use Available or Deleted", *target)
	}
	cl, err := c.client()
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	return c.waitFor(ctx, cl, pos[0], *target, *timeout)
}

// waitFor follows the watch stream (no polling) until the volume reaches
// target, fails, or the timeout passes.
func (c *cli) waitFor(ctx context.Context, cl *client.Client, name, target string, timeout time.Duration) int {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *saltvolumes.View
	code := -1
	seen := false
	terminating := false // a Failed volume being deleted is not a failure until its deletion fails
	err := cl.Watch(ctx, "", name, func(ev saltvolumes.Event) bool {
		if ev.Type == client.Synced {
			if !seen {
				if target == "Deleted" {
					code = exitOK
				} else {
					code = c.fail(exitNotFound, "volume %q not found", name)
				}
				return false
			}
			return true
		}
		seen = true
		v := ev.Volume
		last = &v
		switch {
		case ev.Type == "DELETED" && target == "Deleted":
			code = exitOK
		case ev.Type == "DELETED":
			code = c.fail(exitFailed, "volume %s was deleted", name)
		case target == "Available" && v.Status.Phase.String() == "Available":
			code = c.show(v)
		case v.Status.Phase.String() == "Terminating":
			terminating = true
		case v.Status.Phase.String() == "Failed" && (target == "Available" || terminating):
			c.show(v)
			code = c.fail(exitFailed, "volume %s failed: %s", name, v.Status.Message)
		}
		return code < 0
	})
	if code >= 0 {
		if code == exitOK && target == "Deleted" {
			fmt.Fprintf(c.out, "volume %s deleted\n", name)
		}
		return code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		state := "unknown"
		if last != nil {
			state = last.Status.Phase.String()
			if last.Status.Step != "" {
				state += " (step " + last.Status.Step + ")"
			}
		}
		return c.fail(exitTimeout, "volume %s: not %s after %s; last seen %s", name, target, timeout, state)
	}
	return c.apiErr(err)
}

func (c *cli) watch(ctx context.Context, args []string) int {
	fs := c.flags("watch")
	node := fs.String("node", "", "only this node's volumes")
	if pos, err := parse(fs, args); err != nil || len(pos) > 0 {
		return c.fail(exitUsage, "watch takes no arguments (filter with --node)")
	}
	cl, err := c.client()
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	enc := json.NewEncoder(c.out)
	err = cl.Watch(ctx, *node, "", func(ev saltvolumes.Event) bool {
		if ev.Type == client.Synced {
			return true
		}
		if c.output == "json" {
			_ = enc.Encode(ev)
			return true
		}
		v := ev.Volume
		fmt.Fprintf(c.out, "%s %-8s %-20s %-12s %-12s %s\n", time.Now().Format("15:04:05"), ev.Type, v.Spec.Name, v.Spec.Node,
			v.Status.Phase, detail(v))
		return true
	})
	if errors.Is(err, context.Canceled) {
		return exitOK
	}
	return c.apiErr(err)
}

func (c *cli) nodes(ctx context.Context, args []string) int {
	fs := c.flags("nodes")
	if pos, err := parse(fs, args); err != nil || len(pos) > 0 {
		return c.fail(exitUsage, "nodes takes no arguments")
	}
	cl, err := c.client()
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	items, warn, err := cl.Nodes(ctx)
	if err != nil {
		return c.apiErr(err)
	}
	if warn != "" {
		fmt.Fprintln(c.errw, "warning:", warn)
	}
	if c.output == "json" {
		return c.json(map[string]any{"items": items})
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tUP\tVOLUMES\tPHASES")
	for _, n := range items {
		var ph []string
		for _, p := range []string{"Unknown", "Pending", "Available", "Failed", "Terminating"} {
			if n.Phases[p] > 0 {
				ph = append(ph, fmt.Sprintf("%s=%d", p, n.Phases[p]))
			}
		}
		fmt.Fprintf(tw, "%s\t%v\t%d\t%s\n", n.Name, n.Up, n.Volumes, strings.Join(ph, " "))
	}
	tw.Flush()
	return exitOK
}

func (c *cli) json(v any) int {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	return exitOK
}

func (c *cli) show(v saltvolumes.View) int {
	if c.output == "json" {
		return c.json(v)
	}
	c.table([]saltvolumes.View{v})
	return exitOK
}

// detail is the one thing worth reading about a volume in its phase.
func detail(v saltvolumes.View) string {
	st := v.Status
	switch {
	case st.Message != "":
		return st.Message
	case st.Step != "":
		return "step " + st.Step
	case st.PersistentPath != "":
		return st.PersistentPath
	}
	return ""
}

func kind(v saltvolumes.View) string {
	if v.Spec.SparseLoopDevice != nil {
		return "sparse"
	}
	return "raw:" + v.Spec.RawBlockDevice.DevicePath
}

func (c *cli) table(items []saltvolumes.View) {
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tNODE\tKIND\tMODE\tFS\tSIZE\tPHASE\tDEVICE\tAGE\tDETAIL")
	for _, v := range items {
		size := "-"
		if v.Status.Size > 0 {
			size = spec.FormatSize(v.Status.Size)
		} else if v.Spec.SparseLoopDevice != nil {
			size = string(v.Spec.SparseLoopDevice.Size)
		}
		fs := v.Spec.FSType
		if fs == "" {
			fs = "-"
		}
		dev := v.Status.DeviceName
		if dev == "" {
			dev = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Spec.Name, v.Spec.Node, kind(v), v.Spec.Mode, fs, size,
			v.Status.Phase, dev, age(v.CreatedAt), detail(v))
	}
	tw.Flush()
}

func age(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
