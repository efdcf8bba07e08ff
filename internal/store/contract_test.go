package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/salt-volumes/salt-volumes/internal/volume"
	"github.com/salt-volumes/salt-volumes/test/etcdcluster"
	"github.com/salt-volumes/salt-volumes/test/testcerts"
)

// backends opens a fresh store of each backend for one test. The etcd one
// runs against a real one-member cluster (started once per package run).
func backends(t *testing.T) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"bbolt": func(t *testing.T) Store {
			s, err := Open(filepath.Join(t.TempDir(), "v.db"))
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			return s
		},
		"etcd": func(t *testing.T) Store {
			return openTestEtcd(t, testPrefix(t))
		},
		"kubernetes": func(t *testing.T) Store {
			return openTestKube(t)
		},
	}
}

var (
	etcdOnce sync.Once
	etcdC    *etcdcluster.Cluster
	etcdErr  error
	etcdDir  string
)

// testCluster is one etcd member shared by this package's tests, each on
// its own key prefix.
func testCluster(t *testing.T) *etcdcluster.Cluster {
	t.Helper()
	etcdOnce.Do(func() {
		bin, err := etcdcluster.Binary("../..")
		if err != nil {
			etcdErr = err
			return
		}
		etcdDir, err = mkdtemp()
		if err != nil {
			etcdErr = err
			return
		}
		etcdC, etcdErr = etcdcluster.Start(context.Background(), etcdDir, bin, 1)
	})
	require.NoError(t, etcdErr, "the etcd contract tests need etcd (make setup builds it)")
	return etcdC
}

func testPrefix(t *testing.T) string { return fmt.Sprintf("/t-%d-%s", time.Now().UnixNano(), t.Name()) }

func openTestEtcd(t *testing.T, prefix string) *Etcd {
	c := testCluster(t)
	s, cli, err := OpenEtcd(context.Background(), EtcdConfig{Endpoints: c.Endpoints, Prefix: prefix, RequestTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close(); cli.Close() })
	return s
}

// eventually waits for the watch of a store to deliver (etcd's is a few
// milliseconds behind; bbolt's is immediate).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, 5*time.Millisecond, what)
}

