package image

import (
	"fmt"
	"regexp"
	"strings"
)

// ServeRepository is the repository of serve's image (make image), as the
// Deployment manifest names it.
const ServeRepository = "salt-volumes.io/salt-volumes"

// Serve is serve's image: the static salt-volumes binary at bin, tagged
// tag and latest (the Deployment manifest's), on an empty base.
func Serve(bin, tag string) Spec {
	return Spec{
		Ref:     ServeRepository + ":" + tag,
		Aliases: []string{ServeRepository + ":latest"},
		Files:   []File{{Path: "/usr/local/bin/salt-volumes", Source: bin, Mode: 0o755}},
		// serve reads its configuration from a mounted ConfigMap; a pod's
		// args replace the subcommand and flags.
		Entrypoint: []string{"/usr/local/bin/salt-volumes"},
		Cmd:        []string{"serve", "--config", "/etc/salt-volumes/config.yaml"},
		// Nothing in serve needs root: the API server and salt-api are
		// reached over the network.
		User: "65532:65532",
		// The OCI annotation keys, as labels: what registries and
		// scanners show.
		Labels: map[string]string{
			"org.opencontainers.image.title":       "salt-volumes",
			"org.opencontainers.image.description": "salt-volumes' control plane (serve): local volumes on Salt-managed nodes",
			"org.opencontainers.image.version":     tag,
			"org.opencontainers.image.licenses":    "Apache-2.0",
			"org.opencontainers.image.source":      "https://github.com/salt-volumes/salt-volumes",
			"org.opencontainers.image.url":         "https://github.com/salt-volumes/salt-volumes",
			"org.opencontainers.image.vendor":      "salt-volumes",
		},
	}
}

// tagChars is what an OCI tag may hold (distribution-spec: at most 128
// characters, the first a letter, digit or '_').
var tagChars = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// TagOf is the image tag of a version: a development build's version
// carries build metadata after '+' (X.Y.Z-dev.<time>+g<commit>), which no
// tag may hold, so '+' becomes '_' as Helm does for charts in OCI
// registries.
func TagOf(version string) (string, error) {
	tag := strings.ReplaceAll(version, "+", "_")
	if !tagChars.MatchString(tag) {
		return "", fmt.Errorf("version %q makes no image tag (letters, digits, '_', '.', '-', at most 128, not starting with '.' or '-'): give -tag a version like 0.4.0 or 0.4.0-dev.20261206T124000+gabc1234", version)
	}
	return tag, nil
}
