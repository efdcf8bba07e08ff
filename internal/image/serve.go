package image

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
		User:   "65532:65532",
		Labels: map[string]string{"org.opencontainers.image.title": "salt-volumes", "org.opencontainers.image.version": tag},
	}
}