func TestContract(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			t.Run("create, get, uniqueness of name and uuid", func(t *testing.T) {
				s := open(t)
				a := vol("a")
				require.NoError(t, s.Create(context.Background(), a))
				assert.Positive(t, a.Revision)
				got, err := s.Get("a")
				require.NoError(t, err)
				assert.Equal(t, a, got)
				assert.ErrorIs(t, s.Create(context.Background(), vol("a")), ErrExists)
				b := vol("b")
				b.Spec.UUID = a.Spec.UUID
				var ue *UUIDError
				require.ErrorAs(t, s.Create(context.Background(), b), &ue)
				assert.Equal(t, "a", ue.Owner)
				_, err = s.Get("b")
				assert.ErrorIs(t, err, ErrNotFound, "a refused create leaves nothing")
				assert.Equal(t, []string{"a"}, s.Names())
				assert.Equal(t, 1, s.Len())
			})
			t.Run("a write whose context has ended writes nothing", func(t *testing.T) {
				s := open(t)
				require.NoError(t, s.Create(context.Background(), vol("a")))
				done, cancel := context.WithCancel(context.Background())
				cancel()
				assert.ErrorIs(t, s.Create(done, vol("b")), context.Canceled)
				a, err := s.Get("a")
				require.NoError(t, err)
				a.Status.Phase = volume.Failed
				assert.ErrorIs(t, s.Update(done, a), context.Canceled)
				assert.ErrorIs(t, s.Delete(done, a), context.Canceled)
				got, err := s.Get("a")
				require.NoError(t, err)
				assert.Equal(t, volume.Unknown, got.Status.Phase)
				assert.Equal(t, []string{"a"}, s.Names())
			})
			t.Run("updates are guarded by the revision read", func(t *testing.T) {
				s := open(t)
				require.NoError(t, s.Create(context.Background(), vol("a")))
				first, _ := s.Get("a")
				second, _ := s.Get("a")
				first.Status.Phase = volume.Pending
				require.NoError(t, s.Update(context.Background(), first))
				assert.Greater(t, first.Revision, second.Revision)
				second.Status.Phase = volume.Failed
				err := s.Update(context.Background(), second)
				var ce *ConflictError
				require.ErrorAs(t, err, &ce)
				assert.ErrorIs(t, err, ErrConflict)
				require.NotNil(t, ce.Current)
				assert.Equal(t, volume.Pending, ce.Current.Status.Phase, "the conflict says what the store holds")
				assert.Equal(t, first.Revision, ce.Current.Revision)
				got, _ := s.Get("a")
				assert.Equal(t, volume.Pending, got.Status.Phase, "the stale write changed nothing")
			})
			t.Run("deletes are guarded and free the uuid", func(t *testing.T) {
				s := open(t)
				a := vol("a")
				require.NoError(t, s.Create(context.Background(), a))
				stale := a.Clone()
				a.Status.Phase = volume.Available
				require.NoError(t, s.Update(context.Background(), a))
				assert.ErrorIs(t, s.Delete(context.Background(), stale), ErrConflict)
				require.NoError(t, s.Delete(context.Background(), a))
				_, err := s.Get("a")
				assert.ErrorIs(t, err, ErrNotFound)
				var ce *ConflictError
				require.ErrorAs(t, s.Update(context.Background(), a), &ce)
				assert.Nil(t, ce.Current, "updating a deleted volume is a conflict with nothing")
				again := vol("other")
				again.Spec.UUID = a.Spec.UUID
				require.NoError(t, s.Create(context.Background(), again), "a deleted volume's uuid is free")
			})
			t.Run("watch sends every change in order", func(t *testing.T) {
				s := open(t)
				var mu sync.Mutex
				var got []string
				stop := s.Watch(func(ev Event) {
					mu.Lock()
					defer mu.Unlock()
					prev := "-"
					if ev.Prev != nil {
						prev = ev.Prev.Status.Phase.String()
					}
					got = append(got, fmt.Sprintf("%s %s %s<-%s", ev.Type, ev.Volume.Spec.Name, ev.Volume.Status.Phase, prev))
				})
				defer stop()
				a := vol("a")
				require.NoError(t, s.Create(context.Background(), a))
				a.Status.Phase = volume.Pending
				require.NoError(t, s.Update(context.Background(), a))
				a.Status.Phase = volume.Available
				require.NoError(t, s.Update(context.Background(), a))
				require.NoError(t, s.Delete(context.Background(), a))
				want := []string{"ADDED a Unknown<--", "MODIFIED a Pending<-Unknown", "MODIFIED a Available<-Pending", "DELETED a Available<-Available"}
				eventually(t, "four events", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 4 })
				time.Sleep(50 * time.Millisecond) // nothing more, nothing twice
				mu.Lock()
				defer mu.Unlock()
				assert.Equal(t, want, got)
			})
			t.Run("concurrent creates of one name and of one uuid: one wins each", func(t *testing.T) {
				s := open(t)
				var wg sync.WaitGroup
				var mu sync.Mutex
				names, uuids := 0, 0
				for i := range 10 {
					wg.Add(2)
					go func() {
						defer wg.Done()
						if s.Create(context.Background(), vol("same")) == nil {
							mu.Lock()
							names++
							mu.Unlock()
						}
					}()
					go func() {
						defer wg.Done()
						v := vol(fmt.Sprintf("u-%d", i))
						v.Spec.UUID = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
						err := s.Create(context.Background(), v)
						var ue *UUIDError
						if err != nil && !errors.As(err, &ue) {
							t.Error(err)
						}
						if err == nil {
							mu.Lock()
							uuids++
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				assert.Equal(t, 1, names)
				assert.Equal(t, 1, uuids)
			})
		})
	}
}

func mkdtemp() (string, error) { return os.MkdirTemp("", "store-etcd") }

func TestMain(m *testing.M) {
	code := m.Run()
	if etcdC != nil {
		etcdC.Stop()
		os.RemoveAll(etcdDir)
	}
	if kubeC != nil {
		kubeC.Stop()
		os.RemoveAll(kubeC.Dir)
	}
	os.Exit(code)
}

