package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The licences of modules we link, read from the module cache as make
// dist reads them, against what their authors say they are (and what
// cyclonedx-gomod got wrong: golang.org/x as "BSD-Source-Code").
func TestModuleLicencesFromTheModuleCache(t *testing.T) {
	env, err := goEnv("GOMODCACHE")
	require.NoError(t, err)
	for mod, want := range map[string]string{
		"golang.org/x/sys@v0.49.0":                     "BSD-3-Clause",
		"go.etcd.io/bbolt@v1.5.0":                      "MIT",
		"github.com/hashicorp/go-retryablehttp@v0.7.8": "MPL-2.0",
		"github.com/davecgh/go-spew@v1.1.1":            "ISC",
		"github.com/vmihailenco/msgpack/v5@v5.4.1":     "BSD-2-Clause",
		"gopkg.in/yaml.v3@v3.0.1":                      "Apache-2.0 AND MIT",
		"k8s.io/client-go@v0.35.4":                     "Apache-2.0",
		"go.yaml.in/yaml/v2@v2.4.3":                    "Apache-2.0 AND MIT",
		"sigs.k8s.io/yaml@v1.6.0":                      "Apache-2.0 AND BSD-3-Clause AND MIT", // its own, Go's json, yaml.v3's
	} {
		dir := filepath.Join(env["GOMODCACHE"], escape(mod))
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("%s is not in the module cache: go mod download", mod)
		}
		got, err := moduleLicence(dir)
		require.NoError(t, err, mod)
		assert.Equal(t, want, got, mod)
	}
	got, err := moduleLicence("../..")
	require.NoError(t, err)
	assert.Equal(t, "Apache-2.0", got, "ours")
}

// Terms no rule knows are refused, naming the file and the fix.
func TestAnUnknownLicenceIsRefused(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "LICENSE"), []byte("Do what you like, but tell nobody.\n"), 0o644))
	_, err := moduleLicence(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(dir, "LICENSE"))
	assert.Contains(t, err.Error(), "add its rule")
	empty := t.TempDir()
	_, err = moduleLicence(empty)
	assert.ErrorContains(t, err, "no licence file")
}

// The SBOM gets a licence on every component, an expression where a
// module holds several, and nothing else of it changes.
func TestAddLicencesToAnSBOM(t *testing.T) {
	env, err := goEnv("GOMODCACHE")
	require.NoError(t, err)
	bom := map[string]any{
		"bomFormat": "CycloneDX", "specVersion": "1.6",
		"metadata": map[string]any{"component": map[string]any{"name": "github.com/salt-volumes/salt-volumes", "version": "v0.4.0", "purl": "pkg:golang/github.com/salt-volumes/salt-volumes@v0.4.0"}},
		"components": []any{
			map[string]any{"name": "golang.org/x/sys", "version": "v0.49.0", "purl": "pkg:golang/golang.org/x/sys@v0.49.0?type=module", "hashes": []any{map[string]any{"alg": "SHA-256", "content": "ab"}}},
			map[string]any{"name": "gopkg.in/yaml.v3", "version": "v3.0.1", "purl": "pkg:golang/gopkg.in/yaml.v3@v3.0.1?type=module"},
		},
	}
	data, err := json.Marshal(bom)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "x.cdx.json")
	require.NoError(t, os.WriteFile(path, data, 0o644))
	require.NoError(t, addLicences(path, env["GOMODCACHE"], "../.."))
	first, err := os.ReadFile(path)
	require.NoError(t, err)
	var got struct {
		Metadata struct {
			Component struct {
				Licenses []map[string]map[string]string
			}
		}
		Components []struct {
			Name     string
			Hashes   []map[string]string
			Licenses []map[string]any
		}
	}
	require.NoError(t, json.Unmarshal(first, &got))
	assert.Equal(t, "Apache-2.0", got.Metadata.Component.Licenses[0]["license"]["id"])
	require.Len(t, got.Components, 2)
	assert.Equal(t, map[string]any{"id": "BSD-3-Clause"}, got.Components[0].Licenses[0]["license"])
	assert.Equal(t, "ab", got.Components[0].Hashes[0]["content"], "the rest kept")
	assert.Equal(t, "Apache-2.0 AND MIT", got.Components[1].Licenses[0]["expression"])
	// Again: the same bytes.
	require.NoError(t, addLicences(path, env["GOMODCACHE"], "../.."))
	again, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, string(first), string(again))

	// Not an SBOM, or a component that is no Go module: refused.
	require.NoError(t, os.WriteFile(path, []byte(`{"bomFormat":"SPDX"}`), 0o644))
	assert.ErrorContains(t, addLicences(path, env["GOMODCACHE"], "../.."), "not a CycloneDX SBOM")
	require.NoError(t, os.WriteFile(path, []byte(`{"bomFormat":"CycloneDX","components":[{"name":"left-pad","version":"1.0.0","purl":"pkg:npm/left-pad@1.0.0"}]}`), 0o644))
	assert.ErrorContains(t, addLicences(path, env["GOMODCACHE"], "../.."), "is not a Go module")
}

