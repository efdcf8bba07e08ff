// Command salt-volumes is the control plane: `serve` runs it, the other
// commands are its CLI client. Each command lives in its own file and
// returns an error; run turns errors into exit codes in one place.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/toolpath"
)

var version = "dev"

// Exit codes, documented in --help and the man page (TestManPageNamesEveryCommandAndExitCode keeps them so).
const (
	exitOK       = 0
	exitFailed   = 1 // server error, or the volume ended Failed while waiting
	exitUsage    = 2 // bad flags or a spec the server refused as invalid
	exitRefused  = 3 // conflict: name taken, deletion forbidden, a limit
	exitNotFound = 4
	exitTimeout  = 5
	exitDenied   = 6 // 401 or 403: the token is not valid, or its role or Salt ACL does not allow it
)

const usage = `salt-volumes: local persistent volumes on Salt-managed nodes

Server:
  salt-volumes serve --config FILE [--listen HOST:PORT] [--min-schedule-every D]

Client (finds the server through SALT_VOLUMES_URL and SALT_VOLUMES_TOKEN or
SALT_VOLUMES_TOKEN_FILE, or --url/--token/--token-file; for https with a
private CA, SALT_VOLUMES_CA or --ca-file, and a client certificate with
SALT_VOLUMES_CERT and SALT_VOLUMES_KEY or --cert-file/--key-file; without a token, the session
salt-volumes login keeps):
  salt-volumes login [--user U] [--eauth pam|ldap|file|...]   log in with your Salt identity
  salt-volumes logout
  salt-volumes create NAME --node N (--size Q | --device PATH) [--mode Block] [--fs xfs]
                      [--mkfs-option OPT]... [--uuid U] [--label K=V]... [--annotation K=V]...
                      [--wait] [--timeout D]
  salt-volumes create NAME --node N --size Q --vg VG [--thin-pool POOL] [--wipe-signatures] ...
                                 an LVM logical volume in the existing volume group VG
  salt-volumes create NAME --from snapshot/SNAP|volume/VOL [--size Q] [--wait]
                                 a clone of a snapshot, or of a volume as it is now, on its node (its own uuid)
  salt-volumes ls [--node N] [-o table|json]
  salt-volumes get NAME [-o table|json]
  salt-volumes rm NAME [--wipe | --forget] [--wait] [--timeout D]
  salt-volumes resize NAME --size Q | --to-device [--wait] [--timeout D]
                                 grow a sparse volume to Q, or a raw one to its grown device (never shrinks)
  salt-volumes wait NAME --for Available|Deleted [--timeout D]
  salt-volumes snapshot create VOLUME NAME [--wait] | snapshot ls [VOLUME] | snapshot get NAME
  salt-volumes snapshot rm NAME [--wait]   snapshots of sparse volumes, kept on their nodes
  salt-volumes snapshot restore NAME [--wait] [--timeout D]   put its volume back to it in place (unmounted; operator)
  salt-volumes snapshot schedule VOLUME --every D --keep N [--max-age D]   the control plane takes and prunes them (operator)
  salt-volumes snapshot schedules [VOLUME] [--source api|salt] [-o table|json]   the API's and the nodes' Salt schedules
  salt-volumes snapshot unschedule VOLUME   its schedule goes, its snapshots stay
  salt-volumes watch [--node N] [-o table|json]
  salt-volumes nodes [-o table|json]
  salt-volumes node forget NODE [--yes]   a node gone for good: forget its volumes (listed, confirmed), touching no disk
  salt-volumes status [-o table|json]     ready? and the replica's role (leader, follower of ...)
  salt-volumes whoami [-o table|json]     who the token is: user, role (viewer, operator, admin)
  salt-volumes token create NAME --role viewer|operator|admin [--expires 90d]
                                          a service token (admin); its secret is printed once
  salt-volumes token list | token revoke NAME
  salt-volumes audit [--user U] [--volume V] [--since 7d] [--limit N] [-o table|json]
                                          who changed what, and what was refused (admin)
  salt-volumes pv NAME [--storage-class S] [--hostname H] [--reclaim-policy Retain|Delete]
                  [--mount-option O]...      a local PersistentVolume (YAML) for kubectl
  salt-volumes storageclass [--name S] [--reclaim-policy Delete|Retain] [--fs-type T] [--mkfs-options O]
                            [--static] [--provisioner P] [--mount-option O]...   a StorageClass (YAML)
  salt-volumes store migrate --from SRC --to DST [--etcd-prefix P] [--etcd-ca-file F --etcd-cert-file F --etcd-key-file F]
                  moves every volume between stores (bbolt:FILE, etcd:URL[,URL...],
                  kubernetes:KUBECONFIG for Volume objects [--namespace NS]); serve stopped
  salt-volumes version

Exit codes: 0 ok, 1 failed, 2 invalid input, 3 refused (conflict or deletion
not allowed now), 4 not found, 5 timed out, 6 not allowed (token or role).
`

// commands maps each command (and its aliases) to its function.
var commands = map[string]func(c *cli, ctx context.Context, args []string) error{
	"serve":        (*cli).serve,
	"create":       (*cli).create,
	"ls":           (*cli).list,
	"list":         (*cli).list,
	"get":          (*cli).get,
	"rm":           (*cli).rm,
	"resize":       (*cli).resize,
	"delete":       (*cli).rm,
	"wait":         (*cli).wait,
	"watch":        (*cli).watch,
	"nodes":        (*cli).nodes,
	"node":         (*cli).node,
	"pv":           (*cli).pv,
	"storageclass": (*cli).storageClass,
	"store":        (*cli).storeCmd,
	"status":       (*cli).status,
	"token":        (*cli).tokenCmd,
	"snapshot":     (*cli).snapshotCmd,
	"audit":        (*cli).audit,
	"whoami":       (*cli).whoami,
	"login":        (*cli).login,
	"logout":       (*cli).logout,
	"version": func(c *cli, _ context.Context, _ []string) error {
		fmt.Fprintln(c.out, version)
		return nil
	},
}

