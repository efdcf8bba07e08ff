// Package server wires a configuration into a running control plane: store
// (and its leader election), salt-api and request-server clients, event
// source, reconciler, requests, Kubernetes controller and HTTP API.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/api"
	"github.com/salt-volumes/salt-volumes/internal/certs"
	"github.com/salt-volumes/salt-volumes/internal/config"
	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/jobcache"
	"github.com/salt-volumes/salt-volumes/internal/keep"
	"github.com/salt-volumes/salt-volumes/internal/kube"
	"github.com/salt-volumes/salt-volumes/internal/kubeauth"
	"github.com/salt-volumes/salt-volumes/internal/leader"
	"github.com/salt-volumes/salt-volumes/internal/logbridge"
	"github.com/salt-volumes/salt-volumes/internal/metrics"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/saltreq"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// keepEvery is how often usage history and job logs are saved when they
// changed (a crash loses at most this much of them).
const keepEvery = time.Minute

// Run serves until ctx ends. ready, when not nil, gets the bound address
// once the API listens.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger, ui http.Handler, ready func(addr string)) error {
	// client-go's informers and leader election log through klog: into
	// the same JSON lines.
	logbridge.Klog(log)
	st, elector, closeStore, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeStore()
	salt, err := saltapi.New(saltapi.Config{
		URL: cfg.Salt.URL, Username: cfg.Salt.Username, Password: cfg.Salt.Password, Eauth: cfg.Salt.Eauth,
		CAFile: cfg.Salt.CAFile, InsecureSkipVerify: cfg.Salt.InsecureSkipVerify, Log: log.With("component", "salt-api"),
	})
	if err != nil {
		return err
	}
	stats := &events.Stats{}
	var source events.Source
	switch {
	case cfg.PollInterval > 0:
	case cfg.Events.Source == "sse":
		source = &events.SSE{URL: salt.URL(), Client: salt.StreamClient(), Token: salt.Token, Relogin: salt.Login,
			Log: log.With("component", "events"), Stats: stats}
	case cfg.Events.TCP != "":
		source = &events.Bus{Network: "tcp", Addr: cfg.Events.TCP, Log: log.With("component", "events"), Stats: stats, Want: events.Relevant, Lazy: true}
	default:
		source = &events.Bus{Network: "unix", Addr: cfg.Events.Socket, Log: log.With("component", "events"), Stats: stats, Want: events.Relevant, Lazy: true}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var kc *kube.Controller
	if cfg.Kubernetes != nil {
		var leading func() bool
		if elector != nil {
			leading = elector.Leading
		}
		if kc, err = newKube(cfg.Kubernetes, salt, leading, log.With("component", "kubernetes")); err != nil {
			return err
		}
	}
	opt := reconciler.Options{Workers: cfg.Workers, JobTimeout: time.Duration(cfg.JobTimeout), PollInterval: time.Duration(cfg.PollInterval), BatchSize: cfg.BatchSize, MaxVolumes: cfg.Limits.Volumes}
	if kc != nil {
		opt.Kube = kc
	}
	var jobs reconciler.Salt = salt
	var overlay *jobcache.Overlay
	if cfg.Salt.JobCache != "" {
		if st, err := os.Stat(cfg.Salt.JobCache); err != nil || !st.IsDir() {
			log.Warn("salt.jobCache is not a readable directory (yet?): jobs are confirmed through salt-api until it is", "path", cfg.Salt.JobCache)
		}
		overlay = &jobcache.Overlay{Jobs: salt, Dir: cfg.Salt.JobCache, HashType: cfg.Salt.HashType}
		jobs = overlay
	}
	var req *saltreq.Client
	if cfg.Salt.Publish == config.PublishMaster {
		req, err = saltreq.New(saltreq.Config{URL: cfg.Salt.Master, Username: cfg.Salt.Username, Password: cfg.Salt.Password,
			Eauth: cfg.Salt.Eauth, Log: log.With("component", "salt-master")})
		if err != nil {
			return err
		}
		defer req.Close()
		jobs = saltreq.Jobs{Client: req, Lookup: jobs}
		log.Info("jobs are published through the salt master's request server", "master", cfg.Salt.Master)
	}
	rec := reconciler.New(st, jobs, source, opt, log.With("component", "reconciler"))
	records, err := recordsFor(st, cfg)
	if err != nil {
		return err
	}
	// Snapshots: taken by the leader beside the volumes; claims clone
	// from them.
	snaps := &snapshots.Service{Records: records, Salt: jobs, Volumes: st, Log: log.With("component", "snapshots"), JobTimeout: time.Duration(cfg.JobTimeout),
		MinScheduleEvery: time.Duration(cfg.Snapshots.MinScheduleEvery)}
	rec.Snapshots = snaps
	// A clone that became Available frees the snapshot taken for it.
	defer st.Watch(func(ev store.Event) {
		if v := ev.Volume; v != nil && v.Spec.Source != nil && v.Status.Phase == volume.Available {
			snaps.Kick()
		}
	})()
	if kc != nil {
		kc.SetSnapshots(snaps)
	}
	if overlay != nil {
		overlay.Published = rec.Published
	}
	if _, ok := st.(*store.Bolt); ok {
		// One replica on a local store: its memory of usage and jobs is
		// kept beside the store, saved each minute and at shutdown.
		path := filepath.Join(filepath.Dir(cfg.Store), "history.json")
		saved, err := keep.Load(path)
		if err != nil {
			log.Warn("usage history and job logs not restored", "error", err)
		}
		rec.Restore(saved)
		kctx, stopKeep := context.WithCancel(context.Background())
		kept := make(chan struct{})
		go func() { defer close(kept); keep.Run(kctx, path, rec, keepEvery, log.With("component", "keep")) }()
		defer func() { stopKeep(); <-kept }()
	}
	if kc != nil {
		kc.SetVolumes(kubeVolumes{rec.Requests, rec.Touch})
		if err := kc.Start(ctx, time.Duration(cfg.Kubernetes.SyncTimeout)); err != nil {
			kc.Stop()
			return err
		}
		// Before the store closes (deferred earlier, run later).
		defer kc.Stop()
		rc, err := restConfig(cfg.Kubernetes)
		if err != nil {
			return err
		}
		dc, err := dynamic.NewForConfig(rc)
		if err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		leads := func() bool { return true }
		if elector != nil {
			leads = elector.Leading
		}
		disc, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		served := func() bool {
			rl, err := disc.Discovery().ServerResourcesForGroupVersion(kube.SnapshotResource.GroupVersion().String())
			if err != nil {
				return false
			}
			for _, r := range rl.APIResources {
				if r.Name == kube.SnapshotResource.Resource {
					return true
				}
			}
			return false
		}
		so := &kube.SnapshotObjects{Client: dc, Snapshots: snaps, Volumes: st, Claims: kc.Claims(), PVs: kc.PVs(), Leading: leads, Served: served, Log: log.With("component", "volumesnapshots")}
		if err := so.Run(ctx); err != nil {
			return err
		}
		log.Info("kubernetes mode: publishing PersistentVolumes", "storageClass", cfg.Kubernetes.StorageClass, "provisioner", cfg.Kubernetes.Provisioner)
	}
	if ks, ok := st.(*store.Kube); ok && kc != nil {
		// The leader tells what happens to a Volume on the object itself.
		stop := ks.Watch(func(ev store.Event) {
			if elector.Leading() && ev.Volume != nil {
				kc.VolumeEvent(ev, ev.UID)
			}
		})
		defer stop()
	}

	// A follower passes some reads to the leader's advertise URL: over
	// https, trusting tls.caFile when the replicas' CA is a private one.
	var leaderTransport http.RoundTripper
	if cfg.TLS != nil && cfg.TLS.CAFile != "" {
		pool, err := certs.Pool(cfg.TLS.CAFile)
		if err != nil {
			return fmt.Errorf("tls.caFile: %w", err)
		}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		leaderTransport = t
	}
	// The API's watch streams follow the store on every replica.
	hub := store.NewHub()
	defer st.Watch(hub.Publish)()
	// In Kubernetes mode the API server's tokens work too, RBAC on
	// Volume objects deciding each action.
	var kubeAuth api.KubeAuth
	if cfg.Kubernetes != nil {
		rc, err := restConfig(cfg.Kubernetes)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		// Only tokens made for serve (kubectl create token SA --audience
		// salt-volumes), never any pod's or kubeconfig's.
		kubeAuth = &kubeauth.Reviewer{Client: cs, Audiences: cfg.Kubernetes.Audiences}
	}
	tokens := &access.Tokens{Records: records, Bootstrap: cfg.Token}
	audit := &access.Audit{Records: records, Log: log.With("component", "audit"),
		MaxAge: time.Duration(cfg.Audit.MaxAge), MaxEntries: cfg.Audit.MaxEntries}
	if all, err := tokens.List(ctx); err == nil && len(all) == 0 {
		log.Warn("the bootstrap token (config's token) is the only way in: give automation and people their own tokens " +
			"(salt-volumes token create NAME --role viewer|operator|admin) and keep the bootstrap token for recovery")
	}
	srv := &api.Server{
		Requests: rec.Requests, Jobs: rec.Jobs, Health: rec.Nodes, Watch: hub, Store: st, Token: cfg.Token, Nodes: salt.Minions, UI: ui, Log: log.With("component", "api"),
		Tokens: tokens, Audit: audit, Logins: logins(cfg, salt), Kube: kubeAuth, Snapshots: snaps,
		MaxWatchers: cfg.Limits.Watchers, CreatesPerSecond: cfg.Limits.CreatesPerSecond, LeaderTransport: leaderTransport,
		Version: cfg.Version, JobTimeout: time.Duration(cfg.JobTimeout),
		Ready: func() error {
			// Followers read no events: only the leader needs the bus.
			leads := elector == nil || elector.Leading()
			if source != nil && leads && !stats.Connected.Load() {
				return errors.New("event source not connected")
			}
			return nil
		},
		ExtraMetrics: func(w *metrics.Writer) {
			rec.WriteMetrics(w)
			w.Counter("salt_volumes_events_decoded_total", "Events read from the Salt event bus.", stats.Decoded.Load())
			w.Counter("salt_volumes_events_skipped_total", "Events that could not be decoded and were skipped.", stats.Skipped.Load())
			w.Counter("salt_volumes_events_ignored_total", "Events of others (other tags, other functions' job returns) passed over without decoding.", stats.Ignored.Load())
			w.Counter("salt_volumes_event_reconnects_total", "Reconnects of the event source.", stats.Reconnects.Load())
			conn := 0.0
			if stats.Connected.Load() {
				conn = 1
			}
			w.Gauge("salt_volumes_event_source_connected", "1 while the event source is connected.", "", map[string]float64{"": conn})
			w.Counter("salt_volumes_snapshots_taken_total", "Snapshots taken on their nodes.", snaps.Taken.Load())
			w.Counter("salt_volumes_snapshots_deleted_total", "Snapshots deleted on their nodes.", snaps.Deleted.Load())
			w.Counter("salt_volumes_snapshot_failures_total", "Snapshot jobs that failed (the snapshot's message says why).", snaps.Failures.Load())
			if use, err := snaps.PerNode(context.Background()); err == nil {
				count, bytes := map[string]float64{}, map[string]float64{}
				for node, u := range use {
					count[node], bytes[node] = float64(u.Count), float64(u.Allocated)
				}
				w.Gauge("salt_volumes_node_snapshots", "Ready snapshots per node.", "node", count)
				w.Gauge("salt_volumes_node_snapshot_bytes", "Bytes the Ready snapshots really use per node (their images' allocated space).", "node", bytes)
			}
			w.Counter("salt_volumes_saltapi_logins_total", "Logins to salt-api.", int64(salt.LoginCount()))
			if req != nil {
				w.Counter("salt_volumes_master_tokens_total", "Tokens the salt master issued for publishing through its request server.", int64(req.Logins()))
			}
			if kc != nil {
				m := kc.Metrics
				w.Counter("salt_volumes_pvs_created_total", "PersistentVolumes created.", m.PVsCreated.Value())
				w.Counter("salt_volumes_pvs_deleted_total", "PersistentVolumes deleted.", m.PVsDeleted.Value())
				w.Counter("salt_volumes_pv_finalizers_released_total", "PersistentVolumes released after their storage was reclaimed.", m.FinalizersReleased.Value())
				w.Counter("salt_volumes_claims_provisioned_total", "Volumes created for PersistentVolumeClaims.", m.ClaimsProvisioned.Value())
				w.Counter("salt_volumes_claims_refused_total", "PersistentVolumeClaims of our classes that could not be provisioned (see the claim's events).", m.ClaimsRefused.Value())
			}
		},
	}
	if cfg.NonLoopback() && cfg.TLS == nil {
		log.Warn("the API listens beyond loopback without TLS (insecure: true): only a proxy or the network protects the token", "listen", cfg.Listen)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if cfg.TLS != nil {
		reloader, err := certs.NewReloader(cfg.TLS.CertFile, cfg.TLS.KeyFile, log.With("component", "tls"))
		if err != nil {
			ln.Close()
			return err
		}
		tc, err := certs.ServerConfig(reloader, cfg.TLS.ClientCAFile)
		if err != nil {
			ln.Close()
			return err
		}
		ln = tls.NewListener(ln, tc)
	}
	// No WriteTimeout: the watch stream is long-lived and sends heartbeats;
	// an idle keep-alive connection is closed after IdleTimeout.
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	if elector != nil {
		srv.Role = func() api.Role {
			id, url := leader.Describe(elector.Leader())
			return api.Role{Leader: elector.Leading(), LeaderID: id, URL: url}
		}
	}
	recDone := make(chan struct{})
	go func() {
		defer close(recDone)
		if elector == nil {
			rec.Run(ctx)
			return
		}
		elector.lead(ctx, rec)
	}()
	go func() {
		<-ctx.Done()
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		_ = hs.Shutdown(sctx)
	}()
	log.Info("salt-volumes serve listening", "addr", ln.Addr().String(), "tls", cfg.TLS != nil, "store", describeStore(cfg), "events", describe(cfg))
	if ready != nil {
		ready(ln.Addr().String())
	}
	err = hs.Serve(ln)
	cancel()
	<-recDone
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// election is how the replicas of a replicated store pick the one that
// reconciles.
type election struct {
	Leading func() bool
	Leader  func() string
	lead    func(ctx context.Context, rec *reconciler.Reconciler)
}

// openStore opens the configured backend; with etcd or Volume objects, it
// also returns the election that decides which replica reconciles.
func openStore(ctx context.Context, cfg *config.Config, log *slog.Logger) (store.Store, *election, func(), error) {
	if k := cfg.Kubernetes; k != nil && k.VolumeObjects {
		return openKubeStore(ctx, k, log)
	}
	if e := cfg.Etcd; e != nil {
		es, cli, err := store.OpenEtcd(ctx, store.EtcdConfig{Endpoints: e.Endpoints, Prefix: e.Prefix,
			CAFile: e.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile, RequestTimeout: time.Duration(e.RequestTimeout),
			Log: log.With("component", "store"), ClientLog: log.With("component", "etcd-client")})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("store: %w", err)
		}
		for _, bad := range es.Skipped {
			log.Error("store record skipped: it cannot be read; the volume is not managed until it is fixed", "record", bad)
		}
		el := &leader.Elector{Client: cli, Prefix: es.Prefix() + "/leader", TTL: time.Duration(e.SessionTTL),
			ID: e.ReplicaID, URL: e.AdvertiseURL, Log: log.With("component", "election")}
		return es, &election{Leading: el.Leading, Leader: el.Leader, lead: func(ctx context.Context, rec *reconciler.Reconciler) {
			el.Run(ctx, func(tctx context.Context, f *store.Fence) {
				// Act only on everything the predecessor wrote: the cache
				// first catches up with etcd as of this term's start.
				if err := es.WaitRevision(tctx, f.Rev); err != nil {
					return
				}
				rec.Lead(tctx, es.Fenced(f))
			})
		}}, func() { es.Close(); cli.Close() }, nil
	}
	st, err := store.Open(cfg.Store)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, bad := range st.Skipped {
		log.Error("store record skipped: it cannot be read; the volume is not managed until it is fixed or its node reports it again", "store", cfg.Store, "record", bad)
	}
	return st, nil, func() { st.Close() }, nil
}

// openKubeStore opens the Volume objects' store and the Lease election.
func openKubeStore(ctx context.Context, k *config.Kubernetes, log *slog.Logger) (store.Store, *election, func(), error) {
	rc, err := restConfig(k)
	if err != nil {
		return nil, nil, nil, err
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubernetes: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubernetes: %w", err)
	}
	ks, err := store.OpenKube(ctx, store.KubeConfig{Client: dc, Log: log.With("component", "store")})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("store: %w", err)
	}
	for _, bad := range ks.Skipped {
		log.Error("Volume object skipped: it cannot be read; the volume is not managed until it is fixed", "record", bad)
	}
	el := &leader.Lease{Client: cs, Namespace: k.Namespace, Duration: time.Duration(k.LeaseDuration),
		ID: k.ReplicaID, URL: k.AdvertiseURL, Log: log.With("component", "election")}
	return ks, &election{Leading: el.Leading, Leader: el.Leader, lead: func(ctx context.Context, rec *reconciler.Reconciler) {
		err := el.Run(ctx, func(tctx context.Context, still func() error) {
			// Act only on everything the predecessor wrote.
			if err := ks.CatchUp(tctx); err != nil {
				log.Warn("new term: reading the Volume objects failed; ending the term", "error", err)
				return
			}
			rec.Lead(tctx, ks.Fenced(still))
		})
		if err != nil && ctx.Err() == nil {
			log.Error("leader election cannot run", "error", err)
		}
	}}, func() { ks.Close() }, nil
}

