// Package keep saves what the control plane otherwise holds only in memory
// (the volumes' usage history and their last jobs) to a file beside the
// store, so that a restart of serve shows them again. It is a snapshot,
// written atomically when something changed, at most once an interval and
// once more at shutdown: a crash loses at most an interval.
package keep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/nodestate"
)

// Snapshot is the file's content.
type Snapshot struct {
	Version int `json:"version"`
	// Usage by volume UUID; Jobs by volume name.
	Usage map[string][]saltvolumes.UsageSample `json:"usage"`
	Jobs  map[string][]saltvolumes.Job         `json:"jobs"`
}

// Source is what is kept: the reconciler and its node registry.
type Source interface {
	// Snapshot returns copies, and whether anything changed since the
	// last call.
	Snapshot() (Snapshot, bool)
}

// Load reads the file; a missing file is an empty snapshot.
func Load(path string) (Snapshot, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Snapshot{}, nil
	}
	if err != nil {
		return Snapshot{}, err
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return Snapshot{}, fmt.Errorf("%s: %w (move it away to start without history)", path, err)
	}
	return s, nil
}

// Save writes the snapshot atomically.
func Save(path string, s Snapshot) error {
	s.Version = 1
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return nodestate.WriteFileAtomic(path, b, 0o600)
}

// Run saves src to path every interval when it changed, and once more
// when ctx ends.
func Run(ctx context.Context, path string, src Source, every time.Duration, log *slog.Logger) {
	save := func() {
		s, changed := src.Snapshot()
		if !changed {
			return
		}
		if err := Save(path, s); err != nil {
			log.Warn("usage history and job logs not saved", "path", path, "error", err)
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			save()
			return
		case <-t.C:
			save()
		}
	}
}

// Compact keeps the first and the last of each run of equal samples: what
// a chart draws is the same, and a steady volume keeps two samples a day
// instead of one a minute.
func Compact(h []saltvolumes.UsageSample) []saltvolumes.UsageSample {
	out := make([]saltvolumes.UsageSample, 0, len(h))
	for i, s := range h {
		same := func(j int) bool {
			return j >= 0 && j < len(h) && h[j].Allocated == s.Allocated && h[j].FSUsed == s.FSUsed
		}
		if same(i-1) && same(i+1) {
			continue
		}
		out = append(out, s)
	}
	return out
}
