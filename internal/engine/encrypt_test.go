package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/salt-volumes/salt-volumes/internal/luks"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// An encrypted volume's storage is ours when it carries the LUKS header
// with the UUID derived from the volume's; its own filesystem UUID on the
// backing file would mean a plain volume, and another container is
// someone else's.
func TestOursForEncryptedVolumes(t *testing.T) {
	u := "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	enc := &spec.Spec{Name: "v", UUID: u, Mode: spec.ModeFilesystem, FSType: spec.FSExt4, Encryption: &spec.Encryption{Provider: spec.ProviderKeyfile}}
	plain := &spec.Spec{Name: "v", UUID: u, Mode: spec.ModeFilesystem, FSType: spec.FSExt4}
	ourHeader := probe.Result{Kind: "LUKS", UUID: luks.ContainerUUID(u)}
	otherHeader := probe.Result{Kind: "LUKS", UUID: "9f2504e0-4f89-41d3-9a0c-0305e82c3301"}
	fs := probe.Result{Kind: "ext4", UUID: u}

	assert.True(t, ours(enc, ourHeader))
	assert.False(t, ours(enc, otherHeader), "another container, even on our file")
	assert.False(t, ours(enc, fs), "a plain filesystem is not the encrypted volume")
	assert.False(t, ours(plain, ourHeader))
	assert.True(t, ours(plain, fs))
	assert.True(t, holdsFS(enc, fs), "inside the opened container")
	assert.Equal(t, "luks+ext4", written(enc, false))
}