// Two replicas on one prefix: each sees the other's writes through its
// watch; a new leader can wait for its cache to catch up with a revision
// written outside the volumes' prefix; a fenced writer whose leader key is
// gone writes nothing and says so.
func TestEtcdReplicasAndFence(t *testing.T) {
	prefix := testPrefix(t)
	a, b := openTestEtcd(t, prefix), openTestEtcd(t, prefix)
	v := vol("shared")
	require.NoError(t, a.Create(context.Background(), v))
	eventually(t, "b sees a's create", func() bool { got, err := b.Get("shared"); return err == nil && got.Revision == v.Revision })
	got, _ := b.Get("shared")
	got.DeleteRequested = true
	require.NoError(t, b.Update(context.Background(), got))
	eventually(t, "a sees b's update", func() bool { x, _ := a.Get("shared"); return x.DeleteRequested })

	cli, err := testCluster(t).Client()
	require.NoError(t, err)
	defer cli.Close()
	put, err := cli.Put(context.Background(), prefix+"/leader/x", "me")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.WaitRevision(ctx, put.Header.Revision), "a quiet prefix still catches up")

	lost := 0
	w := a.Fenced(&Fence{Key: prefix + "/leader/x", Rev: put.Header.Revision, Lost: func() { lost++ }})
	cur, _ := a.Get("shared")
	cur.Status.Message = "by the leader"
	require.NoError(t, w.Update(context.Background(), cur))
	// The leader's records (snapshots) through the same fence.
	wr, ok := w.(Records)
	require.True(t, ok, "etcd's fenced writer writes records too")
	require.NoError(t, wr.PutRecord(context.Background(), "snapshots", "s1", []byte(`"by the leader"`)))
	_, err = cli.Delete(context.Background(), prefix+"/leader/x")
	require.NoError(t, err)
	assert.ErrorIs(t, wr.PutRecord(context.Background(), "snapshots", "s1", []byte(`"by a deposed leader"`)), ErrFenced)
	assert.ErrorIs(t, wr.DeleteRecord(context.Background(), "snapshots", "s1"), ErrFenced)
	got1, err := a.GetRecord(context.Background(), "snapshots", "s1")
	require.NoError(t, err)
	assert.Equal(t, `"by the leader"`, string(got1), "the deposed leader's record writes changed nothing")
	lost = 0
	stale := cur.Clone()
	cur.Status.Message = "by a deposed leader"
	err = w.Update(context.Background(), cur)
	assert.ErrorIs(t, err, ErrFenced)
	assert.Equal(t, 1, lost)
	assert.ErrorIs(t, w.Create(context.Background(), vol("late")), ErrFenced)
	assert.ErrorIs(t, w.Delete(context.Background(), stale), ErrFenced)
	resp, err := cli.Get(context.Background(), prefix+"/volumes/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "nothing created")
	assert.Equal(t, stale.Revision, resp.Kvs[0].ModRevision, "nothing written after the key went")
}

// A watch that etcd compacted away re-lists and carries on: a replica
// whose member was down while others wrote and etcd compacted catches up.
func TestEtcdCompactedWatchRelists(t *testing.T) {
	prefix := testPrefix(t)
	a := openTestEtcd(t, prefix)
	cli, err := testCluster(t).Client()
	require.NoError(t, err)
	defer cli.Close()
	// Write behind a's back at a revision it has not seen, then compact
	// past it before a's watch can ask for it: simulated by restarting
	// a's watch from an old revision.
	require.NoError(t, a.Create(context.Background(), vol("one")))
	other, cli2, err := OpenEtcd(context.Background(), EtcdConfig{Endpoints: testCluster(t).Endpoints, Prefix: prefix})
	require.NoError(t, err)
	defer func() { other.Close(); cli2.Close() }()
	old := other.seen
	require.NoError(t, other.Close())
	require.NoError(t, a.Create(context.Background(), vol("two")))
	one, _ := a.Get("one")
	require.NoError(t, a.Delete(context.Background(), one))
	resp, err := cli.Get(context.Background(), "/")
	require.NoError(t, err)
	_, err = cli.Compact(context.Background(), resp.Header.Revision)
	require.NoError(t, err)
	wctx, stop := context.WithCancel(context.Background())
	other.stop, other.done = stop, make(chan struct{})
	go other.watch(wctx, old)
	eventually(t, "the re-list brought the cache up to date", func() bool {
		_, errOne := other.Get("one")
		_, errTwo := other.Get("two")
		return errors.Is(errOne, ErrNotFound) && errTwo == nil
	})
}

// bbolt -> etcd -> a new bbolt file: every record the same; a target that
// holds volumes is refused and left alone.
func TestMigrateRoundTrip(t *testing.T) {
	src, err := Open(filepath.Join(t.TempDir(), "old.db"))
	require.NoError(t, err)
	defer src.Close()
	for i := range 25 {
		v := vol(fmt.Sprintf("m-%02d", i))
		v.Status.Phase, v.Status.JobID, v.DeleteRequested = volume.Available, fmt.Sprint(i), i%5 == 0
		require.NoError(t, src.Create(context.Background(), v))
	}
	mid := openTestEtcd(t, testPrefix(t))
	n, err := Migrate(context.Background(), src, mid)
	require.NoError(t, err)
	assert.Equal(t, 25, n)
	back, err := Open(filepath.Join(t.TempDir(), "new.db"))
	require.NoError(t, err)
	defer back.Close()
	n, err = Migrate(context.Background(), mid, back)
	require.NoError(t, err)
	assert.Equal(t, 25, n)
	require.NoError(t, Verify(src, back))

	_, err = Migrate(context.Background(), src, mid)
	require.ErrorContains(t, err, "the target already holds 25 volumes")
	assert.Equal(t, 25, mid.Len())
	// Verify catches a difference.
	v, _ := back.Get("m-03")
	v.Status.Message = "changed"
	require.NoError(t, back.Update(context.Background(), v))
	require.ErrorContains(t, Verify(src, back), `volume "m-03" differs`)
}

