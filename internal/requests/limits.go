package requests

import (
	"fmt"

	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// LimitError: the store holds limits.volumes volumes already.
type LimitError struct{ Max int }

func (e *LimitError) Error() string {
	return fmt.Sprintf("the control plane holds %d volumes, its limit (limits.volumes): delete some or raise the limit", e.Max)
}

// RoomFor refuses a new volume when the store is full, counting the
// refusal under the way the volume came (api, claim, adoption).
func (s *Service) RoomFor(via string) error {
	if s.max > 0 && s.store.Len() >= s.max {
		s.Refused.Inc(via)
		return &LimitError{Max: s.max}
	}
	return nil
}

// BeyondLimit tells whether a volume that entered the store without asking
// (a Volume object written with kubectl) is past the limit: volumes are
// counted in creation order, so the first MaxVolumes keep running. The
// list is read only when the store is over the limit.
func (s *Service) BeyondLimit(v *volume.Volume) bool {
	if s.max <= 0 || s.store.Len() <= s.max {
		return false
	}
	earlier := 0
	for _, o := range s.store.List() {
		if o.Spec.Name != v.Spec.Name && (o.CreatedAt.Before(v.CreatedAt) || o.CreatedAt.Equal(v.CreatedAt) && o.Spec.Name < v.Spec.Name) {
			earlier++
		}
	}
	return earlier >= s.max
}

// LimitRefusals count volumes refused over limits.volumes, by the way
// they came: the API or CLI, a claim, a state run to adopt, a Volume object.
type LimitRefusals struct {
	API, Claim, Adoption, Object metrics.Counter
}

// Inc counts one refusal of the named way.
func (l *LimitRefusals) Inc(via string) {
	switch via {
	case "api":
		l.API.Inc()
	case "claim":
		l.Claim.Inc()
	case "adoption":
		l.Adoption.Inc()
	default:
		l.Object.Inc()
	}
}

// Values lists the counters by their via label.
func (l *LimitRefusals) Values() map[string]int64 {
	return map[string]int64{"api": l.API.Value(), "claim": l.Claim.Value(), "adoption": l.Adoption.Value(), "object": l.Object.Value()}
}

// WriteMetrics adds the refusals to an exposition.
func (s *Service) WriteMetrics(mw *metrics.Writer) {
	mw.CounterVec("salt_volumes_volumes_over_limit_total", "Volumes refused because the control plane held limits.volumes, by the way they came: api (API and CLI), claim, adoption (someone else's state run), object (a Volume object).", "via", s.Refused.Values())
}
