// Package health keeps what nodes push about themselves through the
// salt_volumes beacon: per node its last report, capacity and orphans, per
// volume its health and usage, and a day of usage history for the UI's
// chart. It lives in memory: the beacon sends everything again at its next
// heartbeat, so a restarted control plane knows it all within one.
package health

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
)

// Report is one health event of a node.
type Report struct {
	Node string
	// Kind is start, change or heartbeat.
	Kind      string
	Interval  time.Duration
	Heartbeat time.Duration
	Volumes   []saltvolumes.Device
	Capacity  *saltvolumes.Capacity
	// Error: the node could not list its volumes; Volumes says nothing.
	Error    string
	Received time.Time
	// Schedules are the node's Salt snapshot schedules, per volume.
	Schedules []SaltSchedule
}

// Find returns the report's entry for a volume UUID (nil if none).
func (r *Report) Find(uuid string) *saltvolumes.Device {
	for i := range r.Volumes {
		if r.Volumes[i].UUID == uuid && r.Volumes[i].State != "orphan" {
			return &r.Volumes[i]
		}
	}
	return nil
}

// wire is the beacon's payload.
type wire struct {
	Kind      string                `json:"kind"`
	Interval  float64               `json:"interval"`
	Heartbeat float64               `json:"heartbeat"`
	Volumes   []saltvolumes.Device  `json:"volumes"`
	Capacity  *saltvolumes.Capacity `json:"capacity"`
	Error     string                `json:"error"`
	// Read apart: a malformed row never costs the rest of the report.
	Schedules json.RawMessage `json:"snapshotSchedules"`
}

// Parse reads a health event's data; node is the authenticated minion id.
func Parse(node string, data map[string]any, received time.Time) (*Report, error) {
	b, err := json.Marshal(data)
	if err != nil {
		return nil, err
	}
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("health event of %s: %w", node, err)
	}
	if w.Interval <= 0 || w.Heartbeat <= 0 {
		return nil, fmt.Errorf("health event of %s: interval and heartbeat must be positive", node)
	}
	return &Report{
		Node: node, Kind: w.Kind, Volumes: w.Volumes, Capacity: w.Capacity, Error: w.Error, Received: received, Schedules: ownSchedules(ParseSchedules(w.Schedules), w.Volumes),
		Interval:  time.Duration(w.Interval * float64(time.Second)),
		Heartbeat: time.Duration(w.Heartbeat * float64(time.Second)),
	}, nil
}

// Status is the return of salt_volumes.status on a node, read from Salt's
// job cache: the same facts as a beacon report, from a source the master
// authenticated.
type Status struct {
	Volumes     []saltvolumes.Device  `json:"volumes"`
	Capacity    *saltvolumes.Capacity `json:"capacity"`
	LastRestore *Restore              `json:"lastRestore"`
	Schedules   json.RawMessage       `json:"snapshotSchedules"`
}

// Confirmed turns a status into a report, with the beacon's timings from
// the last report of the node (if any).
func (g *Registry) Confirmed(node string, st Status, received time.Time) *Report {
	rep := &Report{Node: node, Kind: "confirmed", Volumes: st.Volumes, Capacity: st.Capacity, Received: received, Schedules: ownSchedules(ParseSchedules(st.Schedules), st.Volumes)}
	g.mu.Lock()
	if n := g.nodes[node]; n != nil && n.last != nil {
		rep.Interval, rep.Heartbeat = n.last.Interval, n.last.Heartbeat
	}
	g.mu.Unlock()
	return rep
}

// Restore is a node's report of its last restore run, with the counts of
// the runs before it (a run may follow another before the control plane
// has read the first).
type Restore struct {
	ID       string    `json:"id"`
	At       time.Time `json:"at"`
	Restored int       `json:"restored"`
	Failed   int       `json:"failed"`
	Earlier  []Restore `json:"earlier"`
}

// A node keeps the counts of its last 8 runs before the last one; more
// from a node are not its own doing.
const keptRestores = 8

// countedRestores bounds the restore ids remembered per node: more than a
// report carries, so an id is never counted twice while the node still
// sends it.
const countedRestores = 32

// History keeps a day of samples per volume, at most one every SampleEvery
// unless the value moved, and at most MaxSamples.
const (
	HistoryWindow = 24 * time.Hour
	SampleEvery   = time.Minute
	MaxSamples    = 1440
)

