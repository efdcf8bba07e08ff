// Package controlplane tests salt-volumes serve end to end: the real binary
// against a real salt-master, salt-minion and salt-api on loopback, real
// loop devices on the "node" (this machine).
package controlplane

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sv-bin")
	if err == nil {
		err = testenv.Build(dir, "salt-volume-exec", "salt-volumes")
	}
	if err == nil {
		err = testenv.BuildAs(dir, "salt-volumes-e2e", "test/e2e")
	}
	if err == nil {
		err = testenv.BuildAs(dir, "salt-volumes-demo", "test/demo")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }

// plane is serve as the tests run it (test/serveproc).
type plane = serveproc.Plane

func newPlane(t *testing.T, s *saltstack.Stack) *plane {
	return serveproc.New(t, s, bin("salt-volumes"))
}

type watcher = serveproc.Watcher

var summary = serveproc.Summary

func phaseIs(phase string) func(saltvolumes.Event) bool {
	return func(ev saltvolumes.Event) bool {
		return ev.Type != "DELETED" && ev.Volume.Status.Phase.String() == phase
	}
}

func isDeleted(ev saltvolumes.Event) bool { return ev.Type == "DELETED" }
