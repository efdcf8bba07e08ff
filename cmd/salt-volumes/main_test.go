package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
)

// One mapping from errors to exit codes and messages, for every command.
func TestExitCodes(t *testing.T) {
	apiErr := func(status int, msg string) error {
		return &client.Error{Status: status, Body: saltvolumes.Error{Message: msg}}
	}
	for _, tc := range []struct {
		name string
		err  error
		code int
		msg  string
	}{
		{"ok", nil, exitOK, ""},
		{"invalid input", apiErr(400, "name: not a DNS-1123 label"), exitUsage, "name: not a DNS-1123 label"},
		{"not found", apiErr(404, `volume "x" not found`), exitNotFound, `volume "x" not found`},
		{"conflict", apiErr(409, "cannot delete"), exitRefused, "cannot delete"},
		{"limit", apiErr(429, "slow down"), exitRefused, "slow down"},
		{"server error", apiErr(500, "boom"), exitFailed, "boom"},
		{"timeout", fmt.Errorf("watching: %w", context.DeadlineExceeded), exitTimeout, "watching: context deadline exceeded"},
		{"usage, already printed", errUsage, exitUsage, ""},
		{"our own", failf(exitNotFound, "volume %q not found", "v"), exitNotFound, `volume "v" not found`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errw bytes.Buffer
			c := &cli{errw: &errw}
			assert.Equal(t, tc.code, c.exit(tc.err))
			if tc.msg == "" {
				assert.Empty(t, errw.String())
			} else {
				assert.Contains(t, errw.String(), "salt-volumes: "+tc.msg)
			}
		})
	}
}

func TestRunRefusesBadUsage(t *testing.T) {
	var out, errw bytes.Buffer
	assert.Equal(t, exitUsage, run([]string{"frobnicate"}, &out, &errw))
	assert.Contains(t, errw.String(), `unknown command "frobnicate"`)
	errw.Reset()
	assert.Equal(t, exitUsage, run([]string{"ls", "extra"}, &out, &errw))
	assert.Contains(t, errw.String(), "ls: takes no arguments")
	errw.Reset()
	assert.Equal(t, exitUsage, run([]string{"get", "--url", "", "x"}, &out, &errw))
	assert.Contains(t, errw.String(), "no server")
	assert.Equal(t, exitOK, run([]string{"version"}, &out, &errw))
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
