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
	assert.Equal(t, "Apache-2.0", cf.Config.Labels["org.opencontainers.image.licenses"])
	assert.Equal(t, "v-test", cf.Config.Labels["org.opencontainers.image.version"])
	assert.Equal(t, "https://github.com/salt-volumes/salt-volumes", cf.Config.Labels["org.opencontainers.image.source"])

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

// make dist's image: one name, an image index with an image for amd64
// and one for arm64, each with its architecture's binary; the same bytes
// twice. The arm64 binary runs under qemu-user-static where it is.
func TestMultiPlatformImage(t *testing.T) {
	dir := t.TempDir()
	bins := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		bins[arch] = filepath.Join(dir, "salt-volumes-"+arch)
		build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=0.4.0-dev.1+gabc", "-o", bins[arch], "../../cmd/salt-volumes")
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+arch)
		out, err := build.CombinedOutput()
		require.NoError(t, err, string(out))
	}
	write := func(out string) string {
		var said bytes.Buffer
		require.NoError(t, run([]string{"-o", out, "-bin", "amd64=" + bins["amd64"] + ",arm64=" + bins["arm64"], "-tag", "0.4.0-dev.1+gabc"}, &said))
		return said.String()
	}
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	said := write(a)
	write(b)
	assert.Regexp(t, `^`+a+` salt-volumes.io/salt-volumes:0.4.0-dev.1_gabc sha256:[0-9a-f]{64}\n$`, said)
	x, err := os.ReadFile(a)
	require.NoError(t, err)
	y, err := os.ReadFile(b)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(x, y), "the same archive twice")

	lay := filepath.Join(dir, "layout")
	require.NoError(t, image.Unpack(a, lay))
	top, err := layout.ImageIndexFromPath(lay)
	require.NoError(t, err)
	tm, err := top.IndexManifest()
	require.NoError(t, err)
	require.Len(t, tm.Manifests, 2, "the version's name and latest")
	assert.Equal(t, tm.Manifests[0].Digest, tm.Manifests[1].Digest)
	assert.Equal(t, "salt-volumes.io/salt-volumes:0.4.0-dev.1_gabc", tm.Manifests[0].Annotations["io.containerd.image.name"])
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 2)
	for i, arch := range []string{"amd64", "arm64"} {
		d := im.Manifests[i]
		require.NotNil(t, d.Platform)
		assert.Equal(t, "linux", d.Platform.OS)
		assert.Equal(t, arch, d.Platform.Architecture)
		img, err := idx.Image(d.Digest)
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		assert.Equal(t, arch, cf.Architecture)
		tr := tar.NewReader(mutate.Extract(img))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				t.Fatalf("%s: no binary in the image", arch)
			}
			require.NoError(t, err)
			if h.Name != "usr/local/bin/salt-volumes" {
				continue
			}
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			want, err := os.ReadFile(bins[arch])
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, data), "%s: the %s binary", arch, arch)
			break
		}
	}
}