// SilentAfter is how many heartbeats a node may miss before it is shown
// silent.
const SilentAfter = 3

// MaxReportVolumes bounds the entries (volumes and orphans) of one report:
// any minion can send reports, so one listing thousands of made-up volumes
// is refused whole instead of growing memory.
const MaxReportVolumes = 1024

// Why a report was refused (the reason label of the refused counter).
const (
	RefusedTooMany     = "too_many_volumes"
	RefusedUnknownNode = "unknown_node"
)

// Registry is the control plane's memory of node reports.
type Registry struct {
	mu       sync.Mutex
	nodes    map[string]*node
	history  map[string][]saltvolumes.UsageSample // by volume uuid
	restores map[string][]string                  // node -> restore ids counted, oldest first
	// changed: history moved since the last UsageSnapshot (keep saves it).
	changed bool

	Reports       metrics.Counter
	Reconstructed metrics.Counter
	RestoreFailed metrics.Counter
	// RefusedTooMany and RefusedUnknownNode count reports dropped whole.
	RefusedTooMany, RefusedUnknownNode metrics.Counter
	Now                                func() time.Time
	// Since is when the current term of counting restores started.
	Since time.Time
	// Known, when set, names the volume UUIDs the store holds on a node:
	// history is kept for those only, and a node none of whose volumes
	// the store holds is shown only once Salt confirmed it (a confirmed
	// report, read from the job cache). Unset: every report is taken.
	Known func(node string) map[string]bool
}

type node struct {
	last          *Report
	restored      int
	restoreFailed int
}

// New returns an empty registry.
func New() *Registry {
	return &Registry{nodes: map[string]*node{}, history: map[string][]saltvolumes.UsageSample{}, restores: map[string][]string{}, Now: time.Now, Since: time.Now()}
}

// Record keeps a report and extends the usage history of its volumes. It
// returns why it refused the report ("" when kept): over MaxReportVolumes,
// or an unconfirmed report of a node the control plane does not know.
func (g *Registry) Record(rep *Report) string {
	g.Reports.Inc()
	if len(rep.Volumes) > MaxReportVolumes {
		g.RefusedTooMany.Inc()
		return RefusedTooMany
	}
	if rep.Capacity != nil {
		rep.Capacity.ThinPools = thinPools(rep.Capacity.ThinPools)
		rep.Capacity.VGs = volumeGroups(rep.Capacity.VGs)
		rep.Capacity.Disks = disks(rep.Capacity.Disks)
	}
	var known map[string]bool
	if g.Known != nil {
		known = g.Known(rep.Node)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n := g.nodes[rep.Node]
	if n == nil {
		if g.Known != nil && len(known) == 0 && rep.Kind != "confirmed" {
			g.RefusedUnknownNode.Inc()
			return RefusedUnknownNode
		}
		n = &node{}
		g.nodes[rep.Node] = n
	}
	n.last = rep
	if rep.Error != "" {
		return ""
	}
	cut := rep.Received.Add(-HistoryWindow)
	for _, d := range rep.Volumes {
		if d.UUID == "" || d.State == "orphan" || g.Known != nil && !known[d.UUID] {
			continue
		}
		h := g.history[d.UUID]
		s := saltvolumes.UsageSample{At: rep.Received, Allocated: d.Allocated, FSUsed: d.FSUsed}
		if k := len(h); k > 0 && h[k-1].Allocated == s.Allocated && h[k-1].FSUsed == s.FSUsed && s.At.Sub(h[k-1].At) < SampleEvery {
			continue
		}
		drop := 0
		for drop < len(h) && (h[drop].At.Before(cut) || len(h)-drop >= MaxSamples) {
			drop++
		}
		g.history[d.UUID] = append(h[drop:], s)
		g.changed = true
	}
	return ""
}

// PruneHistory drops the history of every volume keep refuses (at start:
// a saved history may hold volumes deleted since, or a flood's leftovers).
func (g *Registry) PruneHistory(keep func(uuid string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for u := range g.history {
		if !keep(u) {
			delete(g.history, u)
			g.changed = true
		}
	}
}

// UsageSnapshot copies the history, each flat run reduced to its ends (see
// keep.Compact), and tells whether it changed since the last call.
func (g *Registry) UsageSnapshot(compact func([]saltvolumes.UsageSample) []saltvolumes.UsageSample) (map[string][]saltvolumes.UsageSample, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string][]saltvolumes.UsageSample, len(g.history))
	for u, h := range g.history {
		out[u] = compact(h)
	}
	changed := g.changed
	g.changed = false
	return out, changed
}

