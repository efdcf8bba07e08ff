// Command notices writes the licence notices of what a Go binary embeds:
// the Go distribution's licence and, for each module its build info lists,
// the licence and notice files of that module (at its root and in its
// subdirectories) as the module cache holds them. make dist writes them
// beside each binary and into the packages (scripts/packages.sh): the
// binaries are static, so every module's licence travels with them.
//
//	notices [-o FILE] BINARY
//	notices -sbom FILE.cdx.json
//	notices -wrap OUT.cdx.json -type T -name N -version V -purl P [-from A.cdx.json,B.cdx.json]
//
// A module without a licence file fails the run: nothing is shipped
// without its terms. With -sbom, it writes the SPDX licence of each module
// a CycloneDX SBOM lists into it instead (sbom.go).
package main

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	debug "runtime/debug"
	"sort"
	"strings"
)

// licenceFile matches the names modules give their terms, at the module's
// root.
var licenceFile = regexp.MustCompile(`(?i)^(licen[cs]e|copying|notice|patents)(\.(md|txt|rst))?$|^(licen[cs]e|copying)[-_.]`)

func main() {
	out := flag.String("o", "", "write the notices here (default: standard output)")
	sbom := flag.String("sbom", "", "write each module's licence into this CycloneDX SBOM, in place (run from the repository's root: its LICENSE is the main component's)")
	wrapOut := flag.String("wrap", "", "write here the SBOM of a package, image or wheel of ours that carries the binaries whose SBOMs -from names (wrap.go)")
	var a artifact
	flag.StringVar(&a.Type, "type", "", "with -wrap: the artifact's CycloneDX type (application, container, library)")
	flag.StringVar(&a.Name, "name", "", "with -wrap: the artifact's name")
	flag.StringVar(&a.Version, "version", "", "with -wrap: the artifact's version")
	flag.StringVar(&a.Purl, "purl", "", "with -wrap: the artifact's package URL (pkg:deb/..., pkg:rpm/..., pkg:oci/..., pkg:pypi/...)")
	from := flag.String("from", "", "with -wrap: the SBOMs of the binaries it carries, comma-separated")
	flag.Parse()
	if *wrapOut != "" {
		if err := wrap(*wrapOut, a, ".", splitList(*from)); err != nil {
			fmt.Fprintln(os.Stderr, "notices:", err)
			os.Exit(1)
		}
		return
	}
	if *sbom != "" {
		env, err := goEnv("GOMODCACHE")
		if err == nil {
			err = addLicences(*sbom, env["GOMODCACHE"], ".")
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "notices:", err)
			os.Exit(1)
		}
		return
	}
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: notices [-o FILE] BINARY")
		os.Exit(2)
	}
	text, err := notices(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "notices:", err)
		os.Exit(1)
	}
	if *out == "" {
		_, err = os.Stdout.Write(text)
	} else {
		err = os.WriteFile(*out, text, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "notices:", err)
		os.Exit(1)
	}
}

func notices(bin string) ([]byte, error) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading the build info of %s: %w", bin, err)
	}
	env, err := goEnv("GOROOT", "GOMODCACHE")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "Licences of the code in %s\n\n", filepath.Base(bin))
	fmt.Fprintf(&b, "%s is salt-volumes (module %s), under the Apache License 2.0 (its LICENSE).\n", filepath.Base(bin), info.Main.Path)
	fmt.Fprintf(&b, "It is statically linked with the Go runtime and standard library (%s) and with the modules below, each under its own terms, which follow.\n", info.GoVersion)
	fmt.Fprintf(&b, "The source of each module, at the version named, is in the salt-volumes source release's module set and on the Go module proxy (https://proxy.golang.org/<module>/@v/<version>.zip); for the MPL-2.0 ones that is where their source is available.\n")
	goLicence, err := os.ReadFile(filepath.Join(env["GOROOT"], "LICENSE"))
	if err != nil {
		return nil, fmt.Errorf("the Go distribution's licence: %w", err)
	}
	section(&b, "the Go runtime and standard library "+info.GoVersion, "LICENSE", goLicence)
	deps := append([]*debug.Module(nil), info.Deps...)
	sort.Slice(deps, func(i, j int) bool { return deps[i].Path < deps[j].Path })
	for _, d := range deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		dir := filepath.Join(env["GOMODCACHE"], escape(m.Path)+"@"+escape(m.Version))
		if m.Version == "" {
			// Replaced by a directory: the path is that directory.
			dir = m.Path
		}
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("module %s %s is not in the module cache (%s): run go mod download first: %w", m.Path, m.Version, dir, err)
		}
		names, err := licenceFiles(dir)
		if err != nil {
			return nil, err
		}
		if !hasRoot(names) {
			return nil, fmt.Errorf("module %s %s has no licence file at its root (%s): it cannot be shipped without its terms", m.Path, m.Version, dir)
		}
		for _, n := range names {
			body, err := os.ReadFile(filepath.Join(dir, n))
			if err != nil {
				return nil, err
			}
			section(&b, m.Path+" "+m.Version, n, body)
		}
	}
	return b.Bytes(), nil
}

// licenceFiles lists a module's licence and notice files, its root's
// first, then those of code it carries from elsewhere in subdirectories
// (third_party/, forked copies, internal/ ports), which may be linked in
// too; test data and vendor trees (never built from a dependency) aside.
func licenceFiles(dir string) ([]string, error) {
	var root, sub []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != dir && (n == "testdata" || n == "vendor" || strings.HasPrefix(n, ".") || n == "_examples" || n == "examples") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !licenceFile.MatchString(d.Name()) {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if strings.Contains(rel, "/") {
			sub = append(sub, rel)
		} else {
			root = append(root, rel)
		}
		return nil
	})
	sort.Strings(root)
	sort.Strings(sub)
	return append(root, sub...), err
}

func hasRoot(names []string) bool { return len(names) > 0 && !strings.Contains(names[0], "/") }

func section(b *bytes.Buffer, what, file string, body []byte) {
	fmt.Fprintf(b, "\n\n==> %s (%s) <==\n\n", what, file)
	b.Write(bytes.TrimRight(body, "\n"))
	b.WriteString("\n")
}

// escape is a module path as the module cache names its directory: each
// upper-case letter is "!" and its lower case.
func escape(path string) string {
	var s strings.Builder
	for _, r := range path {
		if r >= 'A' && r <= 'Z' {
			s.WriteByte('!')
			r += 'a' - 'A'
		}
		s.WriteRune(r)
	}
	return s.String()
}

func goEnv(names ...string) (map[string]string, error) {
	out, err := exec.Command("go", append([]string{"env"}, names...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("go env: %s", ee.Stderr)
		}
		return nil, fmt.Errorf("go env: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(names) {
		return nil, fmt.Errorf("go env printed %d lines for %d names", len(lines), len(names))
	}
	env := map[string]string{}
	for i, n := range names {
		env[n] = lines[i]
	}
	return env, nil
}
