package nodeexec

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// The binary we ship finds its root tools on a pinned PATH and has no
// test hooks: an mkfs.ext4 planted first on the inherited PATH (or named
// by the test builds' tool directory) is never run, and the crash variable
// does not stop it. The same environment stops the failpoints build, so
// the test knows its bait works.
func TestReleaseBinaryIgnoresPlantedToolsAndHooks(t *testing.T) {
	release, err := testenv.ReleaseBuild(t.TempDir(), "salt-volume-exec", "cmd/salt-volume-exec")
	require.NoError(t, err)

	bait := t.TempDir()
	marker := filepath.Join(bait, "ran")
	script := "#!/bin/sh\ntouch " + marker + "\nexit 0\n"
	require.NoError(t, os.WriteFile(filepath.Join(bait, "mkfs.ext4"), []byte(script), 0o755))
	env := []string{
		"PATH=" + bait + ":" + os.Getenv("PATH"),
		failpoint.ToolDirEnv + "=" + bait,
		failpoint.CrashEnv + "=recorded",
	}

	n := newNode(t)
	n.bin = release
	disk := fakeDisk(t, 32<<20)
	spec := rawSpec("pinned", n.newUUID(), disk.Path, nil)
	r := n.exec(env, mustJSON(t, spec), "prepare", "--spec", "-")
	require.Equal(t, 0, r.Code, "the release build must prepare normally: %s\n%s", r.Stdout, r.Stderr)
	assert.Equal(t, "prepared", r.str("state"))
	assert.NoFileExists(t, marker, "the planted mkfs.ext4 ran")
	assert.Equal(t, spec["uuid"], blkid(t, disk.Path)["UUID"], "the real mkfs.ext4 made the filesystem")
	n.ok("unprepare", spec, "--wipe")

	// The test build honours both hooks.
	n.bin = ""
	spec = rawSpec("hooked", n.newUUID(), disk.Path, nil)
	r = n.exec(env[2:], mustJSON(t, spec), "prepare", "--spec", "-")
	assert.Equal(t, -1, r.Code, "the failpoints build was not killed after recorded: %s", r.Stdout)
	r = n.exec(env[1:2], mustJSON(t, spec), "prepare", "--spec", "-")
	assert.FileExists(t, marker, "the failpoints build did not take the tool directory: %s", r.Stdout)
}
