package store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/salt-volumes/salt-volumes/internal/logbridge"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// EtcdConfig says how to reach etcd.
type EtcdConfig struct {
	Endpoints []string
	// Prefix roots every key of ours (default "/salt-volumes"): several
	// installations can share one etcd.
	Prefix string
	// TLS client certificate, key and the CA that signed etcd's.
	CAFile, CertFile, KeyFile string
	// RequestTimeout bounds one write (default 5s): past it, without
	// quorum, the write fails with ErrUnavailable.
	RequestTimeout time.Duration
	Log            *slog.Logger
	// ClientLog takes the etcd client's own logs (its retries, balancer
	// and keep-alive), bridged from zap; nil leaves the client's default.
	ClientLog *slog.Logger
}

// Etcd is the replicated backend. Every replica keeps the whole set of
// volumes in memory, fed by one watch on the volumes' prefix; its own writes
// enter the cache as soon as etcd has them, so a writer reads back what it
// wrote.
//
// Keys: <prefix>/volumes/<name> holds the volume's JSON (the same record the
// bbolt backend stores); <prefix>/uuids/<uuid> holds the owner's name, so
// that a create can check both in one transaction. A key's ModRevision is
// the volume's Revision.
type Etcd struct {
	cli     *clientv3.Client
	prefix  string
	timeout time.Duration
	log     *slog.Logger
	stop    context.CancelFunc
	done    chan struct{}

	revCache // wctx is under its lock too
	// wctx is the current watch's context: a progress request must carry
	// it to reach that watch's stream.
	wctx context.Context
	// Skipped lists records that could not be read (reported, left alone).
	Skipped []string
}

// OpenEtcd connects, loads every volume and starts the watch. The client
// is the caller's to close after the store (the leader election shares it).
func OpenEtcd(ctx context.Context, cfg EtcdConfig) (*Etcd, *clientv3.Client, error) {
	cli, err := NewEtcdClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	s, err := openEtcd(ctx, cli, cfg)
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	return s, cli, nil
}

// NewEtcdClient builds a client from the config (TLS when files are given).
func NewEtcdClient(cfg EtcdConfig) (*clientv3.Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("store.etcd.endpoints: name at least one etcd member (https://host:2379)")
	}
	cc := clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, DialKeepAliveTime: 5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second, AutoSyncInterval: time.Minute}
	if cfg.ClientLog != nil {
		cc.Logger = logbridge.Zap(cfg.ClientLog)
	}
	if cfg.CertFile != "" || cfg.CAFile != "" {
		tc, err := etcdTLS(cfg)
		if err != nil {
			return nil, err
		}
		cc.TLS = tc
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}

func etcdTLS(cfg EtcdConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("store.etcd.caFile: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("store.etcd.caFile %s: no PEM certificate in it", cfg.CAFile)
		}
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("store.etcd: certFile and keyFile go together: give both or neither")
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("store.etcd.certFile/keyFile: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func openEtcd(ctx context.Context, cli *clientv3.Client, cfg EtcdConfig) (*Etcd, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "/salt-volumes"
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Etcd{cli: cli, prefix: strings.TrimSuffix(cfg.Prefix, "/"), timeout: cfg.RequestTimeout, log: cfg.Log,
		revCache: newRevCache(), done: make(chan struct{})}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.format(lctx); err != nil {
		return nil, err
	}
	rev, err := s.relist(lctx)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go s.watch(wctx, rev)
	return s, nil
}

// format records this build's format under the prefix if none is, and
// refuses a newer one (format.go).
func (s *Etcd) format(ctx context.Context) error {
	k := s.prefix + "/" + formatKey
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, strconv.Itoa(Format))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return unavailable("reading the store's format", err)
	}
	if resp.Succeeded {
		return nil
	}
	var stored string
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		stored = string(kvs[0].Value)
	}
	return checkFormat("etcd "+s.prefix, stored)
}

