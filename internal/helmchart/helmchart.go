// Package helmchart packages a Helm chart as helm package does (a gzipped
// tar of NAME/..., named NAME-VERSION.tgz), reproducibly: helm 3.22's own
// package stamps every entry with the time it ran, so two builds of one
// commit differ. Entries are sorted, owned by 0:0, mode 0644; the gzip
// header has no name and no time.
package helmchart

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// semver is SemVer 2.0's grammar, which helm requires of a chart version.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// versionLine is Chart.yaml's top-level version or appVersion line.
var versionLine = regexp.MustCompile(`(?m)^(version|appVersion):.*$`)

// nameLine is Chart.yaml's top-level name, unquoted.
var nameLine = regexp.MustCompile(`(?m)^name:[ \t]*([^ \t\r\n]+)[ \t]*$`)

// chartName is what helm takes as a chart's name, and what is safe as a
// file name and the archive's top directory.
var chartName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Pack writes the chart in dir to out/NAME-VERSION.tgz (helm package's
// layout) with its version and appVersion set to version, every entry
// timed mtime, and returns the archive's path. The same chart, version
// and mtime give the same bytes.
func Pack(dir, version, out string, mtime time.Time) (string, error) {
	if !semver.MatchString(version) {
		return "", fmt.Errorf("-version %q is not a SemVer 2 version, which helm requires of a chart: give one like 0.4.0 or 0.4.0-dev.20261206140442+gabc1234 (scripts/version.sh)", version)
	}
	chartYAML, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return "", fmt.Errorf("%s is not a chart: %w", dir, err)
	}
	chartFile := filepath.Join(dir, "Chart.yaml")
	m := nameLine.FindSubmatch(chartYAML)
	if m == nil || !chartName.Match(m[1]) {
		return "", fmt.Errorf("%s: no top-level name line with a chart's name (lower-case letters, digits and '-', unquoted): give one, e.g. name: salt-volumes", chartFile)
	}
	name := string(m[1])
	for _, key := range []string{"version", "appVersion"} {
		n := 0
		for _, l := range versionLine.FindAll(chartYAML, -1) {
			if k, _, _ := strings.Cut(string(l), ":"); k == key {
				n++
			}
		}
		if n != 1 {
			return "", fmt.Errorf("%s: %d top-level %s: lines: give it exactly one (its value is replaced by -version)", chartFile, n, key)
		}
	}
	chartYAML = versionLine.ReplaceAllFunc(chartYAML, func(line []byte) []byte {
		key, _, _ := strings.Cut(string(line), ":")
		return []byte(key + ": " + version)
	})

	var files []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir && strings.HasPrefix(d.Name(), ".") {
			// helm package skips templates/.* and what .helmignore names;
			// an editor's swap file packed as a template breaks installs.
			return fmt.Errorf("%s: a hidden file or directory in the chart: remove it (the packed chart holds only the chart's own files)", p)
		}
		switch {
		case d.IsDir():
		case d.Type().IsRegular():
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		default:
			return fmt.Errorf("%s is not a plain file (a link, socket or device): a chart holds plain files", p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)

	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(zw)
	for _, rel := range files {
		data := chartYAML
		if rel != "Chart.yaml" {
			if data, err = os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel))); err != nil {
				return "", err
			}
		}
		h := &tar.Header{Name: name + "/" + rel, Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(h); err != nil {
			return "", err
		}
		if _, err := tw.Write(data); err != nil {
			return "", err
		}
	}
	if err := errors.Join(tw.Close(), zw.Close()); err != nil {
		return "", err
	}
	if fi, err := os.Stat(out); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("-o %s is not a directory: make it first", out)
	}
	path := filepath.Join(out, name+"-"+version+".tgz")
	tmp := path + ".tmp"
	err = os.WriteFile(tmp, buf.Bytes(), 0o644)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return path, nil
}
