package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// restoringSalt is a master whose node takes snapshots and restores
// volumes at once, or refuses restores while inUse says so.
type restoringSalt struct {
	mu       sync.Mutex
	n        int
	args     map[string][]any
	inUse    string
	restores []string // the snapshot of each restore job launched
	// holdTakes: a snapshot's job has no return yet (it stays Pending).
	holdTakes bool
	// method is the snapshots' ("" : reflink).
	method string
}

func (f *restoringSalt) LocalAsync(_ context.Context, _, _ string, arg []any, _ map[string]any) (saltapi.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	jid := fmt.Sprint(f.n)
	f.args[jid] = arg
	if arg[0] == "restored" {
		f.restores = append(f.restores, arg[2].(string))
	}
	return saltapi.Job{JID: jid}, nil
}

func (f *restoringSalt) ListJob(_ context.Context, jid string) (saltapi.JobInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	arg := f.args[jid]
	sp := arg[1].(spec.Spec)
	ret := saltapi.MinionReturn{}
	switch {
	case arg[0] == "restored" && f.inUse != "":
		ret.Retcode, ret.Return = 3, json.RawMessage(fmt.Sprintf("%q", f.inUse))
	case arg[0] == "restored":
		ret.Return, _ = json.Marshal(map[string]any{"snapshot": arg[2], "method": "reflink", "sameDevice": true, "took": "0.1s", "volume": map[string]any{"uuid": sp.UUID}})
	case f.holdTakes:
		return saltapi.JobInfo{Known: true}, nil
	default:
		method := f.method
		if method == "" {
			method = "reflink"
		}
		ret.Return, _ = json.Marshal(map[string]any{"name": arg[2], "volumeUUID": sp.UUID, "method": method, "size": sp.Bytes(), "takenAt": time.Now().UTC().Add(-time.Minute)})
	}
	return saltapi.JobInfo{Known: true, Returns: map[string]saltapi.MinionReturn{sp.Node: ret}}, nil
}

func (f *restoringSalt) restored() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.restores...)
}

const (
	otherUID = "9e8d7c6b-0000-4000-8000-000000000002"
	nightly  = "11111111-0000-4000-8000-0000000000aa" // VolumeSnapshot apps/nightly's uid
)

// restoreEnv is a leading controller, its snapshots service with a node
// that answers, the claim apps/data bound to its Available volume, and
// the VolumeSnapshot objects objs (namespace/name -> uid and phase).
type restoreEnv struct {
	c     *Controller
	cs    *fake.Clientset
	snaps *snapshots.Service
	salt  *restoringSalt
	vols  *recVolumes
	objs  map[string]snapshotObject
	mu    sync.Mutex
	// leading, when set (by seed), is the controller's Config.Leading.
	leading func() bool
}

func dataVolume() *volume.Volume {
	v := sourceVolume()
	v.Spec.Name, v.Spec.UUID = claimVolume, uid
	return v
}

func dataClaim(from string, mut ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	return testClaim(append([]func(*corev1.PersistentVolumeClaim){func(p *corev1.PersistentVolumeClaim) {
		p.Spec.VolumeName, p.Status.Phase = claimVolume, corev1.ClaimBound
		if from != "" {
			p.Annotations[AnnRestoreFrom] = from
		}
	}}, mut...)...)
}

func dataPV() *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: claimVolume, Labels: map[string]string{LabelManagedBy: ManagedBy}},
		Spec: corev1.PersistentVolumeSpec{ClaimRef: &corev1.ObjectReference{Namespace: "apps", Name: "data", UID: uid}}}
}

