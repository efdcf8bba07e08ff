// Package controlplane tests salt-volumes serve end to end: the real binary
// against a real salt-master, salt-minion and salt-api on loopback, real
// loop devices on the "node" (this machine).
package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/test/kubecluster"
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

// saltAndKube starts a Salt master and minion (modules synced) and a
// Kubernetes control plane with serve's RBAC, the minion a node of it; both
// stop with the test (the cluster's logs printed if it failed).
func saltAndKube(t *testing.T) (*saltstack.Stack, *kubecluster.Cluster) {
	t.Helper()
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	tools, err := kubecluster.Tools(s.Repo)
	require.NoError(t, err, "building the Kubernetes binaries (scripts/kube-tools.sh)")
	ctx := context.Background()
	k, err := kubecluster.Start(ctx, filepath.Join(s.Root, "kube"), tools, filepath.Join(s.Repo, "deploy", "kubernetes", "rbac.yaml"))
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(k.Logs(3000))
		}
		k.Stop()
	})
	require.NoError(t, k.AddNode(ctx, s.MinionID))
	return s, k
}
