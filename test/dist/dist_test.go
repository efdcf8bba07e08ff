// Package dist tests make dist: the release artifacts are reproducible,
// their checksums and SBOMs describe them, the packages pass lintian and
// rpmlint and carry what the docs say, and the arm64 binaries start (under
// qemu-user-static's qemu-aarch64).
package dist

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/image"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

const repo = "../.."

func dist(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(repo, "scripts", "dist.sh"))
	// Unsigned whatever the caller's environment says: the same bytes.
	cmd.Env = append(os.Environ(), "DIST="+dir, "SIGN_KEY=")
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
			want = append(want, n, n+".cdx.json", n+".NOTICES")
		}
	}
	want = append(want, "SHA256SUMS", "saltext_volumes-"+pep440(v)+"-py3-none-any.whl", "salt-volumes-image_"+v+".tar", "salt-volumes-"+v+".tgz")
	want = append(want, packageFiles(v)...)
	// An SBOM of each package, the image and the wheel (#52 item 4).
	carriers := append([]string{"saltext_volumes-" + pep440(v) + "-py3-none-any.whl", "salt-volumes-image_" + v + ".tar"}, packageFiles(v)...)
	for _, c := range carriers {
		want = append(want, c+".cdx.json")
	}
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
						Licenses            []struct {
							License    struct{ ID string } `json:"license"`
							Expression string              `json:"expression"`
						} `json:"licenses"`
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
				licences := map[string]string{}
				for _, c := range bom.Components {
					names[c.Name] = true
					assert.NotEmpty(t, c.Version, c.Name)
					assert.True(t, strings.HasPrefix(c.Purl, "pkg:golang/"), c.Purl)
					// Each module's licence (#52 item 4), as its authors name it.
					if assert.Len(t, c.Licenses, 1, c.Name) {
						licences[c.Name] = c.Licenses[0].License.ID + c.Licenses[0].Expression
					}
				}
				for mod, want := range map[string]string{"golang.org/x/sys": "BSD-3-Clause", "go.etcd.io/bbolt": "MIT",
					"github.com/hashicorp/go-retryablehttp": "MPL-2.0", "github.com/diskfs/go-diskfs": "MIT", "github.com/vmihailenco/msgpack/v5": "BSD-2-Clause"} {
					if names[mod] {
						assert.Equal(t, want, licences[mod], "%s in %s's SBOM", mod, tc.cmd)
					}
				}
				assert.True(t, names[tc.has], "%s's SBOM lacks %s", tc.cmd, tc.has)
				if tc.hasNot != "" {
					assert.False(t, names[tc.hasNot], "%s's SBOM names %s", tc.cmd, tc.hasNot)
				}
			}
		}
	})

	t.Run("the packages', the image's and the wheel's SBOMs name them and what they carry, with licences", func(t *testing.T) {
		for _, c := range carriers {
			data, err := os.ReadFile(filepath.Join(a, c+".cdx.json"))
			require.NoError(t, err)
			var bom struct {
				BOMFormat, SpecVersion string
				Metadata               struct {
					Component struct {
						Type, Name, Version, Purl string
						Licenses                  []struct{ License struct{ ID string } }
					}
				}
				Components []struct {
					Name     string
					Licenses []json.RawMessage
				}
			}
			require.NoError(t, json.Unmarshal(data, &bom), c)
			assert.Equal(t, "CycloneDX", bom.BOMFormat, c)
			assert.Equal(t, "1.6", bom.SpecVersion, c)
			m := bom.Metadata.Component
			if assert.Len(t, m.Licenses, 1, c) {
				assert.Equal(t, "Apache-2.0", m.Licenses[0].License.ID, c)
			}
			names := map[string]bool{}
			for _, x := range bom.Components {
				names[x.Name] = true
				assert.Len(t, x.Licenses, 1, "%s: %s", c, x.Name)
			}
			switch {
			case strings.HasSuffix(c, ".whl"):
				assert.Equal(t, "library", m.Type)
				assert.Equal(t, "pkg:pypi/saltext-volumes@"+strings.ReplaceAll(pep440(v), "+", "%2B"), m.Purl)
				assert.Empty(t, bom.Components, "pure Python: no binary in it")
			case strings.HasSuffix(c, ".tar"):
				assert.Equal(t, "container", m.Type)
				assert.True(t, strings.HasPrefix(m.Purl, "pkg:oci/salt-volumes?"), m.Purl)
				assert.True(t, names["go.etcd.io/etcd/client/v3"], "serve's modules")
			default:
				assert.Equal(t, "application", m.Type)
				kind := "pkg:deb/"
				if strings.HasSuffix(c, ".rpm") {
					kind = "pkg:rpm/"
				}
				assert.True(t, strings.HasPrefix(m.Purl, kind+"salt-volumes/"+m.Name+"@"), m.Purl)
				assert.True(t, names["github.com/salt-volumes/salt-volumes"], "%s carries our binary", c)
				assert.True(t, names["github.com/diskfs/go-diskfs"], "%s carries the node's binary", c)
				if m.Name == "salt-volume-exec" {
					assert.False(t, names["go.etcd.io/etcd/client/v3"], "%s: the node's package has no etcd client", c)
				} else {
					assert.True(t, names["go.etcd.io/etcd/client/v3"], c)
				}
			}
		}
	})

	t.Run("an RPM unpacked the usual way stays where it is unpacked (#52 item 1)", func(t *testing.T) {
		for _, r := range packagesOf(a, v, "rpm") {
			requireRelativePayload(t, r)
			out, err := exec.Command("rpm", "-K", "-v", r).CombinedOutput()
			require.NoError(t, err, "%s", out)
			assert.Contains(t, string(out), "Header SHA256 digest: OK")
			assert.Contains(t, string(out), "Payload SHA256 digest: OK")
			// rpm2cpio | cpio -idm, as admins look inside a package.
			dir := t.TempDir()
			cmd := exec.Command("sh", "-c", `rpm2cpio "$1" | cpio -idm --quiet`, "sh", r)
			cmd.Dir = dir
			out, err = cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			list, err := exec.Command("rpm", "-qlp", r).Output()
			require.NoError(t, err)
			for _, f := range strings.Fields(string(list)) {
				_, err := os.Lstat(filepath.Join(dir, f))
				assert.NoError(t, err, "%s: %s unpacked inside the directory", filepath.Base(r), f)
			}
		}
	})

	t.Run("packages are lintian- and rpmlint-clean", func(t *testing.T) {
		debs, rpms := packagesOf(a, v, "deb"), packagesOf(a, v, "rpm")
		lintian, err := exec.LookPath("lintian")
		require.NoError(t, err, "lintian judges the .debs (make setup installs it)")
		// Every tag, pedantic and informational included; what we waive is
		// in packaging/nfpm/*.lintian-overrides, each with its reason.
		out, err := exec.Command(lintian, append([]string{"--tag-display-limit", "0", "-I", "-E", "--pedantic", "--fail-on", "error,warning,info,pedantic"}, debs...)...).CombinedOutput()
		assert.NoError(t, err, "%s", out)
		assert.Empty(t, findings(out), "lintian:\n%s", out)
		rpmlint, err := exec.LookPath("rpmlint")
		require.NoError(t, err, "rpmlint judges the .rpms (make setup installs it)")
		// rpmlint 2.4 unpacks with "rpm2cpio | cpio -id" in a temporary
		// directory: it runs only on payloads whose names are relative
		// (nfpm's were absolute, and cpio wrote them over this machine's
		// /usr and /etc; #52 item 1).
		for _, r := range rpms {
			requireRelativePayload(t, r)
		}
		lint := exec.Command(rpmlint, append([]string{"-c", filepath.Join(repo, "packaging", "nfpm", "rpmlint.toml")}, rpms...)...)
		out, err = lint.CombinedOutput()
		assert.NoError(t, err, "%s", out)
		for _, leak := range []string{"/usr/share/licenses/salt-volumes", "/usr/share/salt-volumes/master.d/salt-volumes.conf"} {
			_, err := os.Stat(leak)
			assert.True(t, os.IsNotExist(err), "rpmlint unpacked %s onto this machine", leak)
		}
		assert.Contains(t, string(out), "4 packages and 0 specfiles checked; 0 errors, 0 warnings", "rpmlint:\n%s", out)
	})

	t.Run("packages carry what the operations guide says", func(t *testing.T) {
		deb := func(name string) string { return filepath.Join(a, name+"_"+debVersion(v)+"_amd64.deb") }
		listing := func(pkg string) string {
			out, err := exec.Command("dpkg-deb", "--contents", deb(pkg)).CombinedOutput()
			require.NoError(t, err, "%s", out)
			return string(out)
		}
		node := listing("salt-volume-exec")
		assert.Regexp(t, `(?m)^-rwxr-xr-x root/root .* \./usr/bin/salt-volume-exec$`, node)
		assert.Regexp(t, `(?m)^drwx------ root/root .* \./var/lib/salt-volumes/$`, node, "the node's records, root's only")
		assert.Contains(t, node, "./lib/systemd/system/salt-volumes-restore.service")
		plane := listing("salt-volumes")
		for _, f := range []string{"./usr/bin/salt-volumes", "./lib/systemd/system/salt-volumes.service", "./etc/salt-volumes/config.yaml",
			"./usr/share/salt-formulas/states/salt_volumes/installed.sls", "./usr/share/salt-formulas/states/_modules/salt_volumes.py",
			"./usr/share/salt-formulas/states/salt_volumes/files/salt-volume-exec", "./usr/share/salt-volumes/master.d/salt-volumes.conf",
			"./usr/share/salt-formulas/states/salt_volumes/files/salt-volume-exec.amd64", "./usr/share/salt-formulas/states/salt_volumes/files/salt-volume-exec.arm64"} {
			assert.Contains(t, plane, f)
		}
		file := func(pkg, path string) string {
			dir := t.TempDir()
			out, err := exec.Command("dpkg-deb", "-x", deb(pkg), dir).CombinedOutput()
			require.NoError(t, err, "%s", out)
			b, err := os.ReadFile(filepath.Join(dir, path))
			require.NoError(t, err)
			return string(b)
		}
		unit := file("salt-volume-exec", "lib/systemd/system/salt-volumes-restore.service")
		assert.Contains(t, unit, "ExecStart=/usr/bin/salt-volume-exec --state-dir /var/lib/salt-volumes restore")
		assert.NotContains(t, unit, "{{", "the formula's template is filled in")
		serve := file("salt-volumes", "lib/systemd/system/salt-volumes.service")
		assert.Contains(t, serve, "ExecStart=/usr/bin/salt-volumes serve --config /etc/salt-volumes/config.yaml")
		assert.Contains(t, serve, "User=salt-volumes")
		snippet := file("salt-volumes", "usr/share/salt-volumes/master.d/salt-volumes.conf")
		assert.Contains(t, snippet, "    - /usr/share/salt-formulas/states\n")
		assert.NotContains(t, snippet, "/opt/")
		// The licences of what the static binaries embed (#52 item 4):
		// each module's own files, gzipped beside the copyright file.
		notices := func(pkg, bin string) string {
			dir := t.TempDir()
			out, err := exec.Command("dpkg-deb", "-x", deb(pkg), dir).CombinedOutput()
			require.NoError(t, err, "%s", out)
			z, err := exec.Command("gzip", "-dc", filepath.Join(dir, "usr/share/doc", pkg, "NOTICES."+bin+".gz")).Output()
			require.NoError(t, err)
			return string(z)
		}
		for _, tc := range []struct{ pkg, bin, has string }{
			{"salt-volume-exec", "salt-volume-exec", "==> github.com/diskfs/go-diskfs "},
			{"salt-volumes", "salt-volume-exec", "==> github.com/diskfs/go-diskfs "},
			{"salt-volumes", "salt-volumes", "==> github.com/hashicorp/go-retryablehttp "},
		} {
			n := notices(tc.pkg, tc.bin)
			assert.Contains(t, n, tc.has, "%s: NOTICES.%s", tc.pkg, tc.bin)
			assert.Contains(t, n, "==> the Go runtime and standard library ")
		}
		planeNotices := notices("salt-volumes", "salt-volumes")
		for _, m := range []string{"go.etcd.io/bbolt ", "go.uber.org/zap ", "github.com/go-zeromq/zmq4 ", "k8s.io/client-go "} {
			assert.Contains(t, planeNotices, "==> "+m)
		}
		assert.Contains(t, planeNotices, "Mozilla Public License", "the MPL's text, as go-retryablehttp ships it")
		assert.Contains(t, file("salt-volumes", "usr/share/doc/salt-volumes/copyright"), "NOTICES.<binary>.gz")
		rpmList, err := exec.Command("rpm", "-qlp", filepath.Join(a, "salt-volumes-"+debVersion(v)+"-1.x86_64.rpm")).Output()
		require.NoError(t, err)
		for _, f := range []string{"/usr/share/licenses/salt-volumes/LICENSE", "/usr/share/licenses/salt-volumes/NOTICES.salt-volumes", "/usr/share/licenses/salt-volumes/NOTICES.salt-volume-exec"} {
			assert.Contains(t, string(rpmList), f+"\n")
		}
		out, err := exec.Command("dpkg-deb", "--ctrl-tarfile", deb("salt-volumes")).Output()
		require.NoError(t, err)
		assert.Contains(t, tarFile(t, out, "./conffiles"), "/etc/salt-volumes/config.yaml", "the configuration is kept on upgrade")
	})

	t.Run("the wheel says what it needs, where it comes from and how it installs (#52 item 9)", func(t *testing.T) {
		pyv := pep440(v)
		zr, err := zip.OpenReader(filepath.Join(a, "saltext_volumes-"+pyv+"-py3-none-any.whl"))
		require.NoError(t, err)
		defer zr.Close()
		names := map[string]bool{}
		var meta string
		for _, f := range zr.File {
			names[f.Name] = true
			if f.Name == "saltext_volumes-"+pyv+".dist-info/METADATA" {
				r, err := f.Open()
				require.NoError(t, err)
				b, err := io.ReadAll(r)
				require.NoError(t, err)
				meta = string(b)
			}
		}
		for _, kind := range []string{"modules", "states", "beacons", "engines", "runners"} {
			assert.True(t, names["saltext/volumes/"+kind+"/salt_volumes.py"], "the %s module", kind)
		}
		require.NotEmpty(t, meta)
		for _, line := range []string{"Requires-Dist: salt>=3006", "Requires-Python: >=3.10", "Classifier: Programming Language :: Python :: 3.11",
			"License-Expression: Apache-2.0", "License-File: LICENSE", "Project-URL: Source, https://github.com/salt-volumes/salt-volumes"} {
			assert.Contains(t, meta, line+"\n")
		}
		// Its README (the long description) names the file make dist
		// writes, and the runner.
		assert.Contains(t, meta, "salt-pip install saltext_volumes-<version>-py3-none-any.whl")
		assert.Contains(t, meta, "runner")
		// The build backend is pinned: the same wheel any day.
		pyproject, err := os.ReadFile(filepath.Join(repo, "packaging", "saltext", "pyproject.toml.in"))
		require.NoError(t, err)
		assert.Regexp(t, `(?m)^requires = \["setuptools==[0-9.]+"\]$`, string(pyproject))
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

	t.Run("serve's image: one index, amd64 and arm64 (#52 item 6)", func(t *testing.T) {
		lay := t.TempDir()
		require.NoError(t, image.Unpack(filepath.Join(a, "salt-volumes-image_"+v+".tar"), lay))
		top, err := layout.ImageIndexFromPath(lay)
		require.NoError(t, err)
		tm, err := top.IndexManifest()
		require.NoError(t, err)
		require.NotEmpty(t, tm.Manifests)
		tag, err := image.TagOf(v)
		require.NoError(t, err)
		assert.Equal(t, image.ServeRepository+":"+tag, tm.Manifests[0].Annotations["io.containerd.image.name"])
		idx, err := top.ImageIndex(tm.Manifests[0].Digest)
		require.NoError(t, err)
		im, err := idx.IndexManifest()
		require.NoError(t, err)
		var platforms []string
		licence, err := os.ReadFile(filepath.Join(repo, "LICENSE"))
		require.NoError(t, err)
		for _, d := range im.Manifests {
			require.NotNil(t, d.Platform)
			platforms = append(platforms, d.Platform.OS+"/"+d.Platform.Architecture)
			// Each image carries the terms of what its binary embeds.
			img, err := idx.Image(d.Digest)
			require.NoError(t, err)
			files := map[string][]byte{}
			tr := tar.NewReader(mutate.Extract(img))
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				require.NoError(t, err)
				if strings.HasPrefix(h.Name, "usr/share/doc/salt-volumes/") {
					b, err := io.ReadAll(tr)
					require.NoError(t, err)
					files[strings.TrimPrefix(h.Name, "usr/share/doc/salt-volumes/")] = b
				}
			}
			notices, err := os.ReadFile(filepath.Join(a, "salt-volumes_"+v+"_linux_"+d.Platform.Architecture+".NOTICES"))
			require.NoError(t, err)
			assert.Equal(t, string(notices), string(files["NOTICES"]), "%s: the image's notices are not its binary's", d.Platform.Architecture)
			assert.Equal(t, string(licence), string(files["LICENSE"]), d.Platform.Architecture)
		}
		assert.Equal(t, []string{"linux/amd64", "linux/arm64"}, platforms)
	})

	t.Run("the Helm chart: packaged, this build's version, rolling pods onto this build's image (#52 item 5)", func(t *testing.T) {
		helm, err := testenv.Helm()
		require.NoError(t, err)
		tgz := filepath.Join(a, "salt-volumes-"+v+".tgz")
		out, err := exec.Command(helm, "lint", "--strict", tgz, "--set", "salt.url=https://salt.example.com:8000").CombinedOutput()
		require.NoError(t, err, "helm lint --strict of the packaged chart: %s", out)
		out, err = exec.Command(helm, "show", "chart", tgz).Output()
		require.NoError(t, err)
		assert.Contains(t, string(out), "\nversion: "+v+"\n")
		assert.Contains(t, string(out), "\nappVersion: "+v+"\n")
		out, err = exec.Command(helm, "template", "salt-volumes", tgz, "--namespace", "salt-volumes", "--set", "salt.url=https://salt.example.com:8000").Output()
		require.NoError(t, err)
		tag, err := image.TagOf(v)
		require.NoError(t, err)
		assert.Contains(t, string(out), `image: "`+image.ServeRepository+":"+tag+`"`, "the chart's default image is this build's (make dist's image archive)")
	})

	t.Run("make dist SIGN_KEY signs the packages and SHA256SUMS (#52 item 10), make repo makes signed apt and dnf repositories of them (item 11)", func(t *testing.T) {
		c, home, fpr := signed(t, a, v)
		repository(t, c, home, fpr, v)
	})
}

