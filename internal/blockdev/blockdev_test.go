package blockdev

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnescapeMountinfo(t *testing.T) {
	assert.Equal(t, "/mnt/my data", unescape(`/mnt/my\040data`))
	assert.Equal(t, "/plain", unescape("/plain"))
	assert.Equal(t, `/odd\x`, unescape(`/odd\x`))
}

func TestUsageString(t *testing.T) {
	u := Usage{Mountpoints: []string{"/mnt"}, Holders: []string{"dm-0"}}
	assert.True(t, u.InUse())
	assert.Equal(t, "mounted on /mnt and held by dm-0", u.String())
	assert.False(t, Usage{}.InUse())
}

func TestPartitionName(t *testing.T) {
	for _, c := range []struct {
		disk, entry string
		want        bool
	}{
		{"sda", "sda1", true},
		{"loop3", "loop3p1", true},
		{"nvme0n1", "nvme0n1p12", true},
		{"sda", "sdaa", false}, // another disk's name
		{"sda", "holders", false},
		{"loop3", "loop3p", false},
		{"loop3", "queue", false},
	} {
		assert.Equal(t, c.want, partitionName(c.disk, c.entry), "%s under %s", c.entry, c.disk)
	}
}

// BoundLoops reads /proc/partitions; it must name the same devices as the
// sysfs way (a stat of /sys/block/loopN/loop for every loop node), leaving
// out only loop devices bound with zero capacity, which reach no byte.
func TestBoundLoopsMatchesSysfs(t *testing.T) {
	if _, err := os.Stat("/sys/block"); err != nil {
		t.Skip("no /sys/block here")
	}
	viaSysfs := func() []string {
		ents, err := os.ReadDir("/sys/block")
		require.NoError(t, err)
		var out []string
		for _, e := range ents {
			if !isLoop(e.Name()) {
				continue
			}
			if _, err := os.Stat(filepath.Join("/sys/block", e.Name(), "loop")); err != nil {
				continue
			}
			if n, err := SizeOf(e.Name()); err == nil && n == 0 {
				continue
			}
			out = append(out, e.Name())
		}
		sort.Strings(out)
		return out
	}
	// Other test packages bind and free loop devices meanwhile: a look
	// that races one of them is taken again.
	var want, got []string
	for range 5 {
		want = viaSysfs()
		got = BoundLoops()
		sort.Strings(got)
		if assert.ObjectsAreEqual(want, got) {
			break
		}
	}
	assert.Equal(t, want, got)
}