// etcd with TLS and client certificates, as the operations guide deploys
// it: the configured CA and client certificate reach it; without the client
// certificate, or trusting another CA, opening fails with an error that
// names etcd, and nothing is written.
func TestEtcdTLS(t *testing.T) {
	bin, err := etcdcluster.Binary("../..")
	require.NoError(t, err)
	ec, err := etcdcluster.StartTLS(context.Background(), filepath.Join(t.TempDir(), "etcd"), bin, 1)
	require.NoError(t, err)
	defer ec.Stop()
	cfg := EtcdConfig{Endpoints: ec.Endpoints, Prefix: "/tls", CAFile: ec.CAFile, CertFile: ec.CertFile, KeyFile: ec.KeyFile}
	s, cli, err := OpenEtcd(context.Background(), cfg)
	require.NoError(t, err)
	require.NoError(t, s.Create(context.Background(), vol("over-tls")))
	s.Close()
	cli.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	noCert := cfg
	noCert.CertFile, noCert.KeyFile = "", ""
	_, _, err = OpenEtcd(ctx, noCert)
	require.Error(t, err, "a client without a certificate is refused")
	assert.Contains(t, err.Error(), "etcd")

	other, err := testcerts.NewCA("another CA")
	require.NoError(t, err)
	wrongCA := cfg
	wrongCA.CAFile = filepath.Join(t.TempDir(), "other.crt")
	require.NoError(t, other.WriteCA(wrongCA.CAFile))
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	_, _, err = OpenEtcd(ctx2, wrongCA)
	require.Error(t, err, "a server whose certificate another CA signed is not trusted")

	half := cfg
	half.KeyFile = ""
	_, _, err = OpenEtcd(context.Background(), half)
	require.ErrorContains(t, err, "certFile and keyFile go together")
}

// A store records its format when first opened; a store of a newer format
// (a downgrade) is refused at open with a message that says so, and is
// left exactly as it was.
func TestNewerStoreFormatRefused(t *testing.T) {
	t.Run("bbolt", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "v.db")
		s, err := Open(path)
		require.NoError(t, err)
		require.NoError(t, s.Create(context.Background(), vol("kept")))
		require.NoError(t, s.db.Update(func(tx *bbolt.Tx) error {
			m := tx.Bucket(meta)
			assert.Equal(t, "1", string(m.Get([]byte(formatKey))), "recorded at first open")
			return m.Put([]byte(formatKey), []byte("2"))
		}))
		require.NoError(t, s.Close())
		before, err := os.ReadFile(path)
		require.NoError(t, err)

		_, err = Open(path)
		var fe *FormatError
		require.ErrorAs(t, err, &fe)
		assert.Contains(t, err.Error(), "has format 2, newer than this salt-volumes reads (1)")
		after, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, before, after, "the refused store was changed")
	})
	t.Run("etcd", func(t *testing.T) {
		prefix := testPrefix(t)
		s := openTestEtcd(t, prefix)
		require.NoError(t, s.Create(context.Background(), vol("kept")))
		got, err := s.cli.Get(context.Background(), prefix+"/format")
		require.NoError(t, err)
		require.Len(t, got.Kvs, 1)
		assert.Equal(t, "1", string(got.Kvs[0].Value), "recorded at first open")
		_, err = s.cli.Put(context.Background(), prefix+"/format", "2")
		require.NoError(t, err)

		c := testCluster(t)
		_, cli, err := OpenEtcd(context.Background(), EtcdConfig{Endpoints: c.Endpoints, Prefix: prefix, RequestTimeout: 2 * time.Second})
		if cli != nil {
			cli.Close()
		}
		var fe *FormatError
		require.ErrorAs(t, err, &fe)
		assert.Contains(t, err.Error(), "etcd "+prefix+" has format 2")
		vols, err := s.cli.Get(context.Background(), prefix+"/volumes/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		assert.EqualValues(t, 1, vols.Count, "the volumes are left alone")
	})
}
