package nodeexec

import (
	"encoding/base64"
	"encoding/json"
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

// keysOn returns a pipe's read end holding doc, as the Salt module hands
// keys over (its descriptor 3 in the child).
func keysOn(t *testing.T, doc string) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	_, err = w.WriteString(doc)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	t.Cleanup(func() { r.Close() })
	return r
}

// A volume whose key the Salt master keeps (provider master): a prepare
// without its key, or with a key that is not one, is refused before
// anything is written, and no error or output ever shows a key's bytes.
// Opening it with its key, reboots that leave it Locked and the master's
// restore run on the booted guests.
func TestMasterKeyIsAskedBeforeAnythingIsWritten(t *testing.T) {
	n := newNode(t)
	u := n.newUUID()
	enc := map[string]any{"encryption": map[string]any{"provider": "master"}}
	nothingWritten := func(what string) {
		t.Helper()
		for _, p := range []string{filepath.Join(n.dir, "volumes", u+".json"), filepath.Join(n.dir, "sparse", u), filepath.Join(n.dir, "keys", u+".key")} {
			_, err := os.Lstat(p)
			assert.ErrorIs(t, err, os.ErrNotExist, "%s: %s: nothing written", what, p)
		}
	}

	r := n.do("prepare", sparseSpec("vault", u, "64Mi", enc))
	assert.Equal(t, 3, r.Code, "refused: %s", r.Stdout)
	assert.Equal(t, "key_needed", r.errCode())
	assert.Contains(t, r.errMsg(), "volume vault: its key is held by the Salt master (provider master) and none was handed over")
	assert.Contains(t, r.errMsg(), "salt_volumes:keys:vault")
	nothingWritten("no key")

	// Keys for other volumes only: still none for this one.
	spec, err := json.Marshal(sparseSpec("vault", u, "64Mi", enc))
	require.NoError(t, err)
	other := base64.StdEncoding.EncodeToString(make([]byte, luks.KeyBytes))
	r = n.execFiles(nil, string(spec), []*os.File{keysOn(t, `{"other":"`+other+`"}`)}, "prepare", "--spec", "-", "--keys-fd", "3")
	assert.Equal(t, "key_needed", r.errCode(), r.Stdout)
	nothingWritten("another volume's key")

	// 16 bytes, not 32: named, with the fix, and not shown.
	short := []byte("0123456789abcdef")
	r = n.execFiles(nil, string(spec), []*os.File{keysOn(t, `{"vault":"`+base64.StdEncoding.EncodeToString(short)+`"}`)}, "prepare", "--spec", "-", "--keys-fd", "3")
	assert.Equal(t, 2, r.Code, r.Stdout)
	assert.Equal(t, "key", r.errCode())
	assert.Contains(t, r.errMsg(), "volume vault: the key handed over is 16 bytes, not 32: put 32 random bytes, base64-encoded, at salt_volumes:keys:vault (openssl rand -base64 32)")
	assert.NotContains(t, r.Stdout+r.Stderr, "0123456789abcdef")
	assert.NotContains(t, r.Stdout+r.Stderr, base64.StdEncoding.EncodeToString(short))
	nothingWritten("a short key")

	// Not base64, not JSON, not a descriptor of its own: exit 2, nothing
	// read back into the error.
	secret := "c2VjcmV0LWtleS1ieXRlcw!!"
	r = n.execFiles(nil, string(spec), []*os.File{keysOn(t, `{"vault":"`+secret+`"}`)}, "prepare", "--spec", "-", "--keys-fd", "3")
	assert.Equal(t, 2, r.Code, r.Stdout)
	assert.Equal(t, "key", r.errCode())
	assert.Contains(t, r.errMsg(), "volume vault: the key handed over is not base64: put 32 random bytes, base64-encoded, at salt_volumes:keys:vault")
	assert.NotContains(t, r.Stdout+r.Stderr, "c2VjcmV0")
	r = n.execFiles(nil, string(spec), []*os.File{keysOn(t, `vault=`+secret)}, "prepare", "--spec", "-", "--keys-fd", "3")
	assert.Equal(t, 2, r.Code, r.Stdout)
	assert.Contains(t, r.errMsg(), "--keys-fd: not a JSON object of volume names to base64 keys")
	assert.NotContains(t, r.Stdout+r.Stderr, "c2VjcmV0")
	r = n.exec(nil, string(spec), "prepare", "--spec", "-", "--keys-fd", "0")
	assert.Equal(t, 2, r.Code, r.Stdout)
	assert.Contains(t, r.errMsg(), "--keys-fd: 0 is one of stdin, stdout and stderr")
	nothingWritten("bad key documents")

	// A restore handed keys of volumes this node does not have, one of
	// them not even base64: fine (a bad entry stops only its volume).
	r = n.execFiles(nil, "", []*os.File{keysOn(t, `{"other":"`+other+`","odd":"`+secret+`"}`)}, "restore", "--keys-fd", "3")
	assert.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
	assert.NotContains(t, r.Stdout+r.Stderr, "c2VjcmV0")
}