func (s *Etcd) volKey(name string) string  { return s.prefix + "/volumes/" + name }
func (s *Etcd) uuidKey(uuid string) string { return s.prefix + "/uuids/" + uuid }

// Prefix is the key prefix (the leader election lives under it too).
func (s *Etcd) Prefix() string { return s.prefix }

// Close stops the watch (the client stays the caller's).
func (s *Etcd) Close() error {
	s.stop()
	<-s.done
	return nil
}

// relist reads every volume at one revision and makes the cache say the
// same, sending the differences to watchers. Returns that revision.
func (s *Etcd) relist(ctx context.Context) (int64, error) {
	resp, err := s.cli.Get(ctx, s.prefix+"/volumes/", clientv3.WithPrefix())
	if err != nil {
		return 0, unavailable("listing volumes", err)
	}
	fresh := make(map[string]*volume.Volume, len(resp.Kvs))
	var skipped []string
	for _, kv := range resp.Kvs {
		name := strings.TrimPrefix(string(kv.Key), s.prefix+"/volumes/")
		v, err := decodeRecord(name, kv.Value)
		if err != nil {
			skipped = append(skipped, err.Error())
			continue
		}
		v.Revision = kv.ModRevision
		fresh[name] = v
	}
	s.mu.Lock()
	defer s.unlockAndSend()
	s.Skipped = skipped
	rev := resp.Header.Revision
	s.resync(fresh, rev, func(v *volume.Volume) { s.put(v, "") }, func(name string) { s.drop(name, rev, "") })
	return rev, nil
}