// RestoreUsage puts back a saved history (at start, before any report),
// dropping what is older than the window.
func (g *Registry) RestoreUsage(saved map[string][]saltvolumes.UsageSample) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cut := g.Now().Add(-HistoryWindow)
	for u, h := range saved {
		if _, ok := g.history[u]; ok {
			continue
		}
		kept := make([]saltvolumes.UsageSample, 0, len(h))
		for _, s := range h {
			if !s.At.Before(cut) {
				kept = append(kept, s)
			}
		}
		if n := len(kept); n > MaxSamples {
			kept = kept[n-MaxSamples:]
		}
		if len(kept) > 0 {
			g.history[u] = kept
		}
	}
}

// CountRestore counts each run of a restore report once (the module and
// the beacon may both send it, and a report carries the runs before it);
// it returns what it added. A node's first report in a term
// (StartCounting) may carry runs that a control plane before this one (a
// restart, another replica's term) counted: of those it counts the last
// run, as it always has, and the earlier ones only if they ran (by the
// node's clock) since the term started.
func (g *Registry) CountRestore(nodeName string, r Restore) (added Counted) {
	g.mu.Lock()
	defer g.mu.Unlock()
	earlier := r.Earlier
	if len(earlier) > keptRestores {
		earlier = earlier[len(earlier)-keptRestores:]
	}
	_, seen := g.restores[nodeName]
	for i, run := range append(append([]Restore{}, earlier...), r) {
		if run.ID == "" || slices.Contains(g.restores[nodeName], run.ID) {
			continue
		}
		ids := append(g.restores[nodeName], run.ID)
		if len(ids) > countedRestores {
			ids = ids[len(ids)-countedRestores:]
		}
		g.restores[nodeName] = ids
		if !seen && i < len(earlier) && run.At.Before(g.Since) {
			continue // remembered, not counted
		}
		// A node can hold no more volumes than a report lists.
		restored, failed := min(max(run.Restored, 0), MaxReportVolumes), min(max(run.Failed, 0), MaxReportVolumes)
		n := g.nodes[nodeName]
		if n == nil {
			n = &node{}
			g.nodes[nodeName] = n
		}
		n.restored += restored
		n.restoreFailed += failed
		g.Reconstructed.Add(int64(restored))
		g.RestoreFailed.Add(int64(failed))
		added.Runs++
		added.Restored += restored
		added.Failed += failed
	}
	return added
}

// StartCounting starts a term of counting restores (a leader's): what the
// registry counted before is forgotten, and a node's first report counts,
// of its runs from before start, only the last.
func (g *Registry) StartCounting(start time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.Since = start
	clear(g.restores)
}

// Counted is what CountRestore added.
type Counted struct{ Runs, Restored, Failed int }

// Forget drops a volume's history (the volume was deleted).
func (g *Registry) Forget(uuid string) {
	g.mu.Lock()
	delete(g.history, uuid)
	g.changed = true
	g.mu.Unlock()
}

// NodeView is what the API shows of a node's reports.
func (g *Registry) NodeView(name string) (*saltvolumes.Capacity, *saltvolumes.NodeHealth) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.nodeView(name)
}

func (g *Registry) nodeView(name string) (*saltvolumes.Capacity, *saltvolumes.NodeHealth) {
	n := g.nodes[name]
	if n == nil {
		return nil, nil
	}
	h := &saltvolumes.NodeHealth{Restored: n.restored, RestoreFailed: n.restoreFailed}
	if n.last == nil {
		return nil, h
	}
	rep := n.last
	h.LastReport, h.Error = rep.Received.UTC(), rep.Error
	h.Interval, h.Heartbeat = rep.Interval.Seconds(), rep.Heartbeat.Seconds()
	h.Silent = g.Now().Sub(rep.Received) > SilentAfter*rep.Heartbeat+rep.Interval
	for _, d := range rep.Volumes {
		if d.State == "orphan" {
			h.Orphans = append(h.Orphans, d)
		}
	}
	var c *saltvolumes.Capacity
	if rep.Capacity != nil {
		cc := *rep.Capacity
		c = &cc
	}
	return c, h
}