// logins lets people log in with their Salt identity when serve's config
// gives them roles.
func logins(cfg *config.Config, salt *saltapi.Client) *api.Logins {
	a := cfg.Access
	if len(a.Users) == 0 && len(a.Groups) == 0 && a.DefaultRole == "" {
		return nil
	}
	m := access.RoleMap{Users: map[string]access.Role{}, Groups: map[string]access.Role{}, Default: access.Role(a.DefaultRole), Eauth: a.Eauth}
	for k, v := range a.Users {
		m.Users[k] = access.Role(v)
	}
	for k, v := range a.Groups {
		m.Groups[k] = access.Role(v)
	}
	return &api.Logins{People: salt, Roles: m, TTL: time.Duration(a.SessionTTL)}
}

// recordsFor keeps tokens and the audit trail in the volumes' backend;
// beside Volume objects, as Secrets in the control plane's namespace.
func recordsFor(st store.Store, cfg *config.Config) (store.Records, error) {
	if r, ok := st.(store.Records); ok {
		return r, nil
	}
	k := cfg.Kubernetes
	rc, err := restConfig(k)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return &store.KubeRecords{Client: cs, Namespace: k.Namespace}, nil
}

func describeStore(cfg *config.Config) string {
	if e := cfg.Etcd; e != nil {
		return fmt.Sprintf("etcd %s%s (replica %s)", strings.Join(e.Endpoints, ","), e.Prefix, e.ReplicaID)
	}
	if k := cfg.Kubernetes; k != nil && k.VolumeObjects {
		return fmt.Sprintf("Volume objects (replica %s, Lease %s/salt-volumes)", k.ReplicaID, k.Namespace)
	}
	return cfg.Store
}

func describe(cfg *config.Config) string {
	switch {
	case cfg.PollInterval > 0:
		return fmt.Sprintf("polling every %s", time.Duration(cfg.PollInterval))
	case cfg.Events.Source == "sse":
		return "salt-api /events"
	case cfg.Events.TCP != "":
		return "tcp " + cfg.Events.TCP
	}
	return cfg.Events.Socket
}
