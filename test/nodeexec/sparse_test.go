package nodeexec

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSparseVolumesEveryModeAndFilesystem(t *testing.T) {
	cases := []struct {
		name  string
		size  string
		bytes int64
		extra map[string]any
	}{
		{"ext4", "64Mi", 64 << 20, map[string]any{"mkfsOptions": []string{"-m", "0"}}},
		{"xfs", "300Mi", 300 << 20, map[string]any{"fsType": "xfs"}},
		{"block", "64Mi", 62 << 20, map[string]any{"mode": "Block"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t)
			u := n.newUUID()
			spec := sparseSpec("vol-"+c.name, u, c.size, c.extra)

			r := n.ok("prepare", spec)
			assert.Equal(t, true, r.Out["changed"])
			assert.Equal(t, "prepared", r.str("state"))
			assert.Equal(t, "sparseLoopDevice", r.str("type"))
			assert.Equal(t, float64(c.bytes), r.Out["size"], "size is the volume device's size")
			file := filepath.Join(n.dir, "sparse", u)
			assert.Equal(t, file, r.str("backingFile"))
			st, err := os.Stat(file)
			require.NoError(t, err)
			sizeGiven, _ := map[string]int64{"64Mi": 64 << 20, "300Mi": 300 << 20}[c.size]
			assert.Equal(t, sizeGiven, st.Size(), "the sparse file has the exact size")
			assert.Less(t, st.Sys().(*syscall.Stat_t).Blocks*512, sizeGiven/2, "the file is sparse")

			dev := r.str("devicePath")
			resolves(t, r.str("persistentPath"), dev)
			probe := blkid(t, dev)
			if c.name == "block" {
				assert.Equal(t, "/dev/disk/by-partuuid/"+u, r.str("persistentPath"))
				assert.Regexp(t, `^/dev/loop\d+p1$`, dev)
				assert.Equal(t, u, probe["PART_ENTRY_UUID"])
				assert.Equal(t, "1", probe["PART_ENTRY_NUMBER"])
				assert.Equal(t, "2048", probe["PART_ENTRY_OFFSET"], "aligned to 1 MiB")
				parent := dev[:len(dev)-2]
				out, err := exec.Command("sgdisk", "-v", parent).CombinedOutput()
				require.NoError(t, err)
				assert.Contains(t, string(out), "No problems found")
			} else {
				assert.Equal(t, "/dev/disk/by-uuid/"+u, r.str("persistentPath"))
				assert.Regexp(t, `^/dev/loop\d+$`, dev)
				assert.Equal(t, u, probe["UUID"])
				assert.Equal(t, c.name, probe["TYPE"])
			}

			again := n.ok("prepare", spec)
			assert.Equal(t, false, again.Out["changed"], "a second prepare changes nothing")
			assert.Equal(t, dev, again.str("devicePath"))
			devs, err := loopdev.Find(file)
			require.NoError(t, err)
			assert.Len(t, devs, 1, "exactly one loop device backs the file")

			info := n.ok("info", spec)
			assert.Equal(t, "prepared", info.str("state"))
			assert.Equal(t, false, info.Out["inUse"])
			list := n.exec(nil, "", "list")
			require.Equal(t, 0, list.Code)
			vols := list.Out["volumes"].([]any)
			require.Len(t, vols, 1)
			assert.Equal(t, u, vols[0].(map[string]any)["uuid"])

			if c.name != "block" {
				// A volume in use is not deleted, and nothing about it changes.
				mp := mount(t, r.str("persistentPath"))
				require.NoError(t, os.WriteFile(filepath.Join(mp, "hello"), []byte("data"), 0o644))
				info = n.ok("info", spec)
				assert.Equal(t, true, info.Out["inUse"])
				assert.Contains(t, info.Out["mountpoints"], mp)
				refused := n.do("unprepare", spec)
				assert.Equal(t, 3, refused.Code)
				assert.Equal(t, "in_use", refused.errCode())
				assert.Contains(t, refused.errMsg(), mp)
				resolves(t, r.str("persistentPath"), dev)
				_, err = os.Stat(file)
				require.NoError(t, err)
				umount(t, mp)
			}

			gone := n.ok("unprepare", spec)
			assert.Equal(t, true, gone.Out["changed"])
			assert.Equal(t, "absent", gone.str("state"))
			_, err = os.Stat(file)
			assert.True(t, os.IsNotExist(err), "the sparse file is removed")
			_, err = os.Lstat(r.str("persistentPath"))
			assert.True(t, os.IsNotExist(err), "the link is removed")
			bf, _ := loopdev.BackingFile(r.str("deviceName"))
			assert.NotEqual(t, file, bf, "the loop device no longer backs the file")
			assert.Equal(t, false, n.ok("unprepare", spec).Out["changed"], "a second unprepare changes nothing")
			assert.Equal(t, "absent", n.ok("info", spec).str("state"))
		})
	}
}

