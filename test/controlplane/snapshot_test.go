package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// A user takes a snapshot of a mounted volume through the control plane,
// changes the volume, makes a clone of the snapshot and finds the old
// content there, with both mounted at once; a volume with snapshots is not
// deleted until they are.
func TestSnapshotsThroughTheControlPlane(t *testing.T) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	p := newPlane(t, s)
	p.Start("")
	c := p.Client()
	ctx := context.Background()
	status := func(err error) int {
		t.Helper()
		var ce *client.Error
		require.ErrorAs(t, err, &ce)
		return ce.Status
	}
	mount := func(dev string) string {
		t.Helper()
		mp := t.TempDir()
		require.NoError(t, exec.Command("mount", dev, mp).Run(), "mount %s", dev)
		t.Cleanup(func() { _ = exec.Command("umount", mp).Run() })
		return mp
	}

	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			src, clone, snap := "orig-"+fs, "copy-"+fs, "before-"+fs
			_, errs, code := p.CLI("create", src, "--node", "node-1", "--size", "320Mi", "--fs", fs, "--wait", "--timeout", "2m")
			require.Equal(t, 0, code, errs)
			v := getJSON(t, p, src)
			uuids = append(uuids, v.Spec.UUID)
			mp := mount(v.Status.PersistentPath)
			require.NoError(t, os.WriteFile(filepath.Join(mp, "note"), []byte("before the snapshot"), 0o600))

			out, errs, code := p.CLI("snapshot", "create", src, snap, "--wait", "-o", "json")
			require.Equal(t, 0, code, errs)
			var got saltvolumes.Snapshot
			require.NoError(t, json.Unmarshal([]byte(out), &got), out)
			assert.Equal(t, "Ready", got.Phase)
			assert.True(t, got.Frozen, "the mounted filesystem was frozen for the copy")
			assert.Contains(t, []string{"reflink", "sparse-copy"}, got.Method)
			assert.Equal(t, int64(320<<20), got.Size)
			assert.Greater(t, got.Allocated, int64(0))
			assert.Less(t, got.Allocated, got.Size, "sparse: only the written extents")
			require.NotNil(t, got.TakenAt)
			assert.Equal(t, v.Spec.UUID, got.VolumeUUID)
			// Asking again answers the snapshot taken: no second job.
			again, err := c.TakeSnapshot(ctx, src, snap)
			require.NoError(t, err)
			assert.Equal(t, got.JobID, again.JobID)

			// The job cache: published as the control plane's account,
			// on the user's behalf, through the snapshot function.
			out, code = s.SaltRun("jobs.list_job", got.JobID, "--out=json")
			require.Equal(t, 0, code, out)
			var job struct {
				Function string         `json:"Function"`
				Metadata map[string]any `json:"Metadata"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &job), out)
			assert.Equal(t, "salt_volumes.apply_snapshot", job.Function)
			who, err := c.WhoAmI(ctx)
			require.NoError(t, err)
			assert.Equal(t, map[string]any{"salt-volumes": map[string]any{"requestedBy": map[string]any{"snapshot/" + snap: who.User}}}, job.Metadata)

			// What the node's beacon reports: its snapshots and their space.
			out, code = s.SaltCall("--out=json", "salt_volumes.status")
			require.Equal(t, 0, code, out)
			var st struct {
				Local struct {
					Capacity saltvolumes.Capacity `json:"capacity"`
				} `json:"local"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &st), out)
			assert.Equal(t, 1, st.Local.Capacity.Snapshots)
			assert.Equal(t, got.Allocated, st.Local.Capacity.SnapshotBytes)

			require.NoError(t, os.WriteFile(filepath.Join(mp, "note"), []byte("after the snapshot"), 0o600))
			out, errs, code = p.CLI("create", clone, "--from", "snapshot/"+snap, "--wait", "--timeout", "2m")
			require.Equal(t, 0, code, out+errs)
			cv := getJSON(t, p, clone)
			uuids = append(uuids, cv.Spec.UUID)
			// The copy (a sparse copy: the state dir is the host's ext4)
			// told its bytes through Salt's bus; the job's log keeps the
			// step once, however many reports it sent.
			code, body, err := p.Fetch("/api/v1/volumes/" + clone + "/jobs")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code, "%s", body)
			var jobs struct{ Items []saltvolumes.Job }
			require.NoError(t, json.Unmarshal(body, &jobs), "%s", body)
			require.NotEmpty(t, jobs.Items)
			var names []string
			for _, step := range jobs.Items[0].Steps {
				names = append(names, step.Name)
			}
			assert.Contains(t, names, "copying", "the clone's copy reported no progress")
			var copying int
			for _, n := range names {
				if n == "copying" {
					copying++
				}
			}
			assert.Equal(t, 1, copying, "a step logged once: %v", names)
			t.Logf("create --from snapshot/%s --wait: %s", snap, errs)
			assert.Equal(t, "node-1", cv.Spec.Node)
			assert.Equal(t, fs, cv.Spec.FSType)
			assert.NotEqual(t, v.Spec.UUID, cv.Spec.UUID)
			// Both mounted at once (xfs refuses a second mount of one
			// uuid): the clone holds the content as of the snapshot.
			cmp := mount(cv.Status.PersistentPath)
			b, err := os.ReadFile(filepath.Join(cmp, "note"))
			require.NoError(t, err)
			assert.Equal(t, "before the snapshot", string(b))
			b, err = os.ReadFile(filepath.Join(mp, "note"))
			require.NoError(t, err)
			assert.Equal(t, "after the snapshot", string(b))
			id, err := exec.Command("blkid", "-p", "-o", "value", "-s", "UUID", cv.Status.DevicePath).Output()
			require.NoError(t, err)
			assert.Equal(t, cv.Spec.UUID, strings.TrimSpace(string(id)), "the clone's filesystem carries its own uuid")

			// A volume with snapshots is deleted only once they are.
			_, err = c.Delete(ctx, src, false)
			require.Error(t, err)
			assert.Equal(t, http.StatusConflict, status(err))
			assert.Contains(t, err.Error(), "has snapshots ("+snap+")")
			assert.Equal(t, "Available", getJSON(t, p, src).Status.Phase.String(), "nothing was changed")
			assert.Equal(t, 1.0, p.Metric(`salt_volumes_node_snapshots{node="node-1"}`))

			_, errs, code = p.CLI("snapshot", "rm", snap, "--wait")
			require.Equal(t, 0, code, errs)
			_, err = c.Snapshot(ctx, snap)
			assert.Equal(t, http.StatusNotFound, status(err))
			out, code = s.SaltCall("salt_volumes.snapshots", "--out=json")
			require.Equal(t, 0, code, out)
			assert.NotContains(t, out, snap, "gone from the node too")
			_, err = c.Delete(ctx, src, false)
			require.NoError(t, err, "no snapshots left")
		})
	}

	t.Run("a clone of a volume as it is now: its snapshot goes once the clone is Available", func(t *testing.T) {
		_, errs, code := p.CLI("create", "live", "--node", "node-1", "--size", "32Mi", "--wait", "--timeout", "2m")
		require.Equal(t, 0, code, errs)
		v := getJSON(t, p, "live")
		uuids = append(uuids, v.Spec.UUID)
		mp := mount(v.Status.PersistentPath)
		require.NoError(t, os.WriteFile(filepath.Join(mp, "note"), []byte("live data"), 0o600))
		started := time.Now()
		out, errs, code := p.CLI("create", "live-copy", "--from", "volume/live", "--wait", "--timeout", "2m")
		require.Equal(t, 0, code, out+errs)
		t.Logf("create --from volume/live --wait: %s", time.Since(started).Round(100*time.Millisecond))
		cv := getJSON(t, p, "live-copy")
		uuids = append(uuids, cv.Spec.UUID)
		assert.Regexp(t, `^clone-live-copy-[0-9a-f]{8}$`, cv.Spec.Source.Snapshot, "a snapshot of its own, taken now")
		b, err := os.ReadFile(filepath.Join(mount(cv.Status.PersistentPath), "note"))
		require.NoError(t, err)
		assert.Equal(t, "live data", string(b))
		started = time.Now()
		eventually(t, time.Minute, "the clone's snapshot deleted", func() (bool, string) {
			items, err := c.Snapshots(ctx, "live")
			return err == nil && len(items) == 0, fmt.Sprint(items, err)
		})
		t.Logf("the clone's snapshot deleted %s after the clone was Available", time.Since(started).Round(100*time.Millisecond))
		// Again under the same name: refused before any snapshot is taken
		// (one would be left with no clone to make of it).
		_, errs, code = p.CLI("create", "live-copy", "--from", "volume/live")
		assert.NotEqual(t, 0, code)
		assert.Contains(t, errs, "volume live-copy exists")
		items, err := c.Snapshots(ctx, "live")
		require.NoError(t, err)
		assert.Empty(t, items, "no snapshot taken for a clone that cannot be made")
	})

	t.Run("refused with the field and the fix, changing nothing", func(t *testing.T) {
		_, err := c.TakeSnapshot(ctx, "no-such-volume", "x")
		assert.Equal(t, http.StatusNotFound, status(err))
		_, errs, code := p.CLI("create", "small", "--node", "node-1", "--size", "16Mi", "--wait", "--timeout", "2m")
		require.Equal(t, 0, code, errs)
		uuids = append(uuids, getJSON(t, p, "small").Spec.UUID)
		_, err = c.TakeSnapshot(ctx, "small", "Not_A_Name")
		assert.Equal(t, http.StatusBadRequest, status(err))
		assert.Contains(t, err.Error(), "name")
		_, err = c.TakeSnapshot(ctx, "small", "s1")
		require.NoError(t, err)
		_, err = c.TakeSnapshot(ctx, "copy-ext4", "s1")
		assert.Equal(t, http.StatusConflict, status(err))
		assert.Contains(t, err.Error(), "snapshot s1 is volume small's")
		_, errs, code = p.CLI("create", "bad-clone", "--from", "snapshot/none")
		assert.Equal(t, 4, code, errs)
		items, err := c.Snapshots(ctx, "")
		require.NoError(t, err)
		require.Len(t, items, 1)
		assert.Equal(t, "s1", items[0].Name)
	})

	t.Run("restored in place, refused while mounted and to a viewer", func(t *testing.T) {
		_, errs, code := p.CLI("create", "back", "--node", "node-1", "--size", "32Mi", "--wait", "--timeout", "2m")
		require.Equal(t, 0, code, errs)
		v := getJSON(t, p, "back")
		uuids = append(uuids, v.Spec.UUID)
		mp := mount(v.Status.PersistentPath)
		note := filepath.Join(mp, "note")
		require.NoError(t, os.WriteFile(note, []byte("before"), 0o600))
		_, errs, code = p.CLI("snapshot", "create", "back", "back-1", "--wait")
		require.Equal(t, 0, code, errs)
		require.NoError(t, os.WriteFile(note, []byte("after"), 0o600))

		out, errs, code := p.CLI("token", "create", "restore-viewer", "--role", "viewer", "--expires", "1d")
		require.Equal(t, 0, code, errs)
		_, errs, code = p.CLIAs(strings.TrimSpace(out), "snapshot", "restore", "back-1")
		assert.Equal(t, 6, code, "exit 6: not allowed")
		assert.Contains(t, errs, "it needs role operator")

		// Mounted: the node refuses, naming the mount; nothing changed.
		started := time.Now()
		_, errs, code = p.CLI("snapshot", "restore", "back-1", "--wait", "--timeout", "2m")
		assert.Equal(t, 1, code, errs)
		assert.Contains(t, errs, "is in use")
		assert.Contains(t, errs, "mounted on "+mp)
		b, err := os.ReadFile(note)
		require.NoError(t, err)
		assert.Equal(t, "after", string(b))
		assert.Equal(t, "Available", getJSON(t, p, "back").Status.Phase.String())
		t.Logf("restore refused while mounted: %s", time.Since(started).Round(100*time.Millisecond))

		require.NoError(t, exec.Command("umount", mp).Run())
		_ = exec.Command("udevadm", "settle").Run()
		started = time.Now()
		for try := 1; ; try++ {
			out, errs, code = p.CLI("snapshot", "restore", "back-1", "--wait", "--timeout", "2m", "-o", "json")
			// An LVM scan (udev's pvscan after the umount, a node's
			// report) opens every block device for a moment: the node
			// refuses the restore then, naming it, as it should.
			if code == 0 || try == 5 || !strings.Contains(errs, "(lvm)") {
				break
			}
			t.Logf("try %d: %s", try, strings.TrimSpace(errs))
			time.Sleep(time.Second)
		}
		require.Equal(t, 0, code, out+errs)
		t.Logf("snapshot restore --wait: %s", time.Since(started).Round(100*time.Millisecond))
		var got saltvolumes.Snapshot
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		require.NotNil(t, got.Restore)
		assert.Equal(t, "Restored", got.Restore.Phase)
		who, err := c.WhoAmI(ctx)
		require.NoError(t, err)
		assert.Equal(t, who.User, got.Restore.RequestedBy)
		after := getJSON(t, p, "back")
		assert.Equal(t, v.Spec.UUID, after.Spec.UUID)
		assert.Equal(t, v.Status.PersistentPath, after.Status.PersistentPath)
		assert.Equal(t, "Available", after.Status.Phase.String())
		b, err = os.ReadFile(filepath.Join(mount(after.Status.PersistentPath), "note"))
		require.NoError(t, err)
		assert.Equal(t, "before", string(b))
	})

	t.Run("every snapshot request is audited", func(t *testing.T) {
		entries, err := c.Audit(ctx, "", "", "", "")
		require.NoError(t, err)
		var routes []string
		for _, e := range entries {
			if strings.Contains(e.Route, "snapshots") {
				routes = append(routes, e.Method+" "+e.Route+" "+e.Decision)
			}
		}
		assert.Contains(t, routes, "POST /api/v1/volumes/orig-ext4/snapshots allowed")
		assert.Contains(t, routes, "DELETE /api/v1/snapshots/before-ext4 allowed")
		assert.Contains(t, routes, "POST /api/v1/volumes/small/snapshots failed")
		assert.Contains(t, routes, "POST /api/v1/snapshots/back-1/restore allowed")
		assert.Contains(t, routes, "POST /api/v1/snapshots/back-1/restore refused")
	})
}
