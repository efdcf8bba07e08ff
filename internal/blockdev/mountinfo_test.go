package blockdev

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMountsOf(t *testing.T) {
	const info = `22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
812 760 7:3 / /var/lib/pod\040a/vol rw,relatime - ext4 /dev/loop3 rw
813 760 7:3 /sub /srv/bind rw,relatime - ext4 /dev/loop3 rw
814 760 7:30 / /other rw,relatime - ext4 /dev/loop30 rw
`
	got, err := MountsOf(strings.NewReader(info), Dev{7, 3})
	require.NoError(t, err)
	assert.Equal(t, []MountEntry{
		{ID: 812, Dev: Dev{7, 3}, Root: "/", Mountpoint: "/var/lib/pod a/vol"},
		{ID: 813, Dev: Dev{7, 3}, Root: "/sub", Mountpoint: "/srv/bind"},
	}, got)
	got, err = MountsOf(strings.NewReader(info), Dev{8, 0})
	require.NoError(t, err)
	assert.Empty(t, got)
	// A disk and its partitions at once, each mount with its own device.
	got, err = MountsOf(strings.NewReader(info), Dev{7, 30}, Dev{7, 3}, Dev{8, 0})
	require.NoError(t, err)
	assert.Equal(t, []MountEntry{
		{ID: 812, Dev: Dev{7, 3}, Root: "/", Mountpoint: "/var/lib/pod a/vol"},
		{ID: 813, Dev: Dev{7, 3}, Root: "/sub", Mountpoint: "/srv/bind"},
		{ID: 814, Dev: Dev{7, 30}, Root: "/", Mountpoint: "/other"},
	}, got)
}
