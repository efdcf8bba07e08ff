package mkfs

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestArgsPutTheDeviceLastAndStampTheUUID(t *testing.T) {
	for _, tc := range []struct {
		name, fs string
		opts     []string
		force    bool
		bin      string
		want     []string
	}{
		{"ext4 keeps mkfs's checks", "ext4", []string{"-m", "0"}, false, "mkfs.ext4",
			[]string{"-q", "-U", "u-1", "-E", "nodiscard", "-m", "0", "/dev/loop3"}},
		{"ext4 redoing our own write", "ext4", nil, true, "mkfs.ext4",
			[]string{"-q", "-U", "u-1", "-E", "nodiscard", "-F", "/dev/loop3"}},
		{"xfs keeps mkfs's checks", "xfs", nil, false, "mkfs.xfs",
			[]string{"-q", "-K", "-m", "uuid=u-1", "/dev/loop3"}},
		{"xfs redoing our own write", "xfs", []string{"-L", "x"}, true, "mkfs.xfs",
			[]string{"-q", "-K", "-m", "uuid=u-1", "-f", "-L", "x", "/dev/loop3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin, args, err := Args(tc.fs, "u-1", tc.opts, "/dev/loop3", tc.force)
			require.NoError(t, err)
			assert.Equal(t, tc.bin, bin)
			assert.Equal(t, tc.want, args)
		})
	}
	_, _, err := Args("btrfs", "u", nil, "/f", false)
	assert.Error(t, err)
}
