// Package dist tests make dist: the release artifacts are reproducible,
// their checksums and SBOMs describe them, and the arm64 binaries start
// (under qemu-user-static's qemu-aarch64).
package dist

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const repo = "../.."

func dist(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(repo, "scripts", "dist.sh"))
	cmd.Env = append(os.Environ(), "DIST="+dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}

func version(t *testing.T) string {
	out, err := exec.Command(filepath.Join(repo, "scripts", "version.sh")).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

func files(t *testing.T, dir string) []string {
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func TestDist(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	dist(t, a)
	dist(t, b)
	v := version(t)
	var want []string
	for _, arch := range []string{"amd64", "arm64"} {
		for _, cmd := range []string{"salt-volume-exec", "salt-volumes"} {
			n := cmd + "_" + v + "_linux_" + arch
			want = append(want, n, n+".cdx.json")
		}
	}
	want = append(want, "SHA256SUMS", "saltext_volumes-"+strings.Replace(v, "-dev", ".dev0", 1)+"-py3-none-any.whl")
	sort.Strings(want)

	t.Run("every artifact, the same bytes twice", func(t *testing.T) {
		require.Equal(t, want, files(t, a))
		require.Equal(t, want, files(t, b))
		for _, n := range want {
			x, err := os.ReadFile(filepath.Join(a, n))
			require.NoError(t, err)
			y, err := os.ReadFile(filepath.Join(b, n))
			require.NoError(t, err)
			assert.True(t, bytes.Equal(x, y), "%s differs between two runs of make dist", n)
		}
	})

	t.Run("SHA256SUMS covers every artifact", func(t *testing.T) {
		f, err := os.Open(filepath.Join(a, "SHA256SUMS"))
		require.NoError(t, err)
		defer f.Close()
		seen := map[string]bool{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			sum, name, ok := strings.Cut(sc.Text(), "  ")
			require.True(t, ok, sc.Text())
			data, err := os.ReadFile(filepath.Join(a, name))
			require.NoError(t, err)
			h := sha256.Sum256(data)
			assert.Equal(t, hex.EncodeToString(h[:]), sum, name)
			seen[name] = true
		}
		assert.Len(t, seen, len(want)-1)
	})

	t.Run("each SBOM is CycloneDX and names what the binary links", func(t *testing.T) {
		for _, arch := range []string{"amd64", "arm64"} {
			for _, tc := range []struct {
				cmd         string
				has, hasNot string
			}{
				{"salt-volumes", "go.etcd.io/etcd/client/v3", ""},
				{"salt-volume-exec", "github.com/diskfs/go-diskfs", "go.etcd.io/etcd/client/v3"},
			} {
				data, err := os.ReadFile(filepath.Join(a, tc.cmd+"_"+v+"_linux_"+arch+".cdx.json"))
				require.NoError(t, err)
				var bom struct {
					BOMFormat    string `json:"bomFormat"`
					SpecVersion  string `json:"specVersion"`
					SerialNumber string `json:"serialNumber"`
					Metadata     struct {
						Timestamp string `json:"timestamp"`
						Component struct {
							Name, Version, Purl string
						} `json:"component"`
					} `json:"metadata"`
					Components []struct {
						Name, Version, Purl string
					} `json:"components"`
				}
				require.NoError(t, json.Unmarshal(data, &bom))
				assert.Equal(t, "CycloneDX", bom.BOMFormat)
				assert.Equal(t, "1.6", bom.SpecVersion)
				assert.Empty(t, bom.SerialNumber, "a serial number would differ between runs")
				assert.Empty(t, bom.Metadata.Timestamp)
				assert.Equal(t, "github.com/salt-volumes/salt-volumes", bom.Metadata.Component.Name)
				assert.Equal(t, "v"+v, bom.Metadata.Component.Version)
				names := map[string]bool{}
				for _, c := range bom.Components {
					names[c.Name] = true
					assert.NotEmpty(t, c.Version, c.Name)
					assert.True(t, strings.HasPrefix(c.Purl, "pkg:golang/"), c.Purl)
				}
				assert.True(t, names[tc.has], "%s's SBOM lacks %s", tc.cmd, tc.has)
				if tc.hasNot != "" {
					assert.False(t, names[tc.hasNot], "%s's SBOM names %s", tc.cmd, tc.hasNot)
				}
			}
		}
	})

	t.Run("the binaries of both architectures start and say their version", func(t *testing.T) {
		qemu, err := exec.LookPath("qemu-aarch64-static")
		require.NoError(t, err, "qemu-user-static runs the arm64 binaries (make setup installs it)")
		for _, arch := range []string{"amd64", "arm64"} {
			run := func(bin string, args ...string) string {
				cmd := exec.Command(bin, args...)
				if arch == "arm64" {
					cmd = exec.Command(qemu, append([]string{bin}, args...)...)
				}
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "%s %v: %s", bin, args, out)
				return strings.TrimSpace(string(out))
			}
			assert.Equal(t, v, run(filepath.Join(a, "salt-volumes_"+v+"_linux_"+arch), "version"), arch)
			var exec struct{ Version string }
			require.NoError(t, json.Unmarshal([]byte(run(filepath.Join(a, "salt-volume-exec_"+v+"_linux_"+arch), "version")), &exec), arch)
			assert.Equal(t, v, exec.Version, arch)
		}
	})
}
