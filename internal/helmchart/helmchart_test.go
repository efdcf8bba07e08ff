package helmchart

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The repository's chart, packed twice at different times of day: the
// same bytes, the build's version in Chart.yaml, every file under the
// chart's name.
func TestPackIsReproducible(t *testing.T) {
	src := filepath.Join("..", "..", "deploy", "helm", "salt-volumes")
	const version = "0.4.0-dev.20261206140442+g83ebbb675956"
	at := time.Unix(1765000000, 0)
	a, err := Pack(src, version, t.TempDir(), at)
	require.NoError(t, err)
	assert.Equal(t, "salt-volumes-"+version+".tgz", filepath.Base(a))
	time.Sleep(1100 * time.Millisecond)
	b, err := Pack(src, version, t.TempDir(), at)
	require.NoError(t, err)
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	assert.True(t, bytes.Equal(da, db), "two packs of one chart differ")

	zr, err := gzip.NewReader(bytes.NewReader(da))
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
		assert.True(t, h.ModTime.Equal(at), "%s: time %s", h.Name, h.ModTime)
		assert.Equal(t, 0, h.Uid, h.Name)
		if h.Name == "salt-volumes/Chart.yaml" {
			body, _ := io.ReadAll(tr)
			assert.Contains(t, string(body), "\nversion: "+version+"\n")
			assert.Contains(t, string(body), "\nappVersion: "+version+"\n")
		}
	}
	assert.Contains(t, names, "salt-volumes/Chart.yaml")
	assert.Contains(t, names, "salt-volumes/values.yaml")
	assert.Contains(t, names, "salt-volumes/templates/serve.yaml")
	for _, n := range names {
		assert.True(t, strings.HasPrefix(n, "salt-volumes/"), n)
	}
}

func TestPackRefusesWhatHelmWouldNotLoad(t *testing.T) {
	src := filepath.Join("..", "..", "deploy", "helm", "salt-volumes")
	out := t.TempDir()
	_, err := Pack(src, "0.4", out, time.Unix(0, 0))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-version \"0.4\" is not a SemVer 2 version")
	_, err = Pack(t.TempDir(), "0.4.0", out, time.Unix(0, 0))
	assert.ErrorContains(t, err, "is not a chart")
	chart := func(chartYAML string, extra ...string) string {
		d := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(d, "Chart.yaml"), []byte(chartYAML), 0o644))
		require.NoError(t, os.MkdirAll(filepath.Join(d, "templates"), 0o755))
		for _, f := range extra {
			require.NoError(t, os.WriteFile(filepath.Join(d, f), []byte("x"), 0o644))
		}
		return d
	}
	for _, tc := range []struct{ name, chartYAML, want string }{
		{"a name that walks out", "apiVersion: v2\nname: ../../x\nversion: 1.0.0\nappVersion: 1.0.0\n", "no top-level name"},
		{"an empty name", "apiVersion: v2\nname:\nversion: 1.0.0\nappVersion: 1.0.0\n", "no top-level name"},
		{"a quoted name", "apiVersion: v2\nname: \"x\"\nversion: 1.0.0\nappVersion: 1.0.0\n", "no top-level name"},
		{"no appVersion", "apiVersion: v2\nname: x\nversion: 1.0.0\n", "0 top-level appVersion: lines"},
		{"two versions", "apiVersion: v2\nname: x\nversion: 1.0.0\nversion: 1.0.1\nappVersion: 1.0.0\n", "2 top-level version: lines"},
	} {
		_, err := Pack(chart(tc.chartYAML), "0.4.0", out, time.Unix(0, 0))
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	// An editor's swap file beside a template.
	_, err = Pack(chart("apiVersion: v2\nname: x\nversion: 1.0.0\nappVersion: 1.0.0\n", "templates/.serve.yaml.swp"), "0.4.0", out, time.Unix(0, 0))
	assert.ErrorContains(t, err, "a hidden file or directory in the chart")
	_, err = Pack(chart("apiVersion: v2\nname: x\nversion: 1.0.0\nappVersion: 1.0.0\n"), "0.4.0", filepath.Join(out, "missing"), time.Unix(0, 0))
	assert.ErrorContains(t, err, "-o "+filepath.Join(out, "missing")+" is not a directory")
	left, _ := os.ReadDir(out)
	assert.Empty(t, left, "a refused pack wrote something")
}
