package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Snapshot schedules: the API's own (one per volume, run by the leader)
// are set and removed through the leader; the listing adds the Salt
// schedules the nodes report, which only the leader hears.
//
// The store's records have no compare-and-swap: a schedule's record is
// read and written under the leader's lock (snapshots.Service.schedMu),
// by its passes and by these requests alike, and the leader's writes are
// fenced on its term. A replica that does not lead (no leader known, or
// one that lost the lead since a follower passed it the request) changes
// no schedule: it answers 503, nothing changed.

// scheduleBody is PUT /api/v1/volumes/{name}/snapshot-schedule's body.
type scheduleBody struct {
	Every  string `json:"every"`
	Keep   int    `json:"keep"`
	MaxAge string `json:"maxAge"`
}

const scheduleUsage = `the body must be {"every": "1h", "keep": 24} and optionally "maxAge": "7d": how often a snapshot is taken, how many of the schedule's own are kept, and the age past which they are pruned`

// readScheduleBody decodes and checks the body's form; the bounds are the
// snapshots service's.
func readScheduleBody(r *http.Request) (snapshots.ScheduleSpec, error) {
	var body scheduleBody
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() {
		field := ""
		if err != nil && strings.Contains(err.Error(), "unknown field") {
			field = strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return snapshots.ScheduleSpec{}, &snapshots.Error{Status: http.StatusBadRequest, Field: field, Msg: fmt.Sprintf("%s: unknown field: %s", field, scheduleUsage)}
		}
		return snapshots.ScheduleSpec{}, &snapshots.Error{Status: http.StatusBadRequest, Field: "every", Msg: scheduleUsage}
	}
	if body.Every == "" {
		return snapshots.ScheduleSpec{}, &snapshots.Error{Status: http.StatusBadRequest, Field: "every", Msg: "every: missing: " + scheduleUsage}
	}
	every, err := snapshots.ParseInterval("every", body.Every)
	if err != nil {
		return snapshots.ScheduleSpec{}, err
	}
	sp := snapshots.ScheduleSpec{Every: every, Keep: body.Keep}
	if body.MaxAge != "" {
		if sp.MaxAge, err = snapshots.ParseInterval("maxAge", body.MaxAge); err != nil {
			return snapshots.ScheduleSpec{}, err
		}
	}
	return sp, nil
}

// scheduleVolume reads the volume a schedule change names and checks that
// the caller may snapshot it (as takeSnapshot: admin for a raw device, the
// caller's scope); false when it answered already.
func (s *Server) scheduleVolume(w http.ResponseWriter, r *http.Request, name string) (*volume.Volume, bool) {
	v, err := s.Store.Get(name)
	if errors.Is(err, store.ErrNotFound) {
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Field: "volume",
			Message: fmt.Sprintf("volume %q not found (salt-volumes ls lists them); nothing was changed", name)})
		return nil, false
	}
	if err != nil {
		storeErr(w, err)
		return nil, false
	}
	n := noteOf(r.Context())
	n.volume, n.uuid, n.node = name, v.Spec.UUID, v.Spec.Node
	if v.Spec.RawBlockDevice != nil && !s.escalate(w, r, access.Admin, "schedule snapshots of a volume on a raw device ("+v.Spec.RawBlockDevice.DevicePath+")") {
		return nil, false
	}
	if !s.inScope(w, r, v.Spec.Node) {
		return nil, false
	}
	return v, true
}

// leadsSchedules answers 503 and false on a replica that does not lead:
// there a schedule's change would race the leader's writes of the same
// record, and one of them be lost.
func (s *Server) leadsSchedules(w http.ResponseWriter) bool {
	if s.Role == nil {
		return true
	}
	role := s.Role()
	if role.Leader {
		return true
	}
	why := "no replica leads now (an election is under way, or the store is out of reach)"
	switch {
	case role.LeaderID != "" && role.URL == "":
		why = fmt.Sprintf("this replica follows %s, which advertises no URL to pass the request to (give the replicas advertiseURLs), or ask it", role.LeaderID)
	case role.LeaderID != "":
		why = fmt.Sprintf("this replica no longer leads (%s does)", role.LeaderID)
	}
	w.Header().Set("Retry-After", "5")
	writeErr(w, http.StatusServiceUnavailable, saltvolumes.Error{Code: saltvolumes.CodeUnavailable,
		Message: "no leader: " + why + ": snapshot schedules are changed by the leading replica only; nothing was changed, try again in a few seconds"})
	return false
}

