// Package logbridge sends the logs of the libraries serve links (client-go's
// klog, the etcd client's zap logger) to serve's own log/slog handler, so
// that stderr carries one format (JSON lines) with a component attribute
// on every line, whoever wrote it.
package logbridge

import (
	"context"
	"log/slog"
	"math"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

// Klog routes client-go's logs (informers, leader election, the event
// broadcaster) to log, as component "client-go".
func Klog(log *slog.Logger) {
	klog.SetSlogLogger(log.With("component", "client-go"))
}

// Zap is a zap logger writing to log's handler, for the etcd client.
func Zap(log *slog.Logger) *zap.Logger {
	return zap.New(&core{h: log.Handler()})
}

// core is a zapcore.Core over a slog.Handler.
type core struct {
	h slog.Handler
}

func level(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (c *core) Enabled(l zapcore.Level) bool {
	return c.h.Enabled(context.Background(), level(l))
}

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	return &core{h: c.h.WithAttrs(attrs(fields))}
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, level(e.Level), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *core) Sync() error { return nil }

// attrs turns zap fields into slog attributes through zap's own map
// encoder, which knows every field type.
func attrs(fields []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		if f, ok := v.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
			v = nil // JSON has no NaN
		}
		out = append(out, slog.Any(k, v))
	}
	return out
}