// Names lists the nodes that reported.
func (g *Registry) Names() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, 0, len(g.nodes))
	for n := range g.nodes {
		out = append(out, n)
	}
	return out
}

// Usage is a volume's last reported health and usage (nil if its node
// never reported it).
func (g *Registry) Usage(nodeName, uuid string) *saltvolumes.Usage {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := g.nodes[nodeName]
	if n == nil || n.last == nil || n.last.Error != "" {
		return nil
	}
	d := n.last.Find(uuid)
	if d == nil {
		return &saltvolumes.Usage{State: "absent", ReportedAt: n.last.Received.UTC()}
	}
	return &saltvolumes.Usage{
		State: d.State, Size: d.Size, Allocated: d.Allocated, FSUsed: d.FSUsed, FSFree: d.FSFree,
		InUse: d.InUse, Mountpoints: d.Mountpoints, Error: d.Error, ReportedAt: n.last.Received.UTC(),
	}
}

// History returns a volume's samples since a time.
func (g *Registry) History(uuid string, since time.Time) []saltvolumes.UsageSample {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := []saltvolumes.UsageSample{}
	for _, s := range g.history[uuid] {
		if !s.At.Before(since) {
			out = append(out, s)
		}
	}
	return out
}

// MaxThinPools bounds the thin pools kept of one node's report: each is a
// pair of metric series, and a node reports what it likes.
const MaxThinPools = 64

var poolName = regexp.MustCompile(`^[A-Za-z0-9+_][A-Za-z0-9+_.-]{0,127}/[A-Za-z0-9+_][A-Za-z0-9+_.-]{0,127}$`)

// thinPools keeps the reported pools that are an LVM vg/pool name with
// percents between 0 and 100, each name once, at most MaxThinPools.
func thinPools(in []saltvolumes.ThinPool) []saltvolumes.ThinPool {
	var out []saltvolumes.ThinPool
	seen := map[string]bool{}
	for _, p := range in {
		if len(out) == MaxThinPools {
			break
		}
		// One series per pool: a name reported twice keeps its first.
		if !seen[p.Name] && poolName.MatchString(p.Name) && p.DataPercent >= 0 && p.DataPercent <= 100 && p.MetadataPercent >= 0 && p.MetadataPercent <= 100 {
			seen[p.Name] = true
			out = append(out, p)
		}
	}
	return out
}

// MaxVGs and MaxDisks bound the volume groups and candidate disks kept of
// one node's report (the node lists at most 32 of each).
const (
	MaxVGs   = 32
	MaxDisks = 32
)

var (
	vgName   = regexp.MustCompile(`^[A-Za-z0-9+_][A-Za-z0-9+_.-]{0,127}$`)
	diskPath = regexp.MustCompile(`^/dev/[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,127}$`)
)

// volumeGroups keeps the reported volume groups that are an LVM name with
// sizes that add up, each name once, at most MaxVGs: people pick from them.
func volumeGroups(in []saltvolumes.VGSpace) []saltvolumes.VGSpace {
	var out []saltvolumes.VGSpace
	seen := map[string]bool{}
	for _, v := range in {
		if len(out) == MaxVGs {
			break
		}
		if !seen[v.Name] && vgName.MatchString(v.Name) && v.Size > 0 && v.Free >= 0 && v.Free <= v.Size {
			seen[v.Name] = true
			out = append(out, v)
		}
	}
	return out
}

// disks keeps the reported candidate disks that are a plain /dev path with
// a size, each once, at most MaxDisks, their model printable and short.
func disks(in []saltvolumes.Disk) []saltvolumes.Disk {
	var out []saltvolumes.Disk
	seen := map[string]bool{}
	for _, d := range in {
		if len(out) == MaxDisks {
			break
		}
		if seen[d.Path] || !diskPath.MatchString(d.Path) || d.Size <= 0 {
			continue
		}
		seen[d.Path] = true
		d.Model = strings.Map(func(r rune) rune {
			if r < 0x20 || r == 0x7f {
				return -1
			}
			return r
		}, d.Model)
		if len(d.Model) > 64 {
			d.Model = strings.ToValidUTF8(d.Model[:64], "")
		}
		out = append(out, d)
	}
	return out
}
