package main

import (
	"context"
	"flag"
	"log/slog"

	"github.com/salt-volumes/salt-volumes/internal/config"
	"github.com/salt-volumes/salt-volumes/internal/server"
	"github.com/salt-volumes/salt-volumes/internal/ui"
)

// serve runs the control plane until SIGINT or SIGTERM.
func (c *cli) serve(ctx context.Context, in []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	path := fs.String("config", "/etc/salt-volumes/config.yaml", "configuration file (YAML)")
	var o config.Overrides
	fs.StringVar(&o.Listen, "listen", "", "the API's host:port, over the file's listen (replicas sharing one file: --listen $(POD_IP):8080)")
	fs.DurationVar(&o.MinScheduleEvery, "min-schedule-every", 0, "the shortest snapshot schedule interval allowed, over the file's snapshots.minScheduleEvery (default 1m; a test knob: 1s lets a test see schedules run)")
	if _, err := args(fs, in, 0, "takes no arguments (--config FILE [--listen HOST:PORT])"); err != nil {
		return err
	}
	cfg, err := config.LoadWith(*path, o)
	if err != nil {
		return failf(exitUsage, "%v", err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return failf(exitUsage, "config logLevel: %q: use debug, info, warn or error", cfg.LogLevel)
	}
	log := slog.New(slog.NewJSONHandler(c.errw, &slog.HandlerOptions{Level: level}))
	return server.Run(ctx, cfg, log, ui.Handler(), nil)
}
