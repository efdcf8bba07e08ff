package luks

import (
	"context"
	"fmt"
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

// containerFile is a 32 MiB sparse file to format, in a directory of its own.
func containerFile(t *testing.T) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	file = filepath.Join(dir, "c")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.NoError(t, os.Truncate(file, 32<<20))
	return dir, file
}

// Format, read back and crypto-erase a container in a file, with the real
// cryptsetup (its header work needs no device-mapper; opening does, and is
// tested on the booted guests).
func TestFormatDumpErase(t *testing.T) {
	ctx := context.Background()
	dir, file := containerFile(t)
	k, err := NewKey()
	require.NoError(t, err)
	require.Len(t, k, KeyBytes)
	key := filepath.Join(dir, "k")
	require.NoError(t, os.WriteFile(key, k, 0o400))
	c := ContainerUUID(uuid.NewString())

	require.NoError(t, Format(ctx, file, c, FileKey(key)))
	h, err := Dump(ctx, file)
	require.NoError(t, err)
	assert.Equal(t, Header{UUID: c, Keyslots: 1}, h)
	ok, err := Opens(ctx, file, FileKey(key))
	require.NoError(t, err)
	assert.True(t, ok, "its key opens it")
	other := filepath.Join(dir, "other")
	k2, err := NewKey()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(other, k2, 0o400))
	ok, err = Opens(ctx, file, FileKey(other))
	require.NoError(t, err)
	assert.False(t, ok, "another key does not")

	require.NoError(t, Erase(ctx, file))
	h, err = Dump(ctx, file)
	require.NoError(t, err)
	assert.Equal(t, Header{UUID: c, Keyslots: 0}, h, "no keyslot after the erase; the header's UUID stays")
	require.NoError(t, Erase(ctx, file), "erasing again is fine (a rerun after a crash)")
	ok, err = Opens(ctx, file, FileKey(key))
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

// A key handed over in memory (provider master) reaches cryptsetup on its
// stdin, every byte of it: a container formatted with it opens with the
// same bytes in a file and with no other key, newlines and zero bytes
// included (cryptsetup would stop a passphrase read at a newline).
func TestKeyInMemoryIsTheSameKeyAsInAFile(t *testing.T) {
	ctx := context.Background()
	dir, file := containerFile(t)
	k, err := NewKey()
	require.NoError(t, err)
	k[3], k[17], k[30] = '\n', 0, '\n'
	require.NoError(t, Format(ctx, file, ContainerUUID(uuid.NewString()), BytesKey(k)))

	inFile := filepath.Join(dir, "k")
	require.NoError(t, os.WriteFile(inFile, k, 0o400))
	ok, err := Opens(ctx, file, FileKey(inFile))
	require.NoError(t, err)
	assert.True(t, ok, "the same bytes in a file open it")
	ok, err = Opens(ctx, file, BytesKey(k))
	require.NoError(t, err)
	assert.True(t, ok, "and in memory")
	short := append([]byte(nil), k[:3]...)
	ok, err = Opens(ctx, file, BytesKey(short))
	require.NoError(t, err)
	assert.False(t, ok, "the key up to its first newline is not the key")
	other := append([]byte(nil), k...)
	other[31] ^= 1
	ok, err = Opens(ctx, file, BytesKey(other))
	require.NoError(t, err)
	assert.False(t, ok, "one bit off opens nothing")

	assert.Equal(t, "(a key in memory)", BytesKey(k).String(), "a key never prints its bytes")
	assert.NotContains(t, fmt.Sprintf("%v %s %#v %+v", BytesKey(k), BytesKey(k), BytesKey(k), BytesKey(k)), string(k[:8]))
}