// setSchedule: PUT /api/v1/volumes/{name}/snapshot-schedule; 201 for a
// new schedule, 200 for a changed one.
func (s *Server) setSchedule(w http.ResponseWriter, r *http.Request) {
	if s.snapshotsOff(w) || !s.leadsSchedules(w) {
		return
	}
	name := r.PathValue("name")
	sp, err := readScheduleBody(r)
	if err != nil {
		snapshotErr(w, name, err)
		return
	}
	v, ok := s.scheduleVolume(w, r, name)
	if !ok {
		return
	}
	sc, created, err := s.Snapshots.SetSchedule(r.Context(), v, sp, requester(r))
	if err != nil {
		snapshotErr(w, name, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	s.Log.Info("snapshot schedule set", "volume", name, "every", sc.Every, "keep", sc.Keep, "maxAge", sc.MaxAge, "by", requester(r))
	writeJSON(w, status, sc)
}

// deleteSchedule: DELETE /api/v1/volumes/{name}/snapshot-schedule; the
// schedule's snapshots stay.
func (s *Server) deleteSchedule(w http.ResponseWriter, r *http.Request) {
	if s.snapshotsOff(w) || !s.leadsSchedules(w) {
		return
	}
	name := r.PathValue("name")
	scheds, err := s.Snapshots.Schedules(r.Context(), name)
	if err != nil {
		storeErr(w, err)
		return
	}
	if len(scheds) == 0 {
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Field: "volume",
			Message: fmt.Sprintf("volume %q has no snapshot schedule of the API (salt-volumes snapshot schedules lists them)", name)})
		return
	}
	n := noteOf(r.Context())
	n.volume, n.uuid, n.node = name, scheds[0].VolumeUUID, scheds[0].Node
	if v, err := s.Store.Get(name); err == nil && v.Spec.UUID == scheds[0].VolumeUUID && v.Spec.RawBlockDevice != nil &&
		!s.escalate(w, r, access.Admin, "remove the snapshot schedule of a volume on a raw device") {
		return
	}
	if !s.inScope(w, r, scheds[0].Node) {
		return
	}
	sc, err := s.Snapshots.Unschedule(r.Context(), name)
	if errors.Is(err, snapshots.ErrNoSchedule) {
		writeErr(w, http.StatusNotFound, saltvolumes.Error{Code: saltvolumes.CodeNotFound, Field: "volume", Message: fmt.Sprintf("volume %q has no snapshot schedule of the API", name)})
		return
	}
	if err != nil {
		storeErr(w, err)
		return
	}
	s.Log.Info("snapshot schedule removed", "volume", name, "by", requester(r))
	writeJSON(w, http.StatusOK, sc)
}