// signed signs a copy of the artifacts in dir with a throwaway key, as
// make dist SIGN_KEY=<key> does (scripts/sign.sh), and checks each
// signature the way docs/releasing.md tells users to, and that a changed
// byte fails it.
func signed(t *testing.T, dir, v string) (c, home, fpr string) {
	for _, tool := range []string{"gpg", "debsigs", "debsig-verify", "rpmsign"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "%s signs or checks the release (make setup installs it)", tool)
	}
	c = t.TempDir()
	for _, n := range files(t, dir) {
		data, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(c, n), data, 0o644))
	}
	home = t.TempDir()
	// gpg's agent, started in the throwaway home, goes before the home.
	t.Cleanup(func() {
		cmd := exec.Command("gpgconf", "--kill", "all")
		cmd.Env = append(os.Environ(), "GNUPGHOME="+home)
		_ = cmd.Run()
	})
	run := func(env []string, name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Env = append(append(os.Environ(), "GNUPGHOME="+home), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	must := func(name string, args ...string) string {
		t.Helper()
		out, err := run(nil, name, args...)
		require.NoError(t, err, "%s %v: %s", name, args, out)
		return out
	}
	must("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "salt-volumes test release <release@salt-volumes.invalid>", "rsa3072", "sign", "never")
	var keyid string
	for _, line := range strings.Split(must("gpg", "--batch", "--with-colons", "--list-secret-keys"), "\n") {
		f := strings.Split(line, ":")
		if f[0] == "sec" && keyid == "" {
			keyid = f[4]
		}
		if f[0] == "fpr" && fpr == "" {
			fpr = f[9]
		}
	}
	require.NotEmpty(t, fpr)
	cmd := exec.Command(filepath.Join(repo, "scripts", "sign.sh"), c, fpr)
	cmd.Env = append(os.Environ(), "GNUPGHOME="+home)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.FileExists(t, filepath.Join(c, "SHA256SUMS.asc"))

	// SHA256SUMS: signed, and naming the signed packages' bytes.
	must("gpg", "--batch", "--verify", filepath.Join(c, "SHA256SUMS.asc"), filepath.Join(c, "SHA256SUMS"))
	sums := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
	sums.Dir = c
	out2, err := sums.CombinedOutput()
	require.NoError(t, err, "%s", out2)
	// The public key beside them is the signer's.
	assert.Contains(t, must("gpg", "--batch", "--show-keys", "--with-colons", filepath.Join(c, "signing-key.asc")), fpr)

	// RPMs: rpm -K, with the key imported into a database of the test's.
	db := t.TempDir()
	rpms := packagesOf(c, v, "rpm")
	require.Len(t, rpms, 4)
	nokey, _ := run(nil, "rpm", append([]string{"--dbpath", db, "-K"}, rpms...)...)
	assert.Contains(t, nokey, "SIGNATURES NOT OK", "without the key, rpm cannot check them")
	must("rpm", "--dbpath", db, "--import", filepath.Join(c, "signing-key.asc"))
	checked := must("rpm", append([]string{"--dbpath", db, "-K"}, rpms...)...)
	assert.Equal(t, 4, strings.Count(checked, "digests signatures OK"), "%s", checked)

	// .debs: debsig-verify, with a policy and keyring of the test's.
	pol, kr := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(pol, keyid), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(kr, keyid), 0o755))
	ring, err := exec.Command("gpg", "--batch", "--dearmor", "--output", "-", filepath.Join(c, "signing-key.asc")).Output()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(kr, keyid, "debsig.gpg"), ring, 0o644))
	policy := `<?xml version="1.0"?>
<!DOCTYPE Policy SYSTEM "https://www.debian.org/debsig/1.0/policy.dtd">
<Policy xmlns="https://www.debian.org/debsig/1.0/">
  <Origin Name="salt-volumes" id="` + keyid + `" Description="salt-volumes releases"/>
  <Selection><Required Type="origin" File="debsig.gpg" id="` + keyid + `"/></Selection>
  <Verification MinOptional="0"><Required Type="origin" File="debsig.gpg" id="` + keyid + `"/></Verification>
</Policy>
`
	require.NoError(t, os.WriteFile(filepath.Join(pol, keyid, "salt-volumes.pol"), []byte(policy), 0o644))
	debs := packagesOf(c, v, "deb")
	require.Len(t, debs, 4)
	for _, deb := range debs {
		out := must("debsig-verify", "--policies-dir", pol, "--keyrings-dir", kr, deb)
		assert.Contains(t, out, "Verified package from 'salt-volumes releases'", deb)
		// Still a package dpkg reads.
		must("dpkg-deb", "--info", deb)
	}
	unsigned := packagesOf(dir, v, "deb")[0]
	_, err = run(nil, "debsig-verify", "--policies-dir", pol, "--keyrings-dir", kr, unsigned)
	assert.Error(t, err, "an unsigned package fails debsig-verify")

	// A changed byte fails the check (on a copy: c stays as signed).
	sumsPath := filepath.Join(t.TempDir(), "SHA256SUMS")
	data, err := os.ReadFile(filepath.Join(c, "SHA256SUMS"))
	require.NoError(t, err)
	data[0] ^= 1
	require.NoError(t, os.WriteFile(sumsPath, data, 0o644))
	_, err = run(nil, "gpg", "--batch", "--verify", filepath.Join(c, "SHA256SUMS.asc"), sumsPath)
	assert.Error(t, err, "a changed SHA256SUMS fails its signature")
	return c, home, fpr
}

