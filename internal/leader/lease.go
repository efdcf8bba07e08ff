package leader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Lease elects the replica that reconciles with a Kubernetes Lease
// (client-go's leaderelection), for control planes whose volumes are
// Volume objects: the store and the election live in the same API server.
type Lease struct {
	Client    kubernetes.Interface
	Namespace string
	// Name is the Lease's (default salt-volumes).
	Name string
	// Duration is how long the Lease lasts unrenewed (at least 3s): a
	// leader that stops renewing is replaced this long after its last
	// renewal. It renews within two thirds of it or steps down.
	Duration time.Duration
	// ID and URL name this replica to the others.
	ID, URL string
	Log     *slog.Logger

	leading atomic.Bool
	leader  atomic.Value // string: the current holder's "ID URL"
}

// Leading reports whether this replica leads now.
func (l *Lease) Leading() bool { return l.leading.Load() }

// Leader names the leader as last seen ("" when none was seen).
func (l *Lease) Leader() string {
	s, _ := l.leader.Load().(string)
	return s
}

// Run campaigns until ctx ends. Each time this replica wins, lead runs
// with a context that ends with the term, and still, which its writes
// call first: it fails once the term ended or the Lease was not renewed
// for the renew deadline (so a paused leader stops writing before anyone
// else may take the Lease). lead returns before a next term starts.
func (l *Lease) Run(ctx context.Context, lead func(ctx context.Context, still func() error)) error {
	if l.Log == nil {
		l.Log = slog.New(slog.DiscardHandler)
	}
	if l.Name == "" {
		l.Name = "salt-volumes"
	}
	d := max(l.Duration, 3*time.Second)
	renew, retry := d*2/3, d/5
	// The incarnation tells this process from an earlier one of the same
	// replica (a container the kubelet restarted, same host and port) and
	// from a replica configured with the same id by mistake: to
	// client-go, a Lease holder of our identity is us, and it would take
	// the Lease over at once, with the old holder perhaps still writing.
	id := l.ID + " " + l.URL + " " + incarnation()
	for ctx.Err() == nil {
		var le *leaderelection.LeaderElector
		// le.Run tells of a term from a goroutine of its own and returns
		// without waiting for it: the term runs here instead, so that it
		// has ended before this replica campaigns again.
		terms := make(chan context.Context, 1)
		cfg := leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Name: l.Name, Namespace: l.Namespace},
				Client:     l.Client.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: id},
			},
			LeaseDuration: d, RenewDeadline: renew, RetryPeriod: retry,
			// A successor need not wait for the Lease to run out.
			ReleaseOnCancel: true,
			Name:            l.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(tctx context.Context) { terms <- tctx },
				OnStoppedLeading: func() {},
				OnNewLeader:      func(holder string) { l.leader.Store(holder) },
			},
		}
		var err error
		if le, err = leaderelection.NewLeaderElector(cfg); err != nil {
			return err
		}
		still := func(tctx context.Context) func() error {
			return func() error {
				if tctx.Err() != nil {
					return errors.New("the term ended")
				}
				if !le.IsLeader() {
					return errors.New("the Lease names another holder")
				}
				// Past the renew deadline since the last renewal: the
				// Lease may be about to go to another replica.
				return le.Check(renew - d)
			}
		}
		rctx, stop := context.WithCancel(ctx)
		runDone := make(chan struct{})
		go func() {
			defer close(runDone)
			le.Run(rctx)
		}()
		select {
		case tctx := <-terms:
			l.leading.Store(true)
			l.Log.Info("leading: this replica reconciles", "replica", l.ID, "lease", l.Namespace+"/"+l.Name)
			lead(tctx, still(tctx))
			l.leading.Store(false)
			l.Log.Info("leadership ended", "replica", l.ID)
		case <-runDone:
		}
		// A term that ended on its own (a fenced write) gives the Lease
		// up too.
		stop()
		<-runDone
	}
	return ctx.Err()
}

func incarnation() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