// A package's SBOM: the package under our licence, carrying the binary
// and every module it links, each once, from the binaries' SBOMs (two of
// them for an image of both architectures).
func TestWrapAPackagesSBOM(t *testing.T) {
	dir := t.TempDir()
	bin := func(name, arch string) string {
		b := map[string]any{"bomFormat": "CycloneDX",
			"metadata": map[string]any{"component": map[string]any{"bom-ref": "pkg:golang/github.com/salt-volumes/salt-volumes@v0.4.0?type=module#cmd/salt-volumes",
				"name": "github.com/salt-volumes/salt-volumes", "licenses": []any{map[string]any{"license": map[string]any{"id": "Apache-2.0"}}}}},
			"components": []any{map[string]any{"bom-ref": "pkg:golang/go.etcd.io/bbolt@v1.5.0?type=module", "name": "go.etcd.io/bbolt",
				"licenses": []any{map[string]any{"license": map[string]any{"id": "MIT"}}}}},
			"dependencies": []any{map[string]any{"ref": "pkg:golang/go.etcd.io/bbolt@v1.5.0?type=module"}},
		}
		data, err := json.Marshal(b)
		require.NoError(t, err)
		p := filepath.Join(dir, name+"_"+arch+".cdx.json")
		require.NoError(t, os.WriteFile(p, data, 0o644))
		return p
	}
	amd, arm := bin("salt-volumes", "amd64"), bin("salt-volumes", "arm64")
	out := filepath.Join(dir, "image.cdx.json")
	a := artifact{Type: "container", Name: "salt-volumes.io/salt-volumes", Version: "0.4.0", Purl: "pkg:oci/salt-volumes?repository_url=salt-volumes.io/salt-volumes&tag=0.4.0"}
	require.NoError(t, wrap(out, a, "../..", []string{amd, arm}))
	var got struct {
		BOMFormat, SpecVersion string
		Metadata               struct {
			Component struct {
				Type, Name, Purl string
				Licenses         []map[string]map[string]string
			}
		}
		Components []struct {
			Ref  string `json:"bom-ref"`
			Name string
		}
		Dependencies []struct {
			Ref       string
			DependsOn []string
		}
	}
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &got))
	assert.Equal(t, "CycloneDX", got.BOMFormat)
	assert.Equal(t, "1.6", got.SpecVersion)
	assert.Equal(t, "container", got.Metadata.Component.Type)
	assert.Equal(t, a.Purl, got.Metadata.Component.Purl)
	assert.Equal(t, "Apache-2.0", got.Metadata.Component.Licenses[0]["license"]["id"])
	require.Len(t, got.Components, 2, "the binary and its module, once for both architectures")
	assert.Equal(t, "github.com/salt-volumes/salt-volumes", got.Components[0].Name)
	assert.Equal(t, a.Purl, got.Dependencies[0].Ref)
	assert.Equal(t, []string{got.Components[0].Ref}, got.Dependencies[0].DependsOn, "the image carries the binary")

	// A wheel carries no binary; a binary's SBOM without licences, or no
	// name, is refused.
	require.NoError(t, wrap(out, artifact{Type: "library", Name: "saltext-volumes", Version: "0.4.0", Purl: "pkg:pypi/saltext-volumes@0.4.0"}, "../..", nil))
	require.NoError(t, os.WriteFile(amd, []byte(`{"bomFormat":"CycloneDX","metadata":{"component":{"bom-ref":"x"}}}`), 0o644))
	assert.ErrorContains(t, wrap(out, a, "../..", []string{amd}), "without a licence")
	assert.ErrorContains(t, wrap(out, artifact{Name: "x"}, "../..", nil), "needs -type")
}
