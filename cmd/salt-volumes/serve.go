package main

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/salt-volumes/salt-volumes/internal/config"
	"github.com/salt-volumes/salt-volumes/internal/server"
	"github.com/salt-volumes/salt-volumes/internal/ui"
)

// serveCmd runs the control plane until SIGINT or SIGTERM.
func (c *cli) serveCmd() *cobra.Command {
	var path string
	var o config.Overrides
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane: REST API, web UI, metrics",
		Long: `Run the control plane beside the salt-master until SIGINT or SIGTERM (then
exit 0): it starts the salt_volumes states on minions, learns their outcome
from the master's event bus and job cache, and serves the REST API, the web
UI and metrics. The package runs it as the salt-volumes user from
salt-volumes.service. Logs are JSON lines on stderr.`,
		Example: `  salt-volumes serve --config /etc/salt-volumes/config.yaml
  salt-volumes serve --config /etc/salt-volumes/config.yaml --listen "$POD_IP:8080"`,
		Args: noArgs("takes no arguments (--config FILE [--listen HOST:PORT])"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.LoadWith(path, o)
			if err != nil {
				return failf(exitUsage, "%v", err)
			}
			cfg.Version = version
			var level slog.Level
			if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
				return failf(exitUsage, "config logLevel: %q: use debug, info, warn or error", cfg.LogLevel)
			}
			log := slog.New(slog.NewJSONHandler(c.errw, &slog.HandlerOptions{Level: level}))
			return server.Run(cmd.Context(), cfg, log, ui.Handler(), nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "config", "/etc/salt-volumes/config.yaml", "configuration `FILE` (YAML)")
	f.StringVar(&o.Listen, "listen", "", "the API's host:port, over the file's listen (replicas sharing one file: --listen $(POD_IP):8080)")
	f.DurationVar(&o.MinScheduleEvery, "min-schedule-every", 0, "the shortest snapshot schedule interval allowed, over the file's snapshots.minScheduleEvery (default 1m; a test knob: 1s lets a test see schedules run)")
	_ = cmd.MarkFlagFilename("config", "yaml", "yml")
	_ = cmd.RegisterFlagCompletionFunc("listen", cobra.NoFileCompletions)
	return cmd
}
