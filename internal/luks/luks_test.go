package luks

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestContainerUUIDIsDerivedAndNotTheVolumes(t *testing.T) {
	v := "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	c := ContainerUUID(v)
	assert.NotEqual(t, v, c, "only the opened device may show the volume's UUID")
	assert.Equal(t, c, ContainerUUID(strings.ToUpper(v)), "derived from the volume UUID alone")
	u, err := uuid.Parse(c)
	require.NoError(t, err)
	assert.Equal(t, uuid.Version(5), u.Version())
	assert.NotEqual(t, c, ContainerUUID("3f2504e0-4f89-41d3-9a0c-0305e82c3302"))
	assert.Equal(t, "sv-"+v, MapperName(v))
}

// Format, read back and crypto-erase a container in a file, with the real
// cryptsetup (its header work needs no device-mapper; opening does, and is
// tested on the booted guests).
func TestFormatDumpErase(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "c")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.NoError(t, os.Truncate(file, 32<<20))
	k, err := NewKey()
	require.NoError(t, err)
	require.Len(t, k, KeyBytes)
	key := filepath.Join(dir, "k")
	require.NoError(t, os.WriteFile(key, k, 0o400))
	c := ContainerUUID(uuid.NewString())

	require.NoError(t, Format(ctx, file, c, key))
	h, err := Dump(ctx, file)
	require.NoError(t, err)
	assert.Equal(t, Header{UUID: c, Keyslots: 1}, h)
	ok, err := Opens(ctx, file, key)
	require.NoError(t, err)
	assert.True(t, ok, "its key opens it")
	other := filepath.Join(dir, "other")
	k2, err := NewKey()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(other, k2, 0o400))
	ok, err = Opens(ctx, file, other)
	require.NoError(t, err)
	assert.False(t, ok, "another key does not")

	require.NoError(t, Erase(ctx, file))
	h, err = Dump(ctx, file)
	require.NoError(t, err)
	assert.Equal(t, Header{UUID: c, Keyslots: 0}, h, "no keyslot after the erase; the header's UUID stays")
	require.NoError(t, Erase(ctx, file), "erasing again is fine (a rerun after a crash)")
	ok, err = Opens(ctx, file, key)
	require.NoError(t, err)
	assert.False(t, ok, "after the erase its own key opens nothing")

	// A file that holds no container: the error names it and cryptsetup's reason.
	plain := filepath.Join(dir, "plain")
	require.NoError(t, os.WriteFile(plain, make([]byte, 1<<20), 0o600))
	_, err = Dump(ctx, plain)
	require.Error(t, err)
	assert.Contains(t, err.Error(), plain)
	assert.Contains(t, err.Error(), "not a valid LUKS device")
}