func TestConcurrentPreparesOfOneVolumeShareOneDevice(t *testing.T) {
	n := newNode(t)
	spec := sparseSpec("same", n.newUUID(), "32Mi", nil)
	var wg sync.WaitGroup
	results := make([]run, 4)
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i] = n.do("prepare", spec)
		}(i)
	}
	wg.Wait()
	changed := 0
	for _, r := range results {
		require.Equal(t, 0, r.Code, r.Stdout)
		assert.Equal(t, results[0].str("devicePath"), r.str("devicePath"))
		if r.Out["changed"] == true {
			changed++
		}
	}
	assert.Equal(t, 1, changed, "exactly one run did the work")
	devs, err := loopdev.Find(results[0].str("backingFile"))
	require.NoError(t, err)
	assert.Len(t, devs, 1)
}

func TestSpecConflictsAreRefused(t *testing.T) {
	n := newNode(t)
	u := n.newUUID()
	n.ok("prepare", sparseSpec("a", u, "32Mi", nil))
	file := filepath.Join(n.dir, "sparse", u)
	before := sum(t, file)

	r := n.do("prepare", sparseSpec("a", u, "32Mi", map[string]any{"mode": "Block"}))
	assert.Equal(t, 3, r.Code)
	assert.Equal(t, "conflict", r.errCode())
	assert.Contains(t, r.errMsg(), "mode")

	r = n.do("prepare", sparseSpec("a", u, "16Mi", nil))
	assert.Equal(t, 3, r.Code)
	assert.Contains(t, r.errMsg(), "shrinking is refused")

	other := n.newUUID()
	r = n.do("prepare", sparseSpec("a", other, "32Mi", nil))
	assert.Equal(t, 3, r.Code)
	assert.Equal(t, "name_conflict", r.errCode())
	_, err := os.Stat(filepath.Join(n.dir, "sparse", other))
	assert.True(t, os.IsNotExist(err), "a refused prepare creates no file")
	assert.Equal(t, before, sum(t, file), "the existing volume is untouched")
}

func TestInvalidInputChangesNothing(t *testing.T) {
	n := newNode(t)
	u := n.newUUID()
	cases := []struct {
		stdin, field string
	}{
		{`{"name":"a","uuid":"` + u + `","sparseLoopDevice":{"size":"0"}}`, "sparseLoopDevice.size"},
		{`{"name":"a","uuid":"` + u + `","sparseLoopDevice":{"size":"-1Gi"}}`, "sparseLoopDevice.size"},
		{`{"name":"a","uuid":"` + u + `","sparseLoopDevice":{"size":"garbage"}}`, "sparseLoopDevice.size"},
		{`{"name":"a","uuid":"` + u + `","sparseLoopDevice":{"size":"1Ei"}}`, "sparseLoopDevice.size"},
		{`{"name":"a","uuid":"` + u + `","fsType":"xfs","sparseLoopDevice":{"size":"100Mi"}}`, "sparseLoopDevice.size"},
		{`{"name":"a","uuid":"` + u + `","fsType":"zfs","sparseLoopDevice":{"size":"1Gi"}}`, "fsType"},
		{`{"name":"A","uuid":"` + u + `","sparseLoopDevice":{"size":"1Gi"}}`, "name"},
		{`{"name":"a","uuid":"nope","sparseLoopDevice":{"size":"1Gi"}}`, "uuid"},
		{`{"name":"a","uuid":"` + u + `"}`, "sparseLoopDevice"},
		{`{"name":"a","uuid":"` + u + `","sparseLoopDevice":{"size":"1Gi"},"rawBlockDevice":{"devicePath":"/dev/sdz"}}`, "sparseLoopDevice"},
		{`{"name":"a","uuid":"` + u + `","rawBlockDevice":{"devicePath":"dev/sdb"}}`, "rawBlockDevice.devicePath"},
		{`{"name":"a","uuid":"` + u + `","rawBlockDevice":{"devicePath":"/dev/sv-test-does-not-exist"}}`, "rawBlockDevice.devicePath"},
		{`not json`, "spec"},
	}
	for _, c := range cases {
		r := n.exec(nil, c.stdin, "prepare", "--spec", "-")
		assert.Equal(t, 2, r.Code, c.stdin)
		assert.Contains(t, r.errMsg(), c.field, c.stdin)
	}
	_, err := os.Stat(n.dir)
	assert.True(t, os.IsNotExist(err), "invalid input never even creates the state dir")

	r := n.exec(nil, "", "frobnicate")
	assert.Equal(t, 2, r.Code)
	assert.Equal(t, "usage", r.errCode())
	r = n.exec(nil, "", "prepare")
	assert.Equal(t, 2, r.Code)
	assert.Contains(t, r.errMsg(), "--spec")
}