// newRestoreEnv starts the controller on objs (the claim among them).
// Snapshots are taken with take before the claim is created (seed).
func newRestoreEnv(t *testing.T, seed func(e *restoreEnv), objs ...runtime.Object) *restoreEnv {
	t.Helper()
	salt := &restoringSalt{args: map[string][]any{}}
	e := &restoreEnv{salt: salt, objs: map[string]snapshotObject{},
		vols: &recVolumes{vols: map[string]*volume.Volume{claimVolume: dataVolume(), "pvc-" + srcUID: sourceVolume()}}}
	e.snaps = snapService(t)
	e.snaps.Salt = salt
	ctx, cancel := context.WithCancel(context.Background())
	// As in a term: the records written through a fenced store (here
	// the store itself), which the controller asks for (LeadsTerm).
	// The loop is waited for before the store closes.
	done := make(chan struct{})
	go func() { defer close(done); e.snaps.Run(ctx, e.snaps.Records) }()
	t.Cleanup(func() { cancel(); <-done })
	if seed != nil {
		seed(e)
	}
	e.cs = fake.NewSimpleClientset(append(objs, dataPV())...)
	e.c = New(e.cs, Config{StorageClass: "static", Leading: e.leading}, nil)
	e.c.SetVolumes(e.vols)
	e.c.SetSnapshots(e.snaps)
	e.c.snapshotObjects = func(_ context.Context, ns, name string) (snapshotObject, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if o, ok := e.objs[ns+"/"+name]; ok {
			return o, nil
		}
		return snapshotObject{}, errNoObject
	}
	require.NoError(t, e.c.Start(ctx, 10*time.Second))
	t.Cleanup(e.c.Stop)
	return e
}

// take makes VolumeSnapshot ns/name (uid) own a Ready snapshot of v.
func (e *restoreEnv) take(t *testing.T, ns, name, objUID string, v *volume.Volume) string {
	t.Helper()
	ctx := context.Background()
	snapName := SnapshotName(ns, name)
	_, _, err := e.snaps.TakeOwned(ctx, v, snapName, "k8s:volumesnapshot "+ns+"/"+name, 0, snapshots.Owner{Namespace: ns, Name: name, UID: objUID})
	require.NoError(t, err)
	e.snaps.Kick()
	require.Eventually(t, func() bool {
		s, err := e.snaps.Get(ctx, snapName)
		return err == nil && s.Phase == snapshots.Ready
	}, 10*time.Second, 10*time.Millisecond)
	e.mu.Lock()
	e.objs[ns+"/"+name] = snapshotObject{UID: types.UID(objUID), Phase: snapshots.Ready}
	e.mu.Unlock()
	return snapName
}

// raw is the claim's restore status annotation ("" when none).
func (e *restoreEnv) raw(t *testing.T) string {
	t.Helper()
	pvc, err := e.cs.CoreV1().PersistentVolumeClaims("apps").Get(context.Background(), "data", metav1.GetOptions{})
	require.NoError(t, err)
	return pvc.Annotations[AnnRestoreStatus]
}

// status waits for the claim's restore status to reach phase.
func (e *restoreEnv) status(t *testing.T, phase string) RestoreStatus {
	t.Helper()
	var st RestoreStatus
	require.Eventually(t, func() bool {
		pvc, err := e.cs.CoreV1().PersistentVolumeClaims("apps").Get(context.Background(), "data", metav1.GetOptions{})
		if err != nil || pvc.Annotations[AnnRestoreStatus] == "" {
			return false
		}
		st = RestoreStatus{}
		return json.Unmarshal([]byte(pvc.Annotations[AnnRestoreStatus]), &st) == nil && st.Phase == phase
	}, 10*time.Second, 10*time.Millisecond, "restore status %s, last %+v", phase, st)
	// And the controller's cache holds it before the test goes on: the
	// fake clientset, unlike an API server, takes an update made from a
	// stale copy, so a claim queued again before its cache caught up
	// would be answered twice (seen under the race detector's load).
	require.Eventually(t, func() bool {
		pvc, err := e.c.pvcs.PersistentVolumeClaims("apps").Get("data")
		var cached RestoreStatus
		return err == nil && json.Unmarshal([]byte(pvc.Annotations[AnnRestoreStatus]), &cached) == nil && cached.Request == st.Request
	}, 10*time.Second, 10*time.Millisecond, "the controller's cache of the claim holds request %s", st.Request)
	return st
}

