package nodeexec

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/luks"
)

// An encrypted volume asked of a node whose kernel has no device-mapper
// (this machine's, and any CI runner like it) is refused before anything
// is written: no record, no file, no key. Opening, reboots and the
// crypto-erase run on the booted guests (test/booted), which have one.
func TestEncryptedRefusedWithoutDeviceMapper(t *testing.T) {
	if luks.Ready() == nil {
		t.Skip("this machine can open LUKS2 containers: the refusal cannot be shown here (test/booted runs encrypted volumes end to end)")
	}
	n := newNode(t)
	u := n.newUUID()
	r := n.do("prepare", sparseSpec("enc", u, "64Mi", map[string]any{"encryption": map[string]any{"provider": "keyfile"}}))
	assert.Equal(t, 3, r.Code, "refused: %s", r.Stdout)
	assert.Equal(t, "encryption_unavailable", r.errCode())
	assert.Contains(t, r.errMsg(), "encryption: volume enc is encrypted, and this node cannot open LUKS2 containers")
	assert.Contains(t, r.errMsg(), "Nothing was done")
	for _, p := range []string{filepath.Join(n.dir, "volumes", u+".json"), filepath.Join(n.dir, "sparse", u), filepath.Join(n.dir, "keys", u+".key")} {
		_, err := os.Lstat(p)
		assert.ErrorIs(t, err, os.ErrNotExist, "%s: nothing written", p)
	}
	l := n.exec(nil, "", "list")
	require.Equal(t, 0, l.Code, l.Stderr)
	assert.NotContains(t, l.Stdout, u)
}
