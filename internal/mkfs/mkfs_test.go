package mkfs

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestArgsPutTheDeviceLastAndStampTheUUID(t *testing.T) {
	name, args, err := Args("ext4", "u-1", []string{"-m", "0"}, "/dev/loop3")
	require.NoError(t, err)
	assert.Equal(t, "mkfs.ext4", name)
	assert.Equal(t, []string{"-q", "-F", "-U", "u-1", "-E", "nodiscard", "-m", "0", "/dev/loop3"}, args)
	name, args, err = Args("xfs", "u-1", nil, "/f")
	require.NoError(t, err)
	assert.Equal(t, "mkfs.xfs", name)
	assert.Equal(t, []string{"-q", "-f", "-K", "-m", "uuid=u-1", "/f"}, args)
	_, _, err = Args("btrfs", "u", nil, "/f")
	assert.Error(t, err)
}
