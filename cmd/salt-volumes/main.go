// Command salt-volumes is the control plane: `serve` runs it, the other
// commands are its CLI client. The commands are a cobra tree (root.go),
// one file per command or group of commands; each returns an error, and
// run turns errors into exit codes in one place (exit).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/toolpath"
)

var version = "dev"

// Exit codes, shown by --help and in the man page's EXIT STATUS
// (TestHelpAndManPagesKeepTheirPromises keeps them so).
const (
	exitOK       = 0
	exitFailed   = 1 // server error, or the volume ended Failed while waiting
	exitUsage    = 2 // bad flags or a spec the server refused as invalid
	exitRefused  = 3 // conflict: name taken, deletion forbidden, a limit waiting does not lift
	exitNotFound = 4
	exitTimeout  = 5
	exitDenied   = 6 // 401 or 403: the token is not valid, or its role or Salt ACL does not allow it
	exitRetry    = 7 // safe to retry: 503, 502 unavailable, 429 with Retry-After, 409 busy, no answer, a watch the server ended
	// An interrupted command exits 128 + the signal's number, as a shell
	// reports it: 130 for Ctrl-C.
	exitSignal = 128
)

// exitCodes is what each exit code means, for --help and the man page.
var exitCodes = []struct {
	code int
	what string
}{
	{exitOK, "ok"},
	{exitFailed, "failed: a server error, or what --wait (or wait) followed ended Failed"},
	{exitUsage, "invalid input: bad flags or arguments (an --url that is not http(s)://HOST, or that redirects; a token with a control character), or a spec the server refused (the message names the field)"},
	{exitRefused, "refused: a conflict (name taken, deletion not allowed now, with the reason), or a limit that waiting does not lift (limits.volumes)"},
	{exitNotFound, "not found"},
	{exitTimeout, "timed out waiting; the work goes on (salt-volumes wait NAME follows it again)"},
	{exitDenied, "not allowed: no valid token or session, or its role or Salt ACL does not allow it (401, 403)"},
	{exitRetry, "safe to retry: the server is unavailable (503; 502 when the leader or the Kubernetes API server it asks is out of reach), asks to come back later (429 with Retry-After), a concurrent change got in the way (409 busy), gave no answer (a connection refused, reset or cut, a timeout; but a TLS certificate refused, https to an http port and the like, which no retry mends, are 1), or ended the watch stream"},
	{exitSignal + int(syscall.SIGINT), "interrupted by Ctrl-C (SIGINT); 143 for SIGTERM"},
}

func main() {
	toolpath.Pin()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs one command line: the entry point, and what the unit tests
// call.
func run(args []string, stdout, stderr io.Writer) int {
	return runIO(args, os.Stdin, stdout, stderr)
}

// runIO is run reading answers (a password, a confirmation) from in.
func runIO(args []string, in io.Reader, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &cli{in: in, out: stdout, errw: stderr}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			if n, ok := s.(syscall.Signal); ok {
				c.signalled.Store(int32(n))
			}
			cancel()
		case <-ctx.Done():
		}
	}()
	root := c.root()
	root.SetArgs(args)
	root.SetIn(c.in)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return c.exit(root.ExecuteContext(ctx))
}

type cli struct {
	in        io.Reader // answers to questions (node forget), the password (login)
	out, errw io.Writer
	conn      conn
	// output is -o (empty: table); noHeaders drops the tables' heads.
	output    string
	noHeaders bool
	// signalled is the signal that interrupted the command (0: none).
	signalled atomic.Int32
}

// exitError is an error with its exit code; an empty message was already
// printed.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func failf(code int, format string, a ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, a...)}
}

// hinted is an error and what to do about it, said after its message;
// its exit code is the error's.
type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() + "; " + h.hint }
func (h *hinted) Unwrap() error { return h.err }

func hint(err error, format string, a ...any) error {
	return &hinted{err: err, hint: fmt.Sprintf(format, a...)}
}

// errUsage: a usage error already explained.
var errUsage = &exitError{code: exitUsage}

// exit is the one mapping from errors to messages and exit codes.
func (c *cli) exit(err error) int {
	if err == nil {
		return exitOK
	}
	if n := c.signalled.Load(); n != 0 {
		// Whatever the interrupted command made of its cancelled context.
		return exitSignal + int(n)
	}
	// What to do, said after the message: the innermost hint first.
	var hints []string
	for {
		h, ok := err.(*hinted)
		if !ok {
			break
		}
		err, hints = h.err, append([]string{h.hint}, hints...)
	}
	code, msg := exitFailed, err.Error()
	var ee *exitError
	var ce *client.Error
	var te *client.TransportError
	var re *client.RedirectError
	switch {
	case errors.As(err, &ee):
		code, msg = ee.code, ee.msg
	case errors.As(err, &ce):
		code, msg = apiExit(ce), ce.Body.Message
		if ce.RetryAfter > 0 && code == exitRetry {
			msg += fmt.Sprintf(" (retry after %s)", ce.RetryAfter)
		}
	case errors.As(err, &re):
		// --url is not the API's address, but where it redirects to.
		code = exitUsage
	case errors.Is(err, context.DeadlineExceeded):
		code = exitTimeout
	case errors.As(err, &te):
		if te.Retryable() {
			code = exitRetry
		}
	case errors.Is(err, client.ErrStreamEnded):
		code = exitRetry
	}
	if msg != "" && len(hints) > 0 {
		msg += "; " + strings.Join(hints, "; ")
	}
	if msg = strings.TrimRight(clean(msg), "\n"); msg != "" {
		// A line of the server's text cannot pass for a message of
		// ours: every line but the first is indented.
		fmt.Fprintf(c.errw, "salt-volumes: %s\n", strings.ReplaceAll(msg, "\n", "\n  "))
	}
	return code
}

// apiExit is the exit code of an error answer.
func apiExit(ce *client.Error) int {
	switch ce.Status {
	case 400:
		return exitUsage
	case 401, 403:
		return exitDenied
	case 404:
		return exitNotFound
	case 409:
		// busy: the volume changed under the request, nothing was
		// recorded; asking again is what the server says to do.
		if ce.Body.Code == saltvolumes.CodeBusy {
			return exitRetry
		}
		return exitRefused
	case 429:
		// With Retry-After a rate (creates per second, reviews, logins)
		// that waiting lifts; without, limits.volumes, which it does not.
		if ce.RetryAfter > 0 {
			return exitRetry
		}
		return exitRefused
	case 502:
		// unavailable: a follower could not reach the leader, or the
		// Kubernetes API server (or the salt-master) could not be asked
		// whether the caller may: the request was not carried out.
		if ce.Body.Code == saltvolumes.CodeUnavailable {
			return exitRetry
		}
	case 503:
		return exitRetry
	}
	return exitFailed
}