// event waits for an Event of that reason on the claim containing msg.
func (e *restoreEnv) event(t *testing.T, reason, msg string) {
	t.Helper()
	var seen []string
	require.Eventually(t, func() bool {
		evs, err := e.cs.CoreV1().Events("apps").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		seen = seen[:0]
		for _, ev := range evs.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			if ev.Reason == reason && ev.InvolvedObject.Name == "data" && strings.Contains(ev.Message, msg) {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "event %s %q among %v", reason, msg, seen)
}

// annotate sets (or, with value "", removes) an annotation of the claim.
func (e *restoreEnv) annotate(t *testing.T, key, value string) {
	t.Helper()
	e.setAnnotation(t, key, value, value == "")
}

// askAgain sets the claim's restore status empty: the request once more.
func (e *restoreEnv) askAgain(t *testing.T) {
	t.Helper()
	e.setAnnotation(t, AnnRestoreStatus, "", false)
}

func (e *restoreEnv) setAnnotation(t *testing.T, key, value string, remove bool) {
	t.Helper()
	ctx := context.Background()
	pvc, err := e.cs.CoreV1().PersistentVolumeClaims("apps").Get(ctx, "data", metav1.GetOptions{})
	require.NoError(t, err)
	if remove {
		delete(pvc.Annotations, key)
	} else {
		pvc.Annotations[key] = value
	}
	_, err = e.cs.CoreV1().PersistentVolumeClaims("apps").Update(ctx, pvc, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// A claim's owner asks with the annotation: the volume is put back to
// the VolumeSnapshot of the claim's namespace once, the outcome on the
// claim; a re-list asks nothing again; another value, or the status
// set empty, is a new request; the status removed (a replace-style sync)
// is written back from the snapshot's record, not asked again.
func TestRestoreOfAClaimOnce(t *testing.T) {
	var first, second string
	e := newRestoreEnv(t, func(e *restoreEnv) {
		first = e.take(t, "apps", "nightly", nightly, dataVolume())
		second = e.take(t, "apps", "hourly", otherUID, dataVolume())
	}, dataClaim("nightly"))

	st := e.status(t, RestoreRestored)
	assert.Equal(t, "nightly", st.From)
	assert.Equal(t, first, st.Snapshot)
	assert.Contains(t, st.Message, "restored (reflink, 0.1s)")
	e.event(t, "Restoring", "putting volume "+claimVolume+" back to VolumeSnapshot nightly")
	e.event(t, "Restored", "put back to VolumeSnapshot nightly")
	snap, err := e.snaps.Get(context.Background(), first)
	require.NoError(t, err)
	assert.Equal(t, restoreBy(dataClaim(""), &st), snap.Restore.RequestedBy, "the request's id is on the snapshot's record")
	assert.Equal(t, types.UID(nightly), st.Object, "the object's uid is in the status")

	// A re-list (a new leader, a resync) asks nothing again.
	e.c.queueAllClaims()
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, []string{first}, e.salt.restored())

	e.annotate(t, AnnRestoreFrom, "hourly")
	require.Eventually(t, func() bool { return len(e.salt.restored()) == 2 }, 10*time.Second, 10*time.Millisecond)
	st = e.status(t, RestoreRestored)
	assert.Equal(t, "hourly", st.From)
	assert.Equal(t, []string{first, second}, e.salt.restored())

	// The same snapshot once more: the status set empty.
	e.askAgain(t)
	require.Eventually(t, func() bool { return len(e.salt.restored()) == 3 }, 10*time.Second, 10*time.Millisecond)
	third := e.status(t, RestoreRestored)
	time.Sleep(300 * time.Millisecond)
	assert.Len(t, e.salt.restored(), 3)

	// The status removed (dropped by a replace-style sync): written back
	// from the snapshot's record, the same request, nothing asked again.
	e.annotate(t, AnnRestoreStatus, "")
	var back RestoreStatus
	require.Eventually(t, func() bool {
		raw := e.raw(t)
		back = RestoreStatus{}
		return raw != "" && json.Unmarshal([]byte(raw), &back) == nil
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, RestoreRestored, back.Phase)
	assert.Equal(t, third.Request, back.Request, "the answered request, written back")
	assert.Contains(t, back.Message, "written back from the control plane's record")
	time.Sleep(300 * time.Millisecond)
	assert.Len(t, e.salt.restored(), 3, "not restored again")
}

// Refused with an Event naming why and the fix, the outcome on the claim,
// nothing asked of the node: another namespace's name, no such object, a
// snapshot of another volume, an object whose snapshot is an earlier
// object's (same name, other uid), a claim not bound.
func TestRestoreRefusals(t *testing.T) {
	for _, c := range []struct {
		name, from string
		seed       func(e *restoreEnv)
		claim      *corev1.PersistentVolumeClaim
		want       string
	}{
		{"another namespace's", "other/nightly", nil, nil, `"other/nightly" is not the name of a VolumeSnapshot`},
		{"another namespace's object by its snapshot's name", SnapshotName("other", "nightly"), func(e *restoreEnv) {
			e.take(t, "other", "nightly", otherUID, dataVolume())
		}, nil, "no VolumeSnapshot " + SnapshotName("other", "nightly") + " in namespace apps"},
		{"no such object", "gone", nil, nil, "no VolumeSnapshot gone in namespace apps"},
		{"another volume's snapshot", "theirs", func(e *restoreEnv) {
			e.take(t, "apps", "theirs", otherUID, sourceVolume())
		}, nil, "VolumeSnapshot theirs is a snapshot of volume pvc-" + srcUID + ", not of this claim's volume " + claimVolume},
		{"an earlier object's snapshot", "nightly", func(e *restoreEnv) {
			e.take(t, "apps", "nightly", otherUID, dataVolume())
			e.objs["apps/nightly"] = snapshotObject{UID: nightly, Phase: snapshots.Failed, Message: "snapshot x exists and belongs to VolumeSnapshot apps/nightly (uid " + otherUID + ")"}
		}, nil, "VolumeSnapshot nightly failed: snapshot x exists and belongs to"},
		{"a thick LVM snapshot, which the restore would use up", "nightly", func(e *restoreEnv) {
			e.salt.mu.Lock()
			e.salt.method = "lvm-thick"
			e.salt.mu.Unlock()
			e.take(t, "apps", "nightly", nightly, dataVolume())
		}, nil, "is a thick LVM snapshot, which a restore in place uses up"},
		{"a claim not bound", "nightly", func(e *restoreEnv) {
			e.take(t, "apps", "nightly", nightly, dataVolume())
		}, dataClaim("nightly", func(p *corev1.PersistentVolumeClaim) { p.Status.Phase = corev1.ClaimPending }),
			"claim data is not bound to its PersistentVolume"},
	} {
		t.Run(c.name, func(t *testing.T) {
			claim := c.claim
			if claim == nil {
				claim = dataClaim(c.from)
			}
			e := newRestoreEnv(t, c.seed, claim)
			st := e.status(t, RestoreRefused)
			assert.Contains(t, st.Message, c.want)
			e.event(t, "RestoreRefused", c.want)
			assert.Empty(t, e.salt.restored(), "nothing asked of the node")
		})
	}
}

// The node refuses a volume in use: the claim says so (the node's
// message names who), once; nothing is retried until the owner asks
// again, after stopping the pods.
func TestRestoreInUseIsAnsweredNotRetried(t *testing.T) {
	var snap string
	e := newRestoreEnv(t, func(e *restoreEnv) {
		snap = e.take(t, "apps", "nightly", nightly, dataVolume())
		e.salt.inUse = "in_use: /dev/loop3 mounted on /var/lib/kubelet/pods/p1/volumes (in the mount namespace of pid 812, sleep)"
	}, dataClaim("nightly"))

	st := e.status(t, RestoreFailed)
	assert.Contains(t, st.Message, "mounted on /var/lib/kubelet/pods/p1/volumes")
	assert.Contains(t, st.Message, "stop the pods that use claim data (scale their workload to 0), then ask again (kubectl annotate --overwrite pvc -n apps data "+AnnRestoreStatus+"=)")
	e.event(t, "RestoreFailed", "in the mount namespace of pid 812, sleep")
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, []string{snap}, e.salt.restored(), "not retried by itself")

	e.salt.mu.Lock()
	e.salt.inUse = ""
	e.salt.mu.Unlock()
	// Removed, the status is written back (the request was answered);
	// set empty, it is asked again.
	e.annotate(t, AnnRestoreStatus, "")
	e.status(t, RestoreFailed)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, []string{snap}, e.salt.restored(), "a status removed is no new request")
	e.askAgain(t)
	require.Eventually(t, func() bool { return len(e.salt.restored()) == 2 }, 10*time.Second, 10*time.Millisecond)
	e.status(t, RestoreRestored)
}

// A restart between the claim's intent and the request asks once; one
// after the request follows it by its id and asks nothing again.
func TestRestoreReplaysByRequestID(t *testing.T) {
	const r1, r2, r3 = "0000000000000001", "0000000000000002", "0000000000000003"
	intent := func(id string, at time.Time) func(*corev1.PersistentVolumeClaim) {
		return func(p *corev1.PersistentVolumeClaim) {
			b, _ := json.Marshal(RestoreStatus{From: "nightly", Phase: RestoreRestoring, Request: id, Snapshot: SnapshotName("apps", "nightly"), Object: nightly, RequestedAt: at})
			p.Annotations[AnnRestoreStatus] = string(b)
		}
	}
	t.Run("intent only: asked now", func(t *testing.T) {
		e := newRestoreEnv(t, func(e *restoreEnv) { e.take(t, "apps", "nightly", nightly, dataVolume()) },
			dataClaim("nightly", intent(r1, time.Now().UTC())))
		st := e.status(t, RestoreRestored)
		assert.Equal(t, r1, st.Request)
		assert.Len(t, e.salt.restored(), 1)
	})
	t.Run("intent only, then withdrawn: nothing asked", func(t *testing.T) {
		e := newRestoreEnv(t, func(e *restoreEnv) { e.take(t, "apps", "nightly", nightly, dataVolume()) },
			dataClaim("", intent(r3, time.Now().UTC())))
		st := e.status(t, RestoreRefused)
		assert.Contains(t, st.Message, "this request was withdrawn before it reached the node")
		assert.Empty(t, e.salt.restored())
	})
	t.Run("intent older than the snapshot of that name: never asked", func(t *testing.T) {
		// The object's snapshot was taken again (a thick one used up, its
		// record gone) after the request: not the one asked for.
		e := newRestoreEnv(t, func(e *restoreEnv) { e.take(t, "apps", "nightly", nightly, dataVolume()) },
			dataClaim("nightly", intent(r1, time.Now().UTC().Add(-time.Hour))))
		st := e.status(t, RestoreFailed)
		assert.Contains(t, st.Message, "after this request")
		assert.Contains(t, st.Message, "look at the volume's data before asking again")
		time.Sleep(200 * time.Millisecond)
		assert.Empty(t, e.salt.restored(), "not asked")
	})
	t.Run("asked before the restart: followed, not asked again", func(t *testing.T) {
		e := newRestoreEnv(t, func(e *restoreEnv) {
			snap := e.take(t, "apps", "nightly", nightly, dataVolume())
			_, started, err := e.snaps.Restore(context.Background(), dataVolume(), snap, restoreBy(dataClaim(""), &RestoreStatus{From: "nightly", Request: r2, Object: nightly}))
			require.NoError(t, err)
			require.True(t, started)
			require.Eventually(t, func() bool {
				s, err := e.snaps.Get(context.Background(), snap)
				return err == nil && s.Restore.Phase == snapshots.Restored
			}, 10*time.Second, 10*time.Millisecond)
		}, dataClaim("nightly", intent(r2, time.Now().UTC().Add(-time.Second))))
		e.status(t, RestoreRestored)
		time.Sleep(300 * time.Millisecond)
		assert.Len(t, e.salt.restored(), 1, "the restore before the restart only")
	})
}

// Only the leader acts: a follower leaves the request alone; once it
// leads, it takes the request on (every claim is looked at then).
func TestRestoreOnlyOnTheLeader(t *testing.T) {
	var leads atomic.Bool
	e := newRestoreEnv(t, func(e *restoreEnv) {
		e.take(t, "apps", "nightly", nightly, dataVolume())
		e.leading = leads.Load
	}, dataClaim("nightly"))
	time.Sleep(500 * time.Millisecond)
	pvc, err := e.cs.CoreV1().PersistentVolumeClaims("apps").Get(context.Background(), "data", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Empty(t, pvc.Annotations[AnnRestoreStatus], "a follower writes nothing")
	assert.Empty(t, e.salt.restored())
	leads.Store(true)
	e.status(t, RestoreRestored)
	assert.Len(t, e.salt.restored(), 1)
}

// A replay is never carried over to another object made under the same
// name: the intent pins the object's uid (an intent without one is not
// the leader's: Refused).
func TestRestoreReplayPinsTheObject(t *testing.T) {
	intent := func(obj types.UID) func(*corev1.PersistentVolumeClaim) {
		return func(p *corev1.PersistentVolumeClaim) {
			b, _ := json.Marshal(RestoreStatus{From: "nightly", Phase: RestoreRestoring, Request: "00000000000000a1", Snapshot: SnapshotName("apps", "nightly"), Object: obj, RequestedAt: time.Now().UTC().Add(-time.Minute)})
			p.Annotations[AnnRestoreStatus] = string(b)
		}
	}
	t.Run("another uid", func(t *testing.T) {
		e := newRestoreEnv(t, func(e *restoreEnv) { e.take(t, "apps", "nightly", otherUID, dataVolume()) }, dataClaim("nightly", intent(nightly)))
		st := e.status(t, RestoreFailed)
		assert.Contains(t, st.Message, "is no longer VolumeSnapshot nightly's (uid "+nightly+")")
		assert.Empty(t, e.salt.restored())
	})
	t.Run("no uid", func(t *testing.T) {
		e := newRestoreEnv(t, func(e *restoreEnv) { e.take(t, "apps", "nightly", nightly, dataVolume()) }, dataClaim("nightly", intent("")))
		st := e.status(t, RestoreRefused)
		assert.Contains(t, st.Message, "is not a status salt-volumes writes")
		assert.Empty(t, e.salt.restored())
	})
}

// A status that is not the leader's (cut short, a request id it never
// makes) is Refused, never a new request; set empty, it asks again.
func TestRestoreUnreadableStatusIsRefused(t *testing.T) {
	for name, raw := range map[string]string{
		"cut short":  `{"from":"nightly","phase":"Restored","request":"0f229a3a2981c5af"`,
		"forged id":  `{"from":"nightly","phase":"Restored","request":"k8s:claim kube-system/etcd"}`,
		"no phase":   `{"from":"nightly","request":"0f229a3a2981c5af"}`,
		"not json":   `Restored`,
		"long value": `{"from":"` + strings.Repeat("n", 300) + `","phase":"Restored","request":"0f229a3a2981c5af"}`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newRestoreEnv(t, func(e *restoreEnv) { e.take(t, "apps", "nightly", nightly, dataVolume()) },
				dataClaim("nightly", func(p *corev1.PersistentVolumeClaim) { p.Annotations[AnnRestoreStatus] = raw }))
			st := e.status(t, RestoreRefused)
			assert.Equal(t, "nightly", st.From)
			assert.Contains(t, st.Message, "ask again by setting it empty (kubectl annotate --overwrite pvc -n apps data "+AnnRestoreStatus+"=)")
			time.Sleep(200 * time.Millisecond)
			assert.Empty(t, e.salt.restored())
			e.askAgain(t)
			e.status(t, RestoreRestored)
			assert.Len(t, e.salt.restored(), 1)
		})
	}
}

// An object not yet Ready, with no snapshot, is waited for, a bounded
// time; a Ready one whose snapshot is gone is Refused at once.
func TestRestoreWaitsABoundedTime(t *testing.T) {
	old := restoreWaitLimit
	restoreWaitLimit = 3 * time.Second
	t.Cleanup(func() { restoreWaitLimit = old })
	e := newRestoreEnv(t, func(e *restoreEnv) {
		e.objs["apps/nightly"] = snapshotObject{UID: nightly, Phase: snapshots.Pending}
	}, dataClaim("nightly"))
	time.Sleep(time.Second)
	assert.Empty(t, e.raw(t), "waited for")
	var st RestoreStatus
	require.Eventually(t, func() bool {
		raw := e.raw(t)
		return raw != "" && json.Unmarshal([]byte(raw), &st) == nil
	}, 15*time.Second, 50*time.Millisecond)
	assert.Equal(t, RestoreRefused, st.Phase)
	assert.Contains(t, st.Message, "VolumeSnapshot nightly's snapshot is still not Ready after 3s")

	e = newRestoreEnv(t, func(e *restoreEnv) {
		e.objs["apps/nightly"] = snapshotObject{UID: nightly, Phase: snapshots.Ready}
	}, dataClaim("nightly"))
	st = e.status(t, RestoreRefused)
	assert.Contains(t, st.Message, "VolumeSnapshot nightly is Ready but its snapshot is gone")
}

// Another job of the volume's snapshots running (a snapshot taken) is a
// wait, not a refusal: the restore runs once it ends.
func TestRestoreWaitsForABusyVolume(t *testing.T) {
	e := newRestoreEnv(t, func(e *restoreEnv) {
		e.take(t, "apps", "nightly", nightly, dataVolume())
		e.salt.mu.Lock()
		e.salt.holdTakes = true
		e.salt.mu.Unlock()
		_, _, err := e.snaps.TakeOwned(context.Background(), dataVolume(), SnapshotName("apps", "hourly"), "k8s:volumesnapshot apps/hourly", 0, snapshots.Owner{Namespace: "apps", Name: "hourly", UID: otherUID})
		require.NoError(t, err)
	}, dataClaim("nightly"))
	st := e.status(t, RestoreRestoring)
	time.Sleep(500 * time.Millisecond)
	assert.Empty(t, e.salt.restored(), "not while the snapshot is taken")
	st2 := e.status(t, RestoreRestoring)
	assert.Equal(t, st.Request, st2.Request)
	e.salt.mu.Lock()
	e.salt.holdTakes = false
	e.salt.mu.Unlock()
	e.snaps.Kick()
	st = e.status(t, RestoreRestored)
	assert.Equal(t, st2.Request, st.Request)
	assert.Len(t, e.salt.restored(), 1)
}

// A long value is quoted cut, and kept cut in the status: the status
// stays small, and answers that very value (not asked again).
func TestRestoreLongValueStatusIsSmall(t *testing.T) {
	from := strings.Repeat("x/", 50_000)
	e := newRestoreEnv(t, nil, dataClaim(from))
	e.status(t, RestoreRefused)
	assert.Less(t, len(e.raw(t)), 2048)
	first := e.status(t, RestoreRefused)
	e.c.queueAllClaims()
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, first, e.status(t, RestoreRefused), "answered once")
}
