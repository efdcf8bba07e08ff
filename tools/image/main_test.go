package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/image"
)

// The image of the real binary: the binary in it runs on its own (static,
// nothing else in the image), as the pod's entrypoint will.
func TestImageOfTheRealBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "salt-volumes")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=v-test", "-o", bin, "../../cmd/salt-volumes")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))
	archive := filepath.Join(dir, "image.tar")
	var said bytes.Buffer
	require.NoError(t, run([]string{"-o", archive, "-bin", bin, "-tag", "v-test"}, &said))
	assert.Regexp(t, `^`+archive+` salt-volumes.io/salt-volumes:v-test sha256:[0-9a-f]{64}\n$`, said.String())

	lay := filepath.Join(dir, "layout")
	require.NoError(t, image.Unpack(archive, lay))
	idx, err := layout.ImageIndexFromPath(lay)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	// One image under two names: the version and the manifest's latest.
	require.Len(t, im.Manifests, 2)
	assert.Equal(t, "salt-volumes.io/salt-volumes:v-test", im.Manifests[0].Annotations["io.containerd.image.name"])
	assert.Equal(t, "salt-volumes.io/salt-volumes:latest", im.Manifests[1].Annotations["io.containerd.image.name"])
	assert.Equal(t, im.Manifests[0].Digest, im.Manifests[1].Digest)
	img, err := idx.Image(im.Manifests[0].Digest)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{"/usr/local/bin/salt-volumes"}, cf.Config.Entrypoint)
	assert.Equal(t, []string{"serve", "--config", "/etc/salt-volumes/config.yaml"}, cf.Config.Cmd)

	// The root filesystem a container would get: run the binary from it.
	root := filepath.Join(dir, "root")
	tr := tar.NewReader(mutate.Extract(img))
	var files []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		files = append(files, h.Name)
		p := filepath.Join(root, h.Name)
		if h.Typeflag == tar.TypeDir {
			require.NoError(t, os.MkdirAll(p, 0o755))
			continue
		}
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p, data, os.FileMode(h.Mode)))
	}
	assert.Equal(t, []string{"usr", "usr/local", "usr/local/bin", "usr/local/bin/salt-volumes"}, files, "nothing but the binary")
	got, err := exec.Command(filepath.Join(root, cf.Config.Entrypoint[0]), "version").CombinedOutput()
	require.NoError(t, err, string(got))
	assert.Equal(t, "v-test", strings.TrimSpace(string(got)))
	ldd, _ := exec.Command("ldd", filepath.Join(root, cf.Config.Entrypoint[0])).CombinedOutput()
	assert.Contains(t, string(ldd), "not a dynamic executable", "static: the empty base has no libc")
}
