// Command image writes salt-volumes' container image (make image): the
// static salt-volumes binary on an empty base, one layer, as an OCI archive
// for `ctr -n k8s.io images import`. No registry, no daemon, no network.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

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
	bin := fs.String("bin", "bin/salt-volumes", "the static salt-volumes binary (make build)")
	version := fs.String("tag", "dev", "the image's version (make image: the build's; '+' becomes '_' in the tag)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tag, err := image.TagOf(*version)
	if err != nil {
		return err
	}
	spec := image.Serve(*bin, tag)
	d, err := image.Write(*dst, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s %s %s\n", *dst, spec.Ref, d)
	return nil
}
