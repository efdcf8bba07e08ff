package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
)

// TestMain keeps the tests from the environment they run in: no server
// or token of the developer's shell (make demo prints them), and no
// session of theirs.
func TestMain(m *testing.M) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "SALT_VOLUMES_") {
			os.Unsetenv(k)
		}
	}
	dir, err := os.MkdirTemp("", "salt-volumes-cli-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_CONFIG_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// One mapping from errors to exit codes and messages, for every command.
func TestExitCodes(t *testing.T) {
	apiErr := func(status int, code, msg string, retry time.Duration) error {
		return &client.Error{Status: status, Body: saltvolumes.Error{Code: code, Message: msg}, RetryAfter: retry}
	}
	for _, tc := range []struct {
		name string
		err  error
		code int
		msg  string
	}{
		{"ok", nil, exitOK, ""},
		{"invalid input", apiErr(400, "invalid", "name: not a DNS-1123 label", 0), exitUsage, "name: not a DNS-1123 label"},
		{"not allowed", apiErr(403, "forbidden", "needs role operator", 0), exitDenied, "needs role operator"},
		{"not found", apiErr(404, "not_found", `volume "x" not found`, 0), exitNotFound, `volume "x" not found`},
		{"conflict", apiErr(409, "delete_forbidden", "cannot delete", 0), exitRefused, "cannot delete"},
		{"busy", apiErr(409, "busy", "changed meanwhile", time.Second), exitRetry, "changed meanwhile (retry after 1s)"},
		{"limits.volumes", apiErr(429, "limit", "the control plane holds 3 volumes", 0), exitRefused, "the control plane holds 3 volumes"},
		{"a rate, with Retry-After", apiErr(429, "limit", "slow down", time.Second), exitRetry, "slow down (retry after 1s)"},
		{"unavailable", apiErr(503, "unavailable", "no leader", 5*time.Second), exitRetry, "no leader (retry after 5s)"},
		{"server error", apiErr(500, "internal", "boom", 0), exitFailed, "boom"},
		{"no answer", &client.TransportError{URL: "http://x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}, exitRetry, "salt-volumes API at http://x: dial tcp: connect: connection refused"},
		{"no answer a retry gets", &client.TransportError{URL: "http://x", Err: errors.New("http: server gave HTTP response to HTTPS client")}, exitFailed, "salt-volumes API at http://x: http: server gave HTTP response to HTTPS client"},
		{"the leader out of reach", apiErr(502, "unavailable", "this replica follows b, which could not be reached", 0), exitRetry, "this replica follows b, which could not be reached"},
		{"a proxy's 502", apiErr(502, "http", "HTTP 502: bad gateway", 0), exitFailed, "HTTP 502: bad gateway"},
		{"a redirect", &client.RedirectError{URL: "http://x", Status: 301, Location: "https://x/api/v1/volumes"}, exitUsage, "salt-volumes API at http://x answered HTTP 301, a redirect to https://x/api/v1/volumes: salt-volumes does not follow redirects (the token or password would go along): set --url to the final address"},
		{"a server's lines are not ours", apiErr(409, "exists", "name: volume \"x\" already exists\nsalt-volumes: (but all your volumes were wiped)\r\n", 0), exitRefused, "name: volume \"x\" already exists\n  salt-volumes: (but all your volumes were wiped)"},
		{"with what to do", hint(apiErr(503, "unavailable", "no leader", 0), "do this"), exitRetry, "no leader; do this"},
		{"a watch the server ended", fmt.Errorf("following: %w", client.ErrStreamEnded), exitRetry, "following: watch stream closed by the server"},
		{"timeout", fmt.Errorf("watching: %w", context.DeadlineExceeded), exitTimeout, "watching: context deadline exceeded"},
		{"usage, already printed", errUsage, exitUsage, ""},
		{"our own", failf(exitNotFound, "volume %q not found", "v"), exitNotFound, `volume "v" not found`},
		{"control characters of the server's", apiErr(500, "internal", "bad\x1b[2J\rnews\u202e", 0), exitFailed, "bad[2Jnews"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errw bytes.Buffer
			c := &cli{errw: &errw}
			assert.Equal(t, tc.code, c.exit(tc.err))
			if tc.msg == "" {
				assert.Empty(t, errw.String())
			} else {
				assert.Equal(t, "salt-volumes: "+tc.msg+"\n", errw.String())
			}
		})
	}
	t.Run("interrupted", func(t *testing.T) {
		c := &cli{errw: &bytes.Buffer{}}
		c.signalled.Store(2)
		assert.Equal(t, 130, c.exit(context.Canceled))
	})
}

func TestRunRefusesBadUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"a typo", []string{"lss"}, exitUsage, "did you mean ls?"},
		{"extra argument", []string{"ls", "extra"}, exitUsage, "ls: takes no arguments"},
		{"unknown flag", []string{"ls", "--frob"}, exitUsage, "ls: unknown flag: --frob"},
		{"no server", []string{"get", "--url", "", "x"}, exitUsage, "no server"},
		{"bare", nil, exitUsage, ""},
		{"version", []string{"version"}, exitOK, ""},
		{"an output it does not print", []string{"audit", "-o", "name"}, exitUsage, "audit: -o name: salt-volumes audit prints table, wide, json or yaml only"},
		{"no objects at all", []string{"logout", "-o", "json"}, exitUsage, "salt-volumes logout prints no objects"},
		{"no such output", []string{"ls", "-o", "xml"}, exitUsage, "-o xml: use table, wide, json, yaml or name"},
		{"another kind's name", []string{"get", "--url", "http://127.0.0.1:1", "--token", "t", "snapshot/s1"}, exitUsage, `"snapshot/s1" is not a volume`},
		{"token both ways", []string{"ls", "--token", "a", "--token-file", "/dev/null"}, exitUsage, "give --token or --token-file, not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errw bytes.Buffer
			assert.Equal(t, tc.code, run(tc.args, &out, &errw), errw.String())
			assert.Contains(t, errw.String(), tc.msg)
		})
	}
}

// A clone of a volume as it is now gets a snapshot of its own each time:
// never an earlier try's (stale) one, never another long name's.
func TestCloneHelperNames(t *testing.T) {
	long := strings.Repeat("a", 60)
	a, b := cloneHelperName(long), cloneHelperName(long)
	if a == b {
		t.Fatalf("two clones of %s share the helper snapshot %s", long, a)
	}
	for _, n := range []string{a, cloneHelperName("db-copy"), cloneHelperName(strings.Repeat("x", 47) + "-y")} {
		if len(n) > 63 || !regexp.MustCompile(`^clone-[a-z0-9][a-z0-9.-]*-[0-9a-f]{8}$`).MatchString(n) || strings.Contains(n, "--") {
			t.Errorf("helper snapshot name %q: not a snapshot name of at most 63", n)
		}
	}
}