func TestOvercommitWarns(t *testing.T) {
	n := newNode(t)
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(filepath.Dir(n.dir), &st))
	free := int64(st.Bavail) * st.Bsize
	total := int64(st.Blocks) * st.Bsize
	if total-free < 1<<30 {
		t.Skip("the test filesystem is nearly empty; cannot pick a size between free and total")
	}
	size := (free + (total-free)/2) / (1 << 20) * (1 << 20)
	spec := sparseSpec("big", n.newUUID(), strconv.FormatInt(size, 10), nil)
	r := n.ok("prepare", spec)
	require.NotEmpty(t, r.Out["warnings"])
	assert.Contains(t, r.Out["warnings"].([]any)[0], "more than the free space")
	n.ok("unprepare", spec)
}

// The node refuses a sparse volume that would commit more than its
// overcommit ratio allows, changes nothing doing so, and never refuses a
// rerun of a volume it already admitted.
func TestOvercommitRatioRefuses(t *testing.T) {
	n := newNode(t)
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(filepath.Dir(n.dir), &st))
	total := int64(st.Blocks) * st.Bsize
	ratio := strconv.FormatFloat(float64(100<<20)/float64(total), 'g', -1, 64) // a 100 MiB limit
	env := []string{"SALT_VOLUMES_OVERCOMMIT_RATIO=" + ratio}
	prep := func(spec map[string]any) run {
		b, _ := json.Marshal(spec)
		return n.exec(env, string(b), "prepare", "--spec", "-")
	}
	first := sparseSpec("first", n.newUUID(), "64Mi", nil)
	r := prep(first)
	require.Equal(t, 0, r.Code, r.Stdout)

	second := sparseSpec("second", n.newUUID(), "64Mi", nil)
	r = prep(second)
	assert.Equal(t, 3, r.Code, "refused to protect the node: %s", r.Stdout)
	assert.Equal(t, "overcommit", r.errCode())
	assert.Contains(t, r.errMsg(), "sparseLoopDevice.size")
	assert.Contains(t, r.errMsg(), "salt_volumes:overcommit_ratio")
	assert.NoFileExists(t, filepath.Join(n.dir, "sparse", second["uuid"].(string)))
	assert.NoFileExists(t, filepath.Join(n.dir, "volumes", second["uuid"].(string)+".json"))

	r = prep(first)
	assert.Equal(t, 0, r.Code, "a rerun is not a new commitment: %s", r.Stdout)

	r = n.exec(env, "", "list")
	require.Equal(t, 0, r.Code)
	c := r.Out["capacity"].(map[string]any)
	assert.Equal(t, float64(64<<20), c["committed"])
	assert.Equal(t, float64(total), c["size"])

	r = n.exec([]string{"SALT_VOLUMES_OVERCOMMIT_RATIO=-1"}, "", "list")
	assert.Equal(t, 2, r.Code)
	assert.Contains(t, r.errMsg(), "--overcommit-ratio")
	n.ok("unprepare", first)
}

// Where udev runs, closing a disk that was opened for writing (a loop
// device being configured, a table being written) has udev re-read its
// partition table: the partitions vanish for a moment and come back. A
// prepare (or restore) that meets that moment waits for them instead of
// failing the volume; here a goroutine plays udev's re-read over and over.
func TestPrepareRidesOutTableRereads(t *testing.T) {
	n := newNode(t)
	s := sparseSpec("reread", n.newUUID(), "32Mi", map[string]any{"mode": "Block"})
	r := n.ok("prepare", s)
	dev := r.str("devicePath")
	part := filepath.Base(dev)
	disk := strings.TrimSuffix(part, "p1")
	info, ok, err := blockdev.Partition(part)
	require.NoError(t, err)
	require.True(t, ok)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var rereads atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				_, _ = loopdev.EnsurePartition(disk, 1, info.Start, info.Size)
				return
			default:
			}
			if loopdev.RemovePartition(disk, 1) == nil {
				rereads.Add(1)
			}
			time.Sleep(15 * time.Millisecond)
			_, _ = loopdev.EnsurePartition(disk, 1, info.Start, info.Size)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for i := 0; i < 20; i++ {
		r := n.do("prepare", s)
		if !assert.Equal(t, 0, r.Code, "prepare %d during re-reads: %s", i, r.Stdout) {
			break
		}
		assert.Equal(t, dev, r.str("devicePath"))
		r = n.exec(nil, "", "restore")
		if !assert.Equal(t, 0, r.Code, "restore %d during re-reads: %s", i, r.Stdout) {
			break
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("partition dropped and re-added %d times meanwhile", rereads.Load())
	require.Positive(t, rereads.Load())
	r = n.ok("prepare", s)
	resolves(t, r.str("persistentPath"), dev)
	n.ok("unprepare", s, "--wipe")
}
