// Command image writes salt-volumes' container image (make image): the
// static salt-volumes binary on an empty base, one layer, as an OCI archive
// for `ctr -n k8s.io images import`. No registry, no daemon, no network.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/image"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	dst := fs.String("o", "bin/salt-volumes-image.tar", "the OCI archive to write")
	bin := fs.String("bin", "bin/salt-volumes", "the static salt-volumes binary (make build), or ARCH=PATH,ARCH=PATH for a multi-platform image (make dist: amd64 and arm64)")
	version := fs.String("tag", "dev", "the image's version (make image: the build's; '+' becomes '_' in the tag)")
	notices := fs.Bool("notices", false, "put the licence notices of what each binary embeds (PATH.NOTICES, tools/notices) and LICENSE under /usr/share/doc/salt-volumes (make dist); refused if one is missing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tag, err := image.TagOf(*version)
	if err != nil {
		return err
	}
	withNotices := func(spec *image.Spec, bin string) error {
		if !*notices {
			return nil
		}
		for _, f := range []string{bin + ".NOTICES", "LICENSE"} {
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("-notices: %w (tools/notices writes PATH.NOTICES; LICENSE is the repository's)", err)
			}
		}
		spec.Files = append(spec.Files,
			image.File{Path: "/usr/share/doc/salt-volumes/NOTICES", Source: bin + ".NOTICES", Mode: 0o644},
			image.File{Path: "/usr/share/doc/salt-volumes/LICENSE", Source: "LICENSE", Mode: 0o644})
		return nil
	}
	if !strings.Contains(*bin, "=") {
		spec := image.Serve(*bin, tag)
		if err := withNotices(&spec, *bin); err != nil {
			return err
		}
		d, err := image.Write(*dst, spec)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s %s %s\n", *dst, spec.Ref, d)
		return nil
	}
	var specs []image.Spec
	for _, part := range strings.Split(*bin, ",") {
		arch, path, ok := strings.Cut(part, "=")
		if !ok || arch == "" || path == "" {
			return fmt.Errorf("-bin %q: give PATH, or ARCH=PATH entries separated by commas (amd64=bin/a,arm64=bin/b)", *bin)
		}
		spec := image.Serve(path, tag)
		spec.Arch = arch
		if err := withNotices(&spec, path); err != nil {
			return err
		}
		specs = append(specs, spec)
	}
	d, err := image.WriteIndex(*dst, specs)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s %s %s\n", *dst, specs[0].Ref, d)
	return nil
}