// repository runs make repo (scripts/repo.sh) on the signed artifacts in
// dist and uses what it makes as a node would: apt, in a root of the
// test's (no change to this machine), adds the repository with the
// exported key, finds both packages at version v and fetches them with
// the bytes make dist made; an index changed after signing is refused.
// The dnf index's signature and contents are checked with gpg and its
// primary list, then by dnf itself where it is installed.
func repository(t *testing.T, dist, home, fpr, v string) {
	for _, tool := range []string{"apt-ftparchive", "createrepo_c", "apt-get"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "%s makes or reads the repositories (make setup installs it)", tool)
	}
	// apt reads these paths from a sources.list line, where a subtest's
	// temp dir ("(#...", spaces) would not parse: plain ones.
	plain := func() string {
		d, err := os.MkdirTemp("", "salt-volumes-apt-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	rdir := filepath.Join(plain(), "repo")
	cmd := exec.Command(filepath.Join(repo, "scripts", "repo.sh"))
	cmd.Env = append(os.Environ(), "GNUPGHOME="+home, "DIST="+dist, "REPO="+rdir, "SIGN_KEY="+fpr)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	root := plain()
	for _, d := range []string{"etc/apt/sources.list.d", "etc/apt/preferences.d", "etc/apt/apt.conf.d", "etc/apt/trusted.gpg.d",
		"var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/lib/dpkg", "dl"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644))
	ring, err := exec.Command("gpg", "--batch", "--dearmor", "--output", "-", filepath.Join(rdir, "signing-key.asc")).Output()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "key.gpg"), ring, 0o644))
	apt := func(dir, prog string, args ...string) (string, error) {
		cmd := exec.Command(prog, append([]string{"-o", "Dir=" + root, "-o", "Dir::State::status=" + root + "/var/lib/dpkg/status",
			"-o", "APT::Architecture=amd64", "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"}, args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	source := func(r string) {
		line := "deb [signed-by=" + root + "/key.gpg] file:" + r + "/apt stable main\n"
		require.NoError(t, os.WriteFile(filepath.Join(root, "etc/apt/sources.list"), []byte(line), 0o644))
		require.NoError(t, os.RemoveAll(filepath.Join(root, "var/lib/apt/lists")))
		require.NoError(t, os.MkdirAll(filepath.Join(root, "var/lib/apt/lists/partial"), 0o755))
	}
	source(rdir)
	upd, err := apt("", "apt-get", "update")
	require.NoError(t, err, "%s", upd)
	assert.NotContains(t, upd, "W:", "apt-get update warns: %s", upd)
	for _, pkg := range []string{"salt-volumes", "salt-volume-exec"} {
		policy, err := apt("", "apt-cache", "policy", pkg)
		require.NoError(t, err, policy)
		assert.Contains(t, policy, "Candidate: "+debVersion(v), "%s from the repository: %s", pkg, policy)
		out, err := apt(filepath.Join(root, "dl"), "apt-get", "download", pkg)
		require.NoError(t, err, out)
		name := pkg + "_" + debVersion(v) + "_amd64.deb"
		got, err := os.ReadFile(filepath.Join(root, "dl", name))
		require.NoError(t, err)
		want, err := os.ReadFile(filepath.Join(dist, name))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(want, got), "%s: apt fetched the bytes make dist signed", name)
	}
	sim, err := apt("", "apt-get", "--simulate", "install", "salt-volumes", "salt-volume-exec")
	require.NoError(t, err, sim)
	assert.Contains(t, sim, "Inst salt-volumes ("+debVersion(v)+" salt-volumes:stable [amd64])")

	// The index changed after it was signed: apt refuses the repository.
	bad := filepath.Join(plain(), "bad")
	require.NoError(t, exec.Command("cp", "-a", rdir, bad).Run())
	inRelease := filepath.Join(bad, "apt/dists/stable/InRelease")
	data, err := os.ReadFile(inRelease)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(inRelease, bytes.Replace(data, []byte("Label: salt-volumes"), []byte("Label: salt-volumez"), 1), 0o644))
	source(bad)
	upd, err = apt("", "apt-get", "update")
	assert.Error(t, err, "apt-get update of a changed index: %s", upd)
	assert.Contains(t, upd, "BADSIG")

	// Another key's repository of these packages: refused, as dnf would
	// refuse each package; and a key whose primary cannot sign is refused
	// by scripts/sign.sh (debsig-verify checks only a primary's signatures).
	gen := func(uid, usage string) string {
		g := exec.Command("gpg", "--batch", "--passphrase", "", "--quick-gen-key", uid, "rsa3072", usage, "never")
		g.Env = append(os.Environ(), "GNUPGHOME="+home)
		out, err := g.CombinedOutput()
		require.NoError(t, err, "%s", out)
		l := exec.Command("gpg", "--batch", "--with-colons", "--list-secret-keys", uid)
		l.Env = g.Env
		list, err := l.Output()
		require.NoError(t, err)
		for _, line := range strings.Split(string(list), "\n") {
			if f := strings.Split(line, ":"); f[0] == "fpr" {
				return f[9]
			}
		}
		t.Fatalf("no fingerprint for %s", uid)
		return ""
	}
	other := gen("another key <other@salt-volumes.invalid>", "sign")
	wrong := exec.Command(filepath.Join(repo, "scripts", "repo.sh"))
	wrong.Env = append(os.Environ(), "GNUPGHOME="+home, "DIST="+dist, "REPO="+filepath.Join(t.TempDir(), "wrong"), "SIGN_KEY="+other)
	out, err = wrong.CombinedOutput()
	assert.Error(t, err, "make repo with another key than the packages': %s", out)
	assert.Contains(t, string(out), "carries no good signature by "+other)
	certOnly := gen("certify only <cert@salt-volumes.invalid>", "cert")
	sign := exec.Command(filepath.Join(repo, "scripts", "sign.sh"), t.TempDir(), certOnly)
	sign.Env = append(os.Environ(), "GNUPGHOME="+home)
	out, err = sign.CombinedOutput()
	assert.Error(t, err, "%s", out)
	assert.Contains(t, string(out), "cannot sign")

	// dnf's side: the signed index names every package with its digest.
	gpg := exec.Command("gpg", "--batch", "--verify", filepath.Join(rdir, "rpm/repodata/repomd.xml.asc"), filepath.Join(rdir, "rpm/repodata/repomd.xml"))
	gpg.Env = append(os.Environ(), "GNUPGHOME="+home)
	out2, err := gpg.CombinedOutput()
	require.NoError(t, err, "%s", out2)
	primary, err := exec.Command("sh", "-c", `gzip -dc "$1"`, "sh", filepath.Join(rdir, "rpm/repodata/primary.xml.gz")).Output()
	require.NoError(t, err)
	for _, rpm := range packagesOf(dist, v, "rpm") {
		data, err := os.ReadFile(rpm)
		require.NoError(t, err)
		h := sha256.Sum256(data)
		assert.Contains(t, string(primary), hex.EncodeToString(h[:]), "%s in the dnf index", filepath.Base(rpm))
	}
	conf, err := os.ReadFile(filepath.Join(rdir, "rpm/salt-volumes.repo"))
	require.NoError(t, err)
	assert.Contains(t, string(conf), "gpgcheck=1")
	assert.Contains(t, string(conf), "repo_gpgcheck=1")

	// And dnf itself (Debian's dnf 4, make setup installs it), in a root
	// of the test's: the shipped repository file, its two URLs pointed at
	// the files, checks the index's signature with the exported key and
	// finds both packages at version v for both architectures; an index
	// changed after signing is refused.
	if _, err := exec.LookPath("dnf"); err != nil {
		t.Log("dnf is not installed: the repository was checked with gpg and its index only")
		return
	}
	dnf := func(rpmDir string, args ...string) (string, error) {
		root, reposd := t.TempDir(), t.TempDir()
		c := strings.NewReplacer("https://packages.example.org/salt-volumes/rpm", "file://"+rpmDir,
			"https://packages.example.org/salt-volumes/signing-key.asc", "file://"+filepath.Join(rdir, "signing-key.asc")).Replace(string(conf))
		require.NoError(t, os.WriteFile(filepath.Join(reposd, "salt-volumes.repo"), []byte(c), 0o644))
		cmd := exec.Command("dnf", append([]string{"--installroot", root, "--setopt=reposdir=" + reposd, "--releasever", "40",
			"--setopt=skip_if_unavailable=False", "--assumeyes", "--quiet"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out3, err := dnf(filepath.Join(rdir, "rpm"), "repoquery", "--available", "--forcearch", "x86_64", "--qf", "%{name} %{version} %{arch}\n")
	require.NoError(t, err, "%s", out3)
	for _, pkg := range []string{"salt-volume-exec", "salt-volumes"} {
		assert.Contains(t, out3, pkg+" "+debVersion(v)+" x86_64", "dnf repoquery: %s", out3)
	}
	// (A plain path: a subtest's temp dir holds "#", which ends a URL.)
	tampered := filepath.Join(plain(), "rpm")
	require.NoError(t, exec.Command("cp", "-a", filepath.Join(rdir, "rpm"), tampered).Run())
	f, err := os.OpenFile(filepath.Join(tampered, "repodata/repomd.xml"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("<!-- changed after signing -->\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	out3, err = dnf(tampered, "makecache")
	assert.Error(t, err, "dnf took an index changed after signing: %s", out3)
	assert.Contains(t, out3, "GPG signature")
}

// requireRelativePayload stops the test unless every file name in the
// RPM's payload is relative and stays inside ("./usr/bin/x"): only then
// may anything unpack it with cpio.
func requireRelativePayload(t *testing.T, rpm string) {
	t.Helper()
	out, err := exec.Command("sh", "-c", `rpm2cpio "$1" | cpio -t --quiet`, "sh", rpm).Output()
	require.NoError(t, err)
	names := strings.Fields(string(out))
	require.NotEmpty(t, names)
	for _, n := range names {
		require.True(t, strings.HasPrefix(n, "./") && !strings.Contains(n, ".."), "%s: payload name %q is not relative: cpio -id would write it outside its directory", filepath.Base(rpm), n)
	}
}

// pep440 is v as the wheel carries it: 0.4.0-dev.20261206091234+g<commit>
// is 0.4.0.dev20261206091234+g<commit>.
func pep440(v string) string {
	return strings.Replace(strings.Replace(v, "-dev.", ".dev", 1), "-dev", ".dev0", 1)
}

// debVersion is v as Debian orders it: a pre-release sorts before its release.
func debVersion(v string) string { return strings.Replace(v, "-", "~", 1) }

// packageFiles are the .deb and .rpm names make dist writes for version v.
func packageFiles(v string) []string {
	var names []string
	for _, pkg := range []string{"salt-volume-exec", "salt-volumes"} {
		for _, arch := range [][2]string{{"amd64", "x86_64"}, {"arm64", "aarch64"}} {
			names = append(names, pkg+"_"+debVersion(v)+"_"+arch[0]+".deb", pkg+"-"+debVersion(v)+"-1."+arch[1]+".rpm")
		}
	}
	return names
}

func packagesOf(dir, v, ext string) []string {
	var paths []string
	for _, n := range packageFiles(v) {
		if strings.HasSuffix(n, "."+ext) {
			paths = append(paths, filepath.Join(dir, n))
		}
	}
	return paths
}

// findings are lintian's tag lines (its own notes, like running as root,
// are not findings).
func findings(out []byte) []string {
	var tags []string
	for _, l := range strings.Split(string(out), "\n") {
		if len(l) > 2 && l[1] == ':' && strings.ContainsRune("EWIPX", rune(l[0])) {
			tags = append(tags, l)
		}
	}
	return tags
}

// tarFile is the content of one member of a tar archive.
func tarFile(t *testing.T, archive []byte, name string) string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		require.NoError(t, err, "%s not in the archive", name)
		if h.Name == name {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			return string(b)
		}
	}
}