// watch follows the volumes' prefix from rev+1. A compacted or broken watch
// re-lists and carries on; a member that lost its leader cancels the watch
// (WithRequireLeader), so a partitioned member is not followed silently.
func (s *Etcd) watch(ctx context.Context, rev int64) {
	defer close(s.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		s.mu.Lock()
		s.wctx = wctx
		s.mu.Unlock()
		ch := s.cli.Watch(wctx, s.prefix+"/volumes/", clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
		broken := false
		for resp := range ch {
			if resp.CompactRevision != 0 || resp.Err() != nil {
				s.log.Warn("etcd watch ended; listing again", "compactRevision", resp.CompactRevision, "error", resp.Err())
				broken = true
				break
			}
			backoff = 100 * time.Millisecond
			s.mu.Lock()
			for _, ev := range resp.Events {
				s.applyEvent(ev)
			}
			s.advance(resp.Header.Revision)
			s.unlockAndSend()
			rev = max(rev, resp.Header.Revision)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if !broken {
			s.log.Warn("etcd watch closed; listing again")
		}
		for ctx.Err() == nil {
			lctx, c := context.WithTimeout(ctx, 10*time.Second)
			r, err := s.relist(lctx)
			c()
			if err == nil {
				rev = r
				break
			}
			s.log.Warn("etcd: listing volumes failed; retrying", "error", err, "in", backoff)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

func (s *Etcd) applyEvent(ev *clientv3.Event) {
	name := strings.TrimPrefix(string(ev.Kv.Key), s.prefix+"/volumes/")
	if ev.Type == mvccpb.DELETE {
		s.drop(name, ev.Kv.ModRevision, "")
		return
	}
	v, err := decodeRecord(name, ev.Kv.Value)
	if err != nil {
		s.log.Error("etcd: a volume record cannot be read; it is not managed until it is fixed", "key", string(ev.Kv.Key), "error", err)
		return
	}
	v.Revision = ev.Kv.ModRevision
	s.put(v, "")
}

// WaitRevision returns once the cache reflects etcd at rev or later: a new
// leader waits for it before reconciling, so that it acts on everything
// its predecessor wrote.
func (s *Etcd) WaitRevision(ctx context.Context, rev int64) error {
	for tries := 0; ; tries++ {
		s.mu.RLock()
		seen, moved, wctx := s.seen, s.moved, s.wctx
		s.mu.RUnlock()
		if seen >= rev {
			return nil
		}
		if tries > 0 && tries%10 == 0 {
			// No progress notice came (a watch being re-established):
			// read everything instead.
			if _, err := s.relist(ctx); err != nil {
				s.log.Warn("etcd: catching up by listing failed", "error", err)
			}
			continue
		}
		// A quiet prefix sends no events: ask for a progress notice.
		if wctx != nil {
			_ = s.cli.RequestProgress(wctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-moved:
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Create adds v unless its name or uuid is taken.
func (s *Etcd) Create(ctx context.Context, v *volume.Volume) error { return s.create(ctx, v, nil) }

// Update writes v if etcd still holds it at v.Revision.
func (s *Etcd) Update(ctx context.Context, v *volume.Volume) error { return s.update(ctx, v, nil) }

// Delete removes the volume if etcd still holds it at v.Revision.
func (s *Etcd) Delete(ctx context.Context, v *volume.Volume) error { return s.delete(ctx, v, nil) }

// Fence makes writes conditional on a leader key: they happen only while
// Key still exists with CreateRevision Rev. Lost is called (once per
// failed write) when the condition fails.
type Fence struct {
	Key  string
	Rev  int64
	Lost func()
}

// Fenced returns a writer for the leader's reconciler.
func (s *Etcd) Fenced(f *Fence) Writer { return fenced{s, f} }

type fenced struct {
	s *Etcd
	f *Fence
}

func (w fenced) Create(ctx context.Context, v *volume.Volume) error { return w.s.create(ctx, v, w.f) }
func (w fenced) Update(ctx context.Context, v *volume.Volume) error { return w.s.update(ctx, v, w.f) }
func (w fenced) Delete(ctx context.Context, v *volume.Volume) error { return w.s.delete(ctx, v, w.f) }

// The leader's records (snapshots) are fenced like its volumes: a deposed
// leader's late write fails with ErrFenced. Reads need no fence.

func (w fenced) PutRecord(ctx context.Context, kind, key string, data []byte) error {
	if err := checkRecord(kind, key); err != nil {
		return err
	}
	_, err := w.s.txn(ctx, w.f, "writing a "+kind+" record", nil, []clientv3.Op{clientv3.OpPut(w.s.recordKey(kind, key), string(data))}, nil)
	return err
}

func (w fenced) DeleteRecord(ctx context.Context, kind, key string) error {
	if err := checkRecord(kind, key); err != nil {
		return err
	}
	_, err := w.s.txn(ctx, w.f, "deleting a "+kind+" record", nil, []clientv3.Op{clientv3.OpDelete(w.s.recordKey(kind, key))}, nil)
	return err
}

func (w fenced) GetRecord(ctx context.Context, kind, key string) ([]byte, error) {
	return w.s.GetRecord(ctx, kind, key)
}

func (w fenced) ListRecords(ctx context.Context, kind string) ([]Record, error) {
	return w.s.ListRecords(ctx, kind)
}

func (s *Etcd) create(ctx context.Context, v *volume.Volume, f *Fence) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	vk, uk := s.volKey(v.Spec.Name), s.uuidKey(v.Spec.UUID)
	resp, replayed, err := s.replayable(ctx, f, "creating volume "+v.Spec.Name,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(vk), "=", 0), clientv3.Compare(clientv3.CreateRevision(uk), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(vk, string(data)), clientv3.OpPut(uk, v.Spec.Name)},
		[]clientv3.Op{clientv3.OpGet(vk), clientv3.OpGet(uk)})
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			if replayed && string(kvs[0].Value) == string(data) {
				// The first try went through; its answer was lost.
				s.wrote(v, kvs[0].ModRevision)
				return nil
			}
			return fmt.Errorf("%w: %q", ErrExists, v.Spec.Name)
		}
		owner := "another volume"
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			owner = string(kvs[0].Value)
		}
		return &UUIDError{UUID: v.Spec.UUID, Owner: owner}
	}
	s.wrote(v, resp.Header.Revision)
	return nil
}

func (s *Etcd) update(ctx context.Context, v *volume.Volume, f *Fence) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	vk := s.volKey(v.Spec.Name)
	resp, replayed, err := s.replayable(ctx, f, "saving volume "+v.Spec.Name,
		[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", v.Revision)},
		[]clientv3.Op{clientv3.OpPut(vk, string(data))},
		[]clientv3.Op{clientv3.OpGet(vk)})
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; replayed && len(kvs) > 0 && string(kvs[0].Value) == string(data) {
			s.wrote(v, kvs[0].ModRevision)
			return nil
		}
		return s.conflict(v.Spec.Name, resp)
	}
	s.wrote(v, resp.Header.Revision)
	return nil
}

func (s *Etcd) delete(ctx context.Context, v *volume.Volume, f *Fence) error {
	vk := s.volKey(v.Spec.Name)
	resp, replayed, err := s.replayable(ctx, f, "deleting volume "+v.Spec.Name,
		[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", v.Revision)},
		[]clientv3.Op{clientv3.OpDelete(vk), clientv3.OpDelete(s.uuidKey(v.Spec.UUID))},
		[]clientv3.Op{clientv3.OpGet(vk)})
	if err != nil {
		return err
	}
	if !resp.Succeeded && !(replayed && len(resp.Responses[0].GetResponseRange().Kvs) == 0) {
		return s.conflict(v.Spec.Name, resp)
	}
	rev := resp.Header.Revision
	s.mu.Lock()
	s.drop(v.Spec.Name, rev, "")
	s.tomb(v.Spec.Name, rev)
	s.unlockAndSend()
	v.Revision = rev
	return nil
}

// replayable runs txn and, when etcd could not be reached or did not
// answer in time (a member dying under the request), once more: every
// write here is guarded, so a replay of one that did go through fails its
// guard, and the caller recognises its own write in the Else branch
// (replayed says so).
func (s *Etcd) replayable(ctx context.Context, f *Fence, what string, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, bool, error) {
	resp, err := s.txn(ctx, f, what, cmps, then, els)
	if !errors.Is(err, ErrUnavailable) {
		return resp, false, err
	}
	s.log.Warn("etcd: write not acknowledged; trying once more", "what", what, "error", err)
	resp, err = s.txn(ctx, f, what, cmps, then, els)
	return resp, true, err
}

// txn runs If(cmps) Then(then) Else(els), inside If(fence) when f is set,
// and returns the inner transaction's response.
func (s *Etcd) txn(ctx context.Context, f *Fence, what string, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if f == nil {
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
		if err != nil {
			return nil, unavailable(what, err)
		}
		return resp, nil
	}
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)).
		Then(clientv3.OpTxn(cmps, then, els)).Commit()
	if err != nil {
		return nil, unavailable(what, err)
	}
	if !resp.Succeeded {
		if f.Lost != nil {
			f.Lost()
		}
		return nil, fmt.Errorf("%s: %w (its leader key %s is gone)", what, ErrFenced, f.Key)
	}
	inner := resp.Responses[0].GetResponseTxn()
	// A nested transaction's response carries no header of its own.
	inner.Header = resp.Header
	return (*clientv3.TxnResponse)(inner), nil
}

func (s *Etcd) conflict(name string, resp *clientv3.TxnResponse) error {
	ce := &ConflictError{Name: name}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if cur, err := decodeRecord(name, kvs[0].Value); err == nil {
			cur.Revision = kvs[0].ModRevision
			ce.Current = cur
		}
	}
	return ce
}

// wrote takes a write of ours into the cache at once (the watch brings the
// same revision later and is then ignored).
func (s *Etcd) wrote(v *volume.Volume, rev int64) {
	v.Revision = rev
	s.mu.Lock()
	s.put(v.Clone(), "")
	s.unlockAndSend()
}

func unavailable(what string, err error) error {
	return fmt.Errorf("%s: %w: etcd: %v", what, ErrUnavailable, err)
}
