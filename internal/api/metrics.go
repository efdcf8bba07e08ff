package api

import (
	"bytes"
	"context"
	"net/http"
	"sort"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/health"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Nodes and metrics: what the nodes report, and the Prometheus exposition.

// healthMetrics writes what nodes report: per volume and per node gauges,
// restore counters.
func (s *Server) healthMetrics(mw *metrics.Writer) {
	g := s.Health
	var size, alloc, used, healthy []metrics.Sample
	for _, v := range s.Store.List() {
		l := []string{"volume", v.Spec.Name, "node", v.Spec.Node}
		n := v.Spec.Bytes()
		if v.Status.Size > 0 {
			n = v.Status.Size // what the node prepared: raw volumes have no size of their own
		}
		size = append(size, metrics.Sample{Labels: l, Value: float64(n)})
		h := 0.0
		if v.Status.Phase == volume.Available {
			h = 1
		}
		healthy = append(healthy, metrics.Sample{Labels: l, Value: h})
		if u := g.Usage(v.Spec.Node, v.Spec.UUID); u != nil && u.State != "absent" {
			if v.Spec.SparseLoopDevice != nil {
				alloc = append(alloc, metrics.Sample{Labels: l, Value: float64(u.Allocated)})
			}
			if len(u.Mountpoints) > 0 {
				used = append(used, metrics.Sample{Labels: l, Value: float64(u.FSUsed)})
			}
		}
	}
	mw.GaugeVec("salt_volumes_volume_size_bytes", "Size of each volume: its device as the node prepared it, else the size its spec asks for.", size)
	mw.GaugeVec("salt_volumes_volume_allocated_bytes", "Bytes a sparse volume's file really takes on its node, as the node last reported.", alloc)
	mw.GaugeVec("salt_volumes_volume_filesystem_used_bytes", "Used bytes of a volume's filesystem while it is mounted on its node, as the node last reported.", used)
	mw.GaugeVec("salt_volumes_volume_healthy", "1 if the volume is Available, 0 otherwise (Failed, Locked, Pending, Terminating).", healthy)
	var committed, fsSize, free, silent, ratio, snapWarn, stale, poolData, poolMeta []metrics.Sample
	names := g.Names()
	sort.Strings(names)
	for _, n := range names {
		c, h := g.NodeView(n)
		l := []string{"node", n}
		if h != nil && !h.LastReport.IsZero() {
			v := 0.0
			if h.Silent {
				v = 1
			}
			silent = append(silent, metrics.Sample{Labels: l, Value: v})
		}
		if c != nil {
			committed = append(committed, metrics.Sample{Labels: l, Value: float64(c.Committed)})
			fsSize = append(fsSize, metrics.Sample{Labels: l, Value: float64(c.Size)})
			free = append(free, metrics.Sample{Labels: l, Value: float64(c.Free)})
			ratio = append(ratio, metrics.Sample{Labels: l, Value: c.OvercommitRatio})
			snapWarn = append(snapWarn, metrics.Sample{Labels: l, Value: float64(len(c.SnapshotWarnings))})
			stale = append(stale, metrics.Sample{Labels: l, Value: float64(c.StaleFreezes)})
			for _, p := range c.ThinPools {
				pl := []string{"node", n, "pool", p.Name}
				poolData = append(poolData, metrics.Sample{Labels: pl, Value: p.DataPercent})
				poolMeta = append(poolMeta, metrics.Sample{Labels: pl, Value: p.MetadataPercent})
			}
		}
	}
	mw.GaugeVec("salt_volumes_node_committed_bytes", "Sum of the sizes of a node's sparse volumes (what they may grow to), plus the data their snapshots keep.", committed)
	mw.GaugeVec("salt_volumes_node_size_bytes", "Size of the filesystem holding a node's sparse files.", fsSize)
	mw.GaugeVec("salt_volumes_node_free_bytes", "Free bytes of the filesystem holding a node's sparse files.", free)
	mw.GaugeVec("salt_volumes_node_overcommit_ratio", "The node's overcommit limit: committed may not exceed this times its size.", ratio)
	mw.GaugeVec("salt_volumes_node_snapshot_warnings", "LVM snapshots on a node whose copy-on-write space (or thin pool) is 80 % full or more, or overflowed, as the node last reported.", snapWarn)
	mw.GaugeVec("salt_volumes_node_stale_freezes", "Filesystems of a node's volumes that a snapshot froze and no run or watchdog of ours thawed, as the node last reported: writes there wait until someone thaws them (salt-volume-exec snapshot-delete --thaw-stale).", stale)
	mw.GaugeVec("salt_volumes_node_thin_pool_data_percent", "How full the data of an LVM thin pool holding volumes or snapshots of ours is (0-100), as the node last reported: a full pool stops taking writes.", poolData)
	mw.GaugeVec("salt_volumes_node_thin_pool_metadata_percent", "How full the metadata of an LVM thin pool holding volumes or snapshots of ours is (0-100), as the node last reported: full metadata stops the pool as full data does.", poolMeta)
	mw.GaugeVec("salt_volumes_node_silent", "1 if a node's beacon has been silent for more than three heartbeats.", silent)
	mw.Counter("salt_volumes_node_reports_total", "Health reports received from node beacons.", g.Reports.Value())
	mw.CounterVec("salt_volumes_node_reports_refused_total", "Node reports dropped whole: listing more volumes than a node holds (too_many_volumes), or from a node with no volume here that Salt has not confirmed (unknown_node).", "reason",
		map[string]int64{health.RefusedTooMany: g.RefusedTooMany.Value(), health.RefusedUnknownNode: g.RefusedUnknownNode.Value()})
	mw.CounterVec("salt_volumes_restores_total", "Volumes that restore runs on the nodes rebuilt (reconstructed) or could not rebuild (failed).", "result",
		map[string]int64{"reconstructed": g.Reconstructed.Value(), "failed": g.RestoreFailed.Value()})
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request) {
	byName := map[string]*saltvolumes.Node{}
	get := func(n string) *saltvolumes.Node {
		if byName[n] == nil {
			byName[n] = &saltvolumes.Node{Name: n, Phases: map[string]int{}}
		}
		return byName[n]
	}
	var warn string
	if s.Nodes != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
		up, err := s.Nodes(ctx)
		cancel()
		if err != nil {
			warn = "Salt could not list its minions: " + err.Error()
		}
		for _, n := range up {
			get(n).Up = true
		}
	}
	for _, v := range s.Store.List() {
		n := get(v.Spec.Node)
		n.Volumes++
		n.Phases[v.Status.Phase.String()]++
	}
	for _, name := range s.Health.Names() {
		get(name)
	}
	for name, n := range byName {
		n.Capacity, n.Health = s.Health.NodeView(name)
	}
	items := make([]saltvolumes.Node, 0, len(byName))
	for _, n := range byName {
		items = append(items, *n)
	}
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	out := map[string]any{"items": items}
	if warn != "" {
		out["warning"] = warn
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	mw := metrics.NewWriter(&buf)
	phases := map[string]float64{}
	for _, p := range []volume.Phase{volume.Unknown, volume.Pending, volume.Available, volume.Failed, volume.Terminating, volume.Locked} {
		phases[p.String()] = 0
	}
	for _, v := range s.Store.List() {
		phases[v.Status.Phase.String()]++
	}
	mw.Gauge("salt_volumes_volumes", "Volumes by phase.", "phase", phases)
	s.healthMetrics(mw)
	s.scheduleMetrics(r, mw)
	mw.Gauge("salt_volumes_watchers", "Open watch streams.", "", map[string]float64{"": float64(s.Watch.Watchers())})
	mw.Counter("salt_volumes_api_unauthenticated_total", "API requests refused for a missing, wrong, revoked or expired token.", s.refused.Load())
	mw.Counter("salt_volumes_logins_refused_total", "Logins refused: a wrong user, password or eauth, or a Salt user with no role here.", s.loginsRefused.Load())
	leader := 1.0
	if s.Role != nil && !s.Role().Leader {
		leader = 0
	}
	mw.Gauge("salt_volumes_leader", "1 on the replica that reconciles (the elected leader, or the only control plane), 0 on followers.", "", map[string]float64{"": leader})
	if s.ExtraMetrics != nil {
		s.ExtraMetrics(mw)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write(buf.Bytes())
}
