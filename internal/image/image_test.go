package image

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriteReadsBackAndIsReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755))
	s := Spec{Ref: "salt-volumes.io/test:v1", Entrypoint: []string{"/usr/local/bin/tool"}, Cmd: []string{"serve"},
		User: "65532:65532", Labels: map[string]string{"org.opencontainers.image.title": "test"},
		Files: []File{{Path: "/usr/local/bin/tool", Source: bin, Mode: 0o755}, {Path: "/etc/motd", Data: []byte("hi\n")},
			{Path: "/bin/sh", Link: "/usr/local/bin/tool"}}}
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	da, err := Write(a, s)
	require.NoError(t, err)
	db, err := Write(b, s)
	require.NoError(t, err)
	assert.Equal(t, da, db, "the same files give the same digest")
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	assert.Equal(t, ba, bb, "and the same archive, byte for byte")

	// Read back as any OCI tool would: unpack the archive, open the layout.
	lay := filepath.Join(dir, "layout")
	require.NoError(t, Unpack(a, lay))
	idx, err := layout.ImageIndexFromPath(lay)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 1)
	assert.Equal(t, "salt-volumes.io/test:v1", im.Manifests[0].Annotations["io.containerd.image.name"])
	assert.Equal(t, "v1", im.Manifests[0].Annotations["org.opencontainers.image.ref.name"])
	assert.Equal(t, da, im.Manifests[0].Digest)
	img, err := idx.Image(da)
	require.NoError(t, err)
	mt, err := img.MediaType()
	require.NoError(t, err)
	assert.Equal(t, "application/vnd.oci.image.manifest.v1+json", string(mt))
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{"/usr/local/bin/tool"}, cf.Config.Entrypoint)
	assert.Equal(t, []string{"serve"}, cf.Config.Cmd)
	assert.Equal(t, "65532:65532", cf.Config.User)
	assert.Equal(t, "amd64", cf.Architecture)
	assert.Equal(t, "linux", cf.OS)

	tr := tar.NewReader(mutate.Extract(img))
	entries := map[string]*tar.Header{}
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		entries[h.Name], names = h, append(names, h.Name)
		if h.Name == "usr/local/bin/tool" {
			data, _ := io.ReadAll(tr)
			assert.Equal(t, "#!/bin/true\n", string(data))
		}
	}
	assert.True(t, sort.StringsAreSorted(names))
	assert.Equal(t, []string{"bin", "bin/sh", "etc", "etc/motd", "usr", "usr/local", "usr/local/bin", "usr/local/bin/tool"}, names)
	assert.Equal(t, int64(0o755), entries["usr/local/bin/tool"].Mode)
	assert.Equal(t, int64(0o644), entries["etc/motd"].Mode)
	assert.Equal(t, "/usr/local/bin/tool", entries["bin/sh"].Linkname)
	assert.Equal(t, 0, entries["etc/motd"].Uid)

	_, err = Write(filepath.Join(dir, "c.tar"), Spec{Ref: "x:1", Files: []File{{Path: "relative", Data: nil}}})
	assert.ErrorContains(t, err, `image file "relative": give an absolute path`)
	_, err = os.Stat(filepath.Join(dir, "c.tar"))
	assert.True(t, os.IsNotExist(err), "nothing written for bad input")
}

// A development build's version (with '+' build metadata) still makes an
// image: make image failed on it ("could not parse reference").
func TestTagOf(t *testing.T) {
	for version, want := range map[string]string{
		"0.4.0":                              "0.4.0",
		"0.4.0-dev.20261206T124000+g1e295a1": "0.4.0-dev.20261206T124000_g1e295a1",
		"dev":                                "dev",
	} {
		got, err := TagOf(version)
		require.NoError(t, err, version)
		assert.Equal(t, want, got, version)
		_, err = name.NewTag(ServeRepository+":"+got, name.StrictValidation)
		assert.NoError(t, err, "%s: a reference registries take", got)
	}
	for _, bad := range []string{"", ".0.4", "-x", "a/b", "0.4.0 beta", strings.Repeat("1", 129)} {
		_, err := TagOf(bad)
		assert.Error(t, err, "%q", bad)
	}
}
