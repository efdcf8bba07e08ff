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
	tag := fs.String("tag", "dev", "the image's tag (make image: the version)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ref := "salt-volumes.io/salt-volumes:" + *tag
	d, err := image.Write(*dst, image.Spec{
		Ref:   ref,
		Files: []image.File{{Path: "/usr/local/bin/salt-volumes", Source: *bin, Mode: 0o755}},
		// serve reads its configuration from a mounted ConfigMap; a pod's
		// args replace the subcommand and flags.
		Entrypoint: []string{"/usr/local/bin/salt-volumes"},
		Cmd:        []string{"serve", "--config", "/etc/salt-volumes/config.yaml"},
		// Nothing in serve needs root: the API server and salt-api are
		// reached over the network.
		User:   "65532:65532",
		Labels: map[string]string{"org.opencontainers.image.title": "salt-volumes", "org.opencontainers.image.version": *tag},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s %s %s\n", *dst, ref, d)
	return nil
}
