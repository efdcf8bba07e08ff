package nodeexec

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/engine"
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
				killed := n.exec([]string{engine.CrashEnv + "=" + step}, mustJSON(t, spec), "prepare", "--spec", "-")
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
				killed := n.exec([]string{engine.CrashEnv + "=" + step}, mustJSON(t, spec), append([]string{"unprepare", "--spec", "-"}, unprepArgs...)...)
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
			left, _ := os.ReadDir(filepath.Join(n.dir, "sparse"))
			assert.Empty(t, left, "no sparse file leaked")
		})
	}
}