// listSchedules: GET /api/v1/snapshot-schedules[?volume=&source=api|salt]:
// the API's schedules and the nodes' Salt schedules, by volume.
func (s *Server) listSchedules(w http.ResponseWriter, r *http.Request) {
	if s.snapshotsOff(w) {
		return
	}
	q := r.URL.Query()
	vol, source := q.Get("volume"), q.Get("source")
	if source != "" && source != "api" && source != "salt" {
		writeErr(w, http.StatusBadRequest, saltvolumes.Error{Code: saltvolumes.CodeInvalid, Field: "source", Message: "source: " + source + ": give api or salt, or leave it out for both"})
		return
	}
	items, err := s.allSchedules(r, vol, source)
	if err != nil {
		storeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

func (s *Server) allSchedules(r *http.Request, vol, source string) ([]saltvolumes.SnapshotSchedule, error) {
	items := []saltvolumes.SnapshotSchedule{}
	if source != "salt" && s.Snapshots != nil {
		api, err := s.Snapshots.Schedules(r.Context(), vol)
		if err != nil {
			return nil, err
		}
		items = append(items, api...)
	}
	if source != "api" && s.Health != nil {
		byUUID, byName := map[string]*volume.Volume{}, map[string]*volume.Volume{}
		for _, v := range s.Store.List() {
			byUUID[v.Spec.UUID], byName[v.Spec.Name] = v, v
		}
		for _, row := range s.Health.SaltSchedules() {
			if (vol == "" || row.Volume == vol) && saltRowFits(row, byUUID, byName) {
				items = append(items, saltView(row))
			}
		}
	}
	sort.SliceStable(items, func(i, j int) bool {
		if items[i].Volume != items[j].Volume {
			return items[i].Volume < items[j].Volume
		}
		return items[i].Source < items[j].Source
	})
	return items, nil
}

// saltRowFits tells whether a node's row agrees with the store: a volume
// the store holds is reported by its own node under its own name, and no
// row names a volume of the store under another uuid. A node reports
// only its own volumes (health checks that against its report); this
// keeps a minion that lists another node's volume as its own from
// showing (and alerting on) a schedule of it. A volume the store does
// not hold (a pillar one not seen yet) is the node's word.
func saltRowFits(row health.SaltSchedule, byUUID, byName map[string]*volume.Volume) bool {
	if v := byUUID[row.UUID]; v != nil {
		return v.Spec.Node == row.Node && v.Spec.Name == row.Volume
	}
	return byName[row.Volume] == nil
}

// saltView shows a node's row: no interval is reported, so overdue is
// the row's own verdict (its last run failed).
func saltView(row health.SaltSchedule) saltvolumes.SnapshotSchedule {
	return saltvolumes.SnapshotSchedule{Source: "salt", Schedule: row.Schedule, Volume: row.Volume, VolumeUUID: row.UUID, Node: row.Node,
		LastSuccess: row.LastSuccess, LastSnapshot: row.LastSnapshot, Failing: row.Failing, LastError: row.LastError,
		LastErrorAt: row.LastErrorAt, Overdue: row.Failing}
}

// scheduleMetrics writes each schedule's last success and whether it is
// overdue (the Salt ones as far as this replica heard: the leader's).
func (s *Server) scheduleMetrics(r *http.Request, mw *metrics.Writer) {
	items, err := s.allSchedules(r, "", "")
	if err != nil {
		s.Log.Warn("snapshot schedules left out of the metrics", "error", err)
		return
	}
	var last, overdue []metrics.Sample
	for _, sc := range items {
		l := []string{"volume", sc.Volume, "schedule", sc.Schedule, "source", sc.Source, "node", sc.Node}
		if sc.LastSuccess != nil {
			last = append(last, metrics.Sample{Labels: l, Value: float64(sc.LastSuccess.UnixMilli()) / 1000})
		}
		v := 0.0
		if sc.Overdue {
			v = 1
		}
		overdue = append(overdue, metrics.Sample{Labels: l, Value: v})
	}
	mw.GaugeVec("salt_volumes_snapshot_schedule_last_success_timestamp_seconds", "When each snapshot schedule last took a snapshot of its volume (Unix time): the API's schedules (source api) and those Salt's minion scheduler runs (source salt, as the node last reported).", last)
	mw.GaugeVec("salt_volumes_snapshot_schedule_overdue", "1 when a snapshot schedule is late: an API schedule with no success within twice its interval plus a minute; a Salt schedule whose last run failed (the node does not report its interval).", overdue)
}

// scheduleHeld says, for a refused volume deletion, that a schedule of
// the volume takes more snapshots ("": none).
func (s *Server) scheduleHeld(r *http.Request, name string) string {
	scheds, err := s.Snapshots.Schedules(r.Context(), name)
	if err != nil || len(scheds) == 0 {
		return ""
	}
	return fmt.Sprintf("its snapshot schedule (every %s, keep %d) takes more", scheds[0].Every, scheds[0].Keep)
}