func main() {
	toolpath.Pin()
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
	c := &cli{in: os.Stdin, out: stdout, errw: stderr}
	cmd, ok := commands[args[0]]
	if !ok {
		return c.exit(failf(exitUsage, "unknown command %q\n\n%s", args[0], usage))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.exit(cmd(c, ctx, args[1:]))
}

// exitError is an error with its exit code; an empty message was already
// printed (the flag package prints its own).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func failf(code int, format string, a ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, a...)}
}

// errUsage: bad flags, already explained by the flag package.
var errUsage = &exitError{code: exitUsage}

// exit is the one mapping from errors to messages and exit codes.
func (c *cli) exit(err error) int {
	if err == nil {
		return exitOK
	}
	code, msg := exitFailed, err.Error()
	var ee *exitError
	var ce *client.Error
	switch {
	case errors.As(err, &ee):
		code, msg = ee.code, ee.msg
	case errors.As(err, &ce):
		msg = ce.Body.Message
		switch ce.Status {
		case 400:
			code = exitUsage
		case 401, 403:
			code = exitDenied
		case 404:
			code = exitNotFound
		case 409, 429, 503:
			code = exitRefused
		}
	case errors.Is(err, context.DeadlineExceeded):
		code = exitTimeout
	}
	if msg != "" {
		fmt.Fprintf(c.errw, "salt-volumes: %s\n", msg)
	}
	return code
}

type cli struct {
	in        io.Reader // answers to questions (node forget)
	out, errw io.Writer
	url       string
	token     string
	tokenFile string
	output    string
	// TLS: a CA to trust beyond the system's, and a client certificate
	// for a serve with tls.clientCAFile.
	caFile, certFile, keyFile string
}

// flags adds the client flags every command shares.
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.errw)
	fs.StringVar(&c.url, "url", os.Getenv("SALT_VOLUMES_URL"), "API address (SALT_VOLUMES_URL)")
	fs.StringVar(&c.token, "token", "", "API token (default SALT_VOLUMES_TOKEN; prefer the variable: flags show in ps)")
	fs.StringVar(&c.tokenFile, "token-file", os.Getenv("SALT_VOLUMES_TOKEN_FILE"), "file holding the API token (SALT_VOLUMES_TOKEN_FILE)")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	fs.StringVar(&c.caFile, "ca-file", os.Getenv("SALT_VOLUMES_CA"), "CA certificate(s) to trust for an https URL, besides the system's (SALT_VOLUMES_CA)")
	fs.StringVar(&c.certFile, "cert-file", os.Getenv("SALT_VOLUMES_CERT"), "client certificate, for a server that asks for one (SALT_VOLUMES_CERT)")
	fs.StringVar(&c.keyFile, "key-file", os.Getenv("SALT_VOLUMES_KEY"), "the client certificate's key (SALT_VOLUMES_KEY)")
	return fs
}

// args parses flags before and after positional arguments and checks how
// many positional arguments there are; what says what they should be.
func args(fs *flag.FlagSet, in []string, want int, what string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(in); err != nil {
			return nil, errUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		in = fs.Args()[1:]
	}
	// want < 0: any number, the command checks them.
	if want >= 0 && len(pos) != want {
		return nil, failf(exitUsage, "%s: %s", fs.Name(), what)
	}
	return pos, nil
}

// open parses the command line and opens the client: the opening every
// client command shares.
func (c *cli) open(fs *flag.FlagSet, in []string, want int, what string) ([]string, *client.Client, error) {
	pos, err := args(fs, in, want, what)
	if err != nil {
		return nil, nil, err
	}
	cl, err := c.client()
	return pos, cl, err
}

// client opens the API client the flags and environment describe.
func (c *cli) client() (*client.Client, error) {
	if c.token == "" {
		c.token = os.Getenv("SALT_VOLUMES_TOKEN")
	}
	if c.token == "" && c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, failf(exitUsage, "--token-file: %v", err)
		}
		c.token = strings.TrimSpace(string(b))
	}
	// No token given: the saved login, for its server.
	if s := loadSession(); c.token == "" && s != nil && (c.url == "" || c.url == s.URL) {
		c.url, c.token = s.URL, s.Token
	}
	switch {
	case c.url == "":
		return nil, failf(exitUsage, "no server: set SALT_VOLUMES_URL (e.g. http://127.0.0.1:8080) or pass --url")
	case c.token == "":
		return nil, failf(exitUsage, "no token: salt-volumes login, or set SALT_VOLUMES_TOKEN or SALT_VOLUMES_TOKEN_FILE, or pass --token-file")
	case c.output != "table" && c.output != "json":
		return nil, failf(exitUsage, "-o %s: use table or json", c.output)
	case (c.certFile == "") != (c.keyFile == ""):
		return nil, failf(exitUsage, "--cert-file and --key-file (SALT_VOLUMES_CERT, SALT_VOLUMES_KEY): give both or neither")
	}
	cl := &client.Client{URL: c.url, Token: c.token}
	if c.caFile != "" || c.certFile != "" {
		hc, err := client.HTTPS(c.caFile, c.certFile, c.keyFile)
		if err != nil {
			return nil, failf(exitUsage, "%v", err)
		}
		cl.HTTP = hc
	}
	return cl, nil
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }
