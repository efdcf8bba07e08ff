package nodeexec

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/engine"
	"github.com/salt-volumes/salt-volumes/internal/failpoint"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reboot takes away what a reboot takes away: loop devices, partitions the
// kernel was told about, and /dev/disk links.
func reboot(t *testing.T, n *node, rawDisks ...loopdev.Device) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(n.dir, "sparse"))
	for _, e := range ents {
		devs, _ := loopdev.Find(filepath.Join(n.dir, "sparse", e.Name()))
		for _, d := range devs {
			_ = loopdev.RemovePartition(d.Name, 1)
			require.NoError(t, loopdev.Detach(context.Background(), d, 5*time.Second))
		}
	}
	for _, d := range rawDisks {
		require.NoError(t, loopdev.RemovePartition(d.Name, 1))
	}
	for _, u := range n.uuids {
		os.Remove("/dev/disk/by-uuid/" + u)
		os.Remove("/dev/disk/by-partuuid/" + u)
	}
}

func TestRestoreAfterReboot(t *testing.T) {
	n := newNode(t)
	disk := fakeDisk(t, 32<<20)
	specs := []map[string]any{
		sparseSpec("fs", n.newUUID(), "32Mi", nil),
		sparseSpec("blk", n.newUUID(), "32Mi", map[string]any{"mode": "Block"}),
		rawSpec("rawblk", n.newUUID(), disk.Path, map[string]any{"mode": "Block"}),
	}
	want := map[string]string{}
	for _, s := range specs {
		r := n.ok("prepare", s)
		want[r.str("uuid")] = r.str("persistentPath")
	}

	// An orphan (a sparse file no state claims) and a volume whose file
	// vanished: reported, never deleted or recreated.
	orphan := filepath.Join(n.dir, "sparse", uuid.NewString())
	require.NoError(t, os.WriteFile(orphan, []byte("x"), 0o600))
	lost := sparseSpec("lost", n.newUUID(), "32Mi", nil)
	lostFile := n.ok("prepare", lost).str("backingFile")
	reboot(t, n, disk)
	require.NoError(t, os.Remove(lostFile))
	// The lost volume's link survived the "reboot" and names a loop number
	// nobody holds now: restore removes it.
	stale := "/dev/disk/by-uuid/" + lost["uuid"].(string)
	require.NoError(t, os.MkdirAll("/dev/disk/by-uuid", 0o755))
	require.NoError(t, os.Symlink("../../loop4242", stale))

	assert.Equal(t, engine.StateDetached, n.ok("info", specs[0]).str("state"))
	assert.Equal(t, engine.StateMissing, n.ok("info", lost).str("state"))

	r := n.exec(nil, "", "restore")
	assert.Equal(t, 1, r.Code, "one volume could not be restored: %s", r.Stdout)
	assert.Equal(t, float64(3), r.Out["restored"])
	assert.Equal(t, float64(0), r.Out["intact"], "after a reboot every volume needed rebuilding")
	assert.Equal(t, float64(1), r.Out["failed"])
	for _, v := range r.Out["volumes"].([]any) {
		v := v.(map[string]any)
		if v["name"] == "lost" {
			assert.Equal(t, engine.StateMissing, v["state"])
			continue
		}
		assert.Equal(t, engine.StatePrepared, v["state"], v)
		assert.Equal(t, true, v["changed"])
		resolves(t, want[v["uuid"].(string)], v["devicePath"].(string))
	}
	orphans := r.Out["orphans"].([]any)
	require.Len(t, orphans, 1)
	assert.Equal(t, orphan, orphans[0].(map[string]any)["backingFile"])
	_, err := os.Stat(orphan)
	assert.NoError(t, err, "orphans are not deleted")
	_, err = os.Stat(lostFile)
	assert.True(t, os.IsNotExist(err), "a missing file is not recreated")
	_, err = os.Lstat(stale)
	assert.True(t, os.IsNotExist(err), "the stale link of the lost volume is gone")

	// The filesystems and GUIDs are what they were.
	assert.Equal(t, specs[0]["uuid"], blkid(t, want[specs[0]["uuid"].(string)])["UUID"])
	assert.Equal(t, specs[1]["uuid"], blkid(t, want[specs[1]["uuid"].(string)])["PART_ENTRY_UUID"])
	assert.Equal(t, specs[2]["uuid"], blkid(t, want[specs[2]["uuid"].(string)])["PART_ENTRY_UUID"])

	again := n.exec(nil, "", "restore")
	for _, v := range again.Out["volumes"].([]any) {
		assert.Equal(t, false, v.(map[string]any)["changed"], "restore is idempotent")
	}
	// A second run rebuilt nothing: the control plane's count of rebuilt
	// volumes (salt_volumes_restores_total) must not grow by it.
	assert.Equal(t, float64(0), again.Out["restored"], "a run that rebuilt nothing counts nothing restored")
	assert.Equal(t, float64(3), again.Out["intact"])
	assert.Equal(t, float64(1), again.Out["failed"], "the lost volume is still lost")
	// The node keeps the first run's counts with the second's: the control
	// plane may read the report only after both ran (the beacon opens a
	// master-key volume right after the boot's run), and the boot's
	// rebuilt volumes must still reach it.
	last := n.exec(nil, "", "last-restore")
	require.Equal(t, 0, last.Code, last.Stdout)
	rep := last.Out["restore"].(map[string]any)
	assert.Equal(t, again.Out["id"], rep["id"])
	earlier, _ := rep["earlier"].([]any)
	require.NotEmpty(t, earlier, "the first run's counts are kept: %s", last.Stdout)
	first := earlier[len(earlier)-1].(map[string]any)
	assert.Equal(t, r.Out["id"], first["id"])
	assert.Equal(t, float64(3), first["restored"], "the reboot's rebuilt volumes")
	for _, s := range specs {
		n.ok("unprepare", s, "--wipe")
	}
	n.ok("unprepare", lost)
}

// Kill the binary right after each step of prepare and unprepare; running
// the same command again must converge with nothing leaked.
func TestKilledAtEveryStepConverges(t *testing.T) {
	cases := []struct {
		name string
		spec func(n *node, disk loopdev.Device) map[string]any
		raw  bool
	}{
		{"sparse-ext4", func(n *node, _ loopdev.Device) map[string]any { return sparseSpec("c", n.newUUID(), "32Mi", nil) }, false},
		{"sparse-xfs", func(n *node, _ loopdev.Device) map[string]any {
			return sparseSpec("c", n.newUUID(), "300Mi", map[string]any{"fsType": "xfs"})
		}, false},
		{"sparse-block", func(n *node, _ loopdev.Device) map[string]any {
			return sparseSpec("c", n.newUUID(), "32Mi", map[string]any{"mode": "Block"})
		}, false},
		{"raw-fs", func(n *node, d loopdev.Device) map[string]any { return rawSpec("c", n.newUUID(), d.Path, nil) }, true},
		{"raw-block", func(n *node, d loopdev.Device) map[string]any {
			return rawSpec("c", n.newUUID(), d.Path, map[string]any{"mode": "Block"})
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t)
			var disk loopdev.Device
			if c.raw {
				disk = fakeDisk(t, 32<<20)
			}
			var unprepArgs []string
			if c.raw {
				unprepArgs = []string{"--wipe"}
			}
			// One clean run tells us the steps.
			probe := c.spec(n, disk)
			prepSteps := steps(n.ok("prepare", probe).Stderr)
			unprepSteps := steps(n.ok("unprepare", probe, unprepArgs...).Stderr)
			require.Contains(t, prepSteps, "recorded")
			require.Contains(t, unprepSteps, "forgotten")

			for _, step := range prepSteps {
				spec := c.spec(n, disk)
				killed := n.exec([]string{failpoint.CrashEnv + "=" + step}, mustJSON(t, spec), "prepare", "--spec", "-")
				require.Equal(t, -1, killed.Code, "prepare must be killed after %s", step)
				r := n.ok("prepare", spec)
				assert.Equal(t, "prepared", r.str("state"), "after a kill at %s", step)
				resolves(t, r.str("persistentPath"), r.str("devicePath"))
				if !c.raw {
					devs, err := loopdev.Find(r.str("backingFile"))
					require.NoError(t, err)
					assert.Len(t, devs, 1, "no leaked loop device after a kill at %s", step)
				}
				assert.Equal(t, false, n.ok("prepare", spec).Out["changed"], "converged after a kill at %s", step)
				n.ok("unprepare", spec, unprepArgs...)
			}
			for _, step := range unprepSteps {
				spec := c.spec(n, disk)
				r := n.ok("prepare", spec)
				killed := n.exec([]string{failpoint.CrashEnv + "=" + step}, mustJSON(t, spec), append([]string{"unprepare", "--spec", "-"}, unprepArgs...)...)
				require.Equal(t, -1, killed.Code, "unprepare must be killed after %s", step)
				n.ok("unprepare", spec, unprepArgs...)
				_, err := os.Lstat(r.str("persistentPath"))
				assert.True(t, os.IsNotExist(err), "link gone after a kill at %s", step)
				if !c.raw {
					_, err = os.Stat(r.str("backingFile"))
					assert.True(t, os.IsNotExist(err), "file gone after a kill at %s", step)
					bf, _ := loopdev.BackingFile(r.str("deviceName"))
					assert.NotEqual(t, r.str("backingFile"), bf)
				}
				assert.Equal(t, "absent", n.ok("info", spec).str("state"))
			}
			recs, _ := filepath.Glob(filepath.Join(n.dir, "volumes", "*.json"))
			assert.Empty(t, recs)
			staged, _ := filepath.Glob(filepath.Join(n.dir, "volumes", ".*"))
			assert.Empty(t, staged, "no staged or temporary record left")
			left, _ := os.ReadDir(filepath.Join(n.dir, "sparse"))
			assert.Empty(t, left, "no sparse file leaked")
		})
	}
}

// An operator's Ctrl-C, or Salt's timeout, stops a prepare stuck in mkfs:
// mkfs is stopped with it, the run fails with its JSON error, and the next
// run converges.
func TestTerminatedPrepareStopsMkfs(t *testing.T) {
	n := newNode(t)
	disk := fakeDisk(t, 32<<20)
	spec := rawSpec("term", n.newUUID(), disk.Path, nil)

	// An mkfs.ext4 that hangs, found first (a failpoints build only).
	bin := t.TempDir()
	pidFile := filepath.Join(bin, "mkfs.pid")
	script := "#!/bin/sh\necho $$ > " + pidFile + ".tmp && mv " + pidFile + ".tmp " + pidFile + "\nexec sleep 120\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "mkfs.ext4"), []byte(script), 0o755))

	cmd := exec.Command(binary, "--state-dir", n.dir, "prepare", "--spec", "-")
	cmd.Env = append(os.Environ(), failpoint.ToolDirEnv+"="+bin)
	cmd.Stdin = strings.NewReader(mustJSON(t, spec))
	var out bytes.Buffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "prepare never ran mkfs")
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "prepare must fail, not succeed")
		assert.Equal(t, 1, ee.ExitCode(), "a failure with its JSON error, not a death by the signal: %s", out.String())
		assert.Contains(t, out.String(), `"code":"mkfs"`)
	case <-time.After(20 * time.Second):
		t.Fatal("prepare did not stop within 20 s of SIGTERM")
	}
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "mkfs was stopped with prepare")

	r := n.ok("prepare", spec)
	assert.Equal(t, "prepared", r.str("state"))
	assert.Equal(t, spec["uuid"], blkid(t, disk.Path)["UUID"])
	n.ok("unprepare", spec, "--wipe")
}
