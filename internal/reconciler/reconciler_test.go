package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// fakeSalt is a salt-api stand-in for the phase machine; the real one is
// exercised in test/controlplane.
type fakeSalt struct {
	mu       sync.Mutex
	calls    []call
	n        int
	err      []error // errors for the next launches, in order
	jobs     map[string]saltapi.JobInfo
	onLaunch func(jid string, c call) // runs before LocalAsync answers
}

type call struct {
	Tgt, Fun string
	Arg      []any
	Kwarg    map[string]any
}

// SLS is the formula a salt_volumes.apply_volume call runs.
func (c call) SLS() string {
	if c.Fun != FunApply || len(c.Arg) != 3 {
		return ""
	}
	return "salt_volumes." + c.Arg[0].(string)
}

// Specs are the volumes it runs for, in the order given.
func (c call) Specs() []spec.Spec {
	if c.Fun != FunApply || len(c.Arg) != 3 {
		return nil
	}
	var out []spec.Spec
	for _, s := range c.Arg[1].([]any) {
		out = append(out, s.(spec.Spec))
	}
	return out
}

// Names are their names, sorted.
func (c call) Names() []string {
	var out []string
	for _, s := range c.Specs() {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out
}

// Wipe is its wipe argument.
func (c call) Wipe() bool { return len(c.Arg) == 3 && c.Arg[2] == true }

func (f *fakeSalt) LocalAsync(_ context.Context, tgt, fun string, arg []any, kwarg map[string]any) (saltapi.Job, error) {
	f.mu.Lock()
	c := call{tgt, fun, arg, kwarg}
	f.calls = append(f.calls, c)
	if len(f.err) > 0 {
		err := f.err[0]
		f.err = f.err[1:]
		f.mu.Unlock()
		return saltapi.Job{}, err
	}
	f.n++
	jid := fmt.Sprintf("2026112200000000%04d", f.n)
	hook := f.onLaunch
	f.mu.Unlock()
	if hook != nil {
		hook(jid, c)
	}
	return saltapi.Job{JID: jid, Minions: []string{tgt}}, nil
}

func (f *fakeSalt) ListJob(_ context.Context, jid string) (saltapi.JobInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if info, ok := f.jobs[jid]; ok {
		// A copy, as salt-api's answer is: the test goes on recording
		// returns into its own map.
		info.Returns = maps.Clone(info.Returns)
		return info, nil
	}
	return saltapi.JobInfo{Function: "unknown-function"}, nil
}

func (f *fakeSalt) launches() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// chanSource delivers events sent on ch; it "connects" once.
// chanSource is the event bus of the rig: each event forged is handed to
// the reconciler's Handle, and forge returns once Handle has.
type chanSource struct{ ch chan forged }

type forged struct {
	ev   events.Event
	done chan struct{}
}

func (s *chanSource) Run(ctx context.Context, onConnect func(), handle func(events.Event)) error {
	onConnect()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case f := <-s.ch:
			handle(f.ev)
			close(f.done)
		}
	}
}

type rig struct {
	t     *testing.T
	salt  *fakeSalt
	src   *chanSource
	store *store.Bolt
	r     *Reconciler
	watch <-chan store.Event
	// held keeps changes of other volumes seen while waiting for one, so a
	// test waiting for a second volume still gets changes that came first.
	held map[string][]store.Event
}

func newRig(t *testing.T, opt Options, seed ...*volume.Volume) *rig {
	return newRigWith(t, &fakeSalt{jobs: map[string]saltapi.JobInfo{}}, opt, seed...)
}

func sparseSpec(name string) *spec.Spec {
	u := uuid.NewSHA1(uuid.NameSpaceOID, []byte(name))
	s, err := spec.Parse(strings.NewReader(fmt.Sprintf(`{"name":%q,"uuid":%q,"node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`, name, u)))
	if err != nil {
		panic(err)
	}
	return s
}

// next waits for the named volume's next change.
func (g *rig) next(name string) store.Event {
	g.t.Helper()
	if evs := g.held[name]; len(evs) > 0 {
		g.held[name] = evs[1:]
		return evs[0]
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-g.watch:
			if ev.Volume.Spec.Name == name {
				return ev
			}
			if g.held == nil {
				g.held = map[string][]store.Event{}
			}
			g.held[ev.Volume.Spec.Name] = append(g.held[ev.Volume.Spec.Name], ev)
		case <-deadline:
			g.t.Fatalf("no change of %s within 5s", name)
		}
	}
}

// quiet asserts that the named volume does not change for d.
func (g *rig) quiet(name string, d time.Duration) {
	g.t.Helper()
	if evs := g.held[name]; len(evs) > 0 {
		g.t.Fatalf("%s changed: %+v", name, evs[0].Volume.Status)
	}
	deadline := time.After(d)
	for {
		select {
		case ev := <-g.watch:
			if ev.Volume.Spec.Name == name {
				g.t.Fatalf("%s changed: %+v", name, ev.Volume.Status)
			}
			if g.held == nil {
				g.held = map[string][]store.Event{}
			}
			g.held[ev.Volume.Spec.Name] = append(g.held[ev.Volume.Spec.Name], ev)
		case <-deadline:
			return
		}
	}
}

// until waits for the volume to reach phase (or be deleted when phase is "DELETED").
func (g *rig) until(name string, phase string) *volume.Volume {
	g.t.Helper()
	for {
		ev := g.next(name)
		if ev.Type == store.Deleted && phase == store.Deleted {
			return ev.Volume
		}
		if ev.Type != store.Deleted && ev.Volume.Status.Phase.String() == phase {
			return ev.Volume
		}
	}
}

func ret(jid, minion string, retcode int64, ret any) events.Event {
	return events.Event{Tag: "salt/job/" + jid + "/ret/" + minion, Data: map[string]any{
		"fun": "state.apply", "retcode": retcode, "return": ret, "jid": jid, "id": minion}}
}

func stateRet(name, fun string, ok bool, comment string, device map[string]any) map[string]any {
	st := map[string]any{"result": ok, "comment": comment, "__run_num__": int64(0), "changes": map[string]any{}}
	if device != nil {
		st["volume"] = device
	}
	return map[string]any{"salt_volumes_|-salt_volumes " + name + "_|-" + name + "_|-" + fun: st}
}

func device(s *spec.Spec) map[string]any {
	return map[string]any{"name": s.Name, "uuid": s.UUID, "type": "sparseLoopDevice", "mode": "Filesystem",
		"devicePath": "/dev/loop3", "deviceName": "loop3", "persistentPath": "/dev/disk/by-uuid/" + s.UUID,
		"size": int64(1 << 30), "inUse": false}
}

// send puts an event on the bus as Salt does: a job return is written to
// the job cache too (the master stores authenticated returns there).
func (g *rig) send(ev events.Event) {
	g.record(ev)
	g.forge(ev)
}

// record writes a job return event's return into the fake job cache.
func (g *rig) record(ev events.Event) {
	if jr, ok := ev.AsJobReturn(); ok {
		b, err := json.Marshal(jr.Return)
		require.NoError(g.t, err)
		g.salt.mu.Lock()
		info := g.salt.jobs[jr.JID]
		info.Known, info.Function = true, jr.Fun
		if info.Returns == nil {
			info.Returns = map[string]saltapi.MinionReturn{}
		}
		info.Returns[jr.Minion] = saltapi.MinionReturn{Return: b, Retcode: jr.Retcode}
		g.salt.jobs[jr.JID] = info
		g.salt.mu.Unlock()
	}
}

// forge puts an event on the bus only, as any minion can with Salt's
// batched events: nothing reaches the job cache.
// passed waits until a reconcile pass has ended since the count was
// before (Metrics.Reconciles counts passes as they end).
func (g *rig) passed(before int64) {
	g.t.Helper()
	require.Eventually(g.t, func() bool { return g.r.Metrics.Reconciles.Value() > before }, 5*time.Second, time.Millisecond)
}

// forge puts ev on the bus as is and returns once the reconciler has
// handled it (or, with no term running to read it, after a while).
func (g *rig) forge(ev events.Event) {
	f := forged{ev: ev, done: make(chan struct{})}
	g.src.ch <- f
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
	}
}

// A long step (a clone's copy, a wipe) reports its bytes as it goes:
// the first report and the last are shown, the ones between at most one
// each progressSaveEvery (a store write and a watch event each); the step
// is logged once, however many reports come, late ones too; a late
// report moves nothing back; the next step carries none of them.
func TestLongStepsShowTheirBytes(t *testing.T) {
	g := newRig(t, Options{})
	s := sparseSpec("data-1")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("data-1", "Pending")
	require.NotEmpty(t, v.Status.JobID)
	progress := func(step string, seq int64, bytes ...int64) {
		d := map[string]any{"step": step, "uuid": s.UUID, "seq": seq}
		if len(bytes) == 2 {
			d["done"], d["total"] = bytes[0], bytes[1]
		}
		g.send(events.Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{"cmd": "_minion_event", "id": "node-1", "data": d}})
	}
	progress("copying", 1, 0, 64<<20)
	st := g.next("data-1").Volume.Status
	assert.Equal(t, "copying", st.Step)
	require.NotNil(t, st.Progress)
	assert.Equal(t, saltvolumes.Progress{Step: "copying", Done: 0, Total: 64 << 20}, *st.Progress)
	// Within progressSaveEvery: not saved.
	progress("copying", 2, 16<<20, 64<<20)
	progress("copying", 3, 32<<20, 64<<20)
	g.quiet("data-1", 300*time.Millisecond)
	// The last report is saved at once.
	progress("copying", 4, 64<<20, 64<<20)
	st = g.next("data-1").Volume.Status
	require.NotNil(t, st.Progress)
	assert.Equal(t, saltvolumes.Progress{Step: "copying", Done: 64 << 20, Total: 64 << 20}, *st.Progress)
	// Once: one "last" report after another (a forged flood) waits for
	// its 5 s like any other.
	progress("copying", 5, 1<<20, 1<<20)
	g.quiet("data-1", 300*time.Millisecond)

	progress("formatted", 6)
	st = g.next("data-1").Volume.Status
	assert.Equal(t, "formatted", st.Step)
	assert.Nil(t, st.Progress, "the copy's bytes outlived its step")
	progress("copying", 5, 48<<20, 64<<20) // late, behind the next step
	g.quiet("data-1", 300*time.Millisecond)

	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("data-1", "prepared", true, "prepared", device(s))))
	v = g.until("data-1", "Available")
	assert.Nil(t, v.Status.Progress)
	progress("copying", 7, 64<<20, 64<<20) // after the return
	time.Sleep(100 * time.Millisecond)
	var names []string
	for _, st := range g.r.Jobs("data-1")[0].Steps {
		names = append(names, st.Name)
	}
	assert.Equal(t, []string{"copying", "formatted"}, names, "each step logged once")
}

func TestCreateIsSettledByTheJobReturnEvent(t *testing.T) {
	g := newRig(t, Options{})
	s := sparseSpec("data-1")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)

	ev := g.next("data-1")
	assert.Equal(t, store.Added, ev.Type)
	assert.Equal(t, volume.Unknown, ev.Volume.Status.Phase)
	v := g.until("data-1", "Pending")
	require.NotEmpty(t, v.Status.JobID)

	calls := g.salt.launches()
	require.Len(t, calls, 1)
	assert.Equal(t, "node-1", calls[0].Tgt)
	assert.Equal(t, FunApply, calls[0].Fun, "our fixed-argument function, never state.apply")
	assert.Equal(t, SLSPrepared, calls[0].SLS())
	require.Len(t, calls[0].Specs(), 1)
	assert.Equal(t, "data-1", calls[0].Specs()[0].Name)
	assert.Equal(t, s.UUID, calls[0].Specs()[0].UUID)
	assert.False(t, calls[0].Wipe())
	assert.Nil(t, calls[0].Kwarg, "no keyword arguments")

	g.send(events.Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-1", "data": map[string]any{"step": "attached", "uuid": s.UUID, "seq": int64(5)}}})
	assert.Equal(t, "attached", g.next("data-1").Volume.Status.Step)
	// Out of order (Salt 3006's minion forwards events concurrently): an
	// earlier step arriving late is not shown, but logged in its place;
	// the next one is shown.
	g.send(events.Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-1", "data": map[string]any{"step": "recorded", "uuid": s.UUID, "seq": int64(2)}}})
	g.send(events.Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-1", "data": map[string]any{"step": "linked", "uuid": s.UUID, "seq": uint64(6)}}})
	assert.Equal(t, "linked", g.next("data-1").Volume.Status.Step)

	// A progress event for another volume with the same name but another
	// uuid (a stale run) changes nothing; the return settles the volume.
	g.send(events.Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{"step": "formatted", "uuid": "0d5d2ff4-87b3-4ab5-8e8b-6c9c2f0c0b11"}})
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("data-1", "prepared", true, "prepared", device(s))))
	v = g.until("data-1", "Available")
	assert.Equal(t, "/dev/loop3", v.Status.DevicePath)
	assert.Equal(t, "/dev/disk/by-uuid/"+s.UUID, v.Status.PersistentPath)
	assert.Equal(t, int64(1<<30), v.Status.Size)
	assert.Empty(t, v.Status.Step)
	got, err := g.store.Get("data-1")
	require.NoError(t, err)
	assert.Equal(t, volume.Available, got.Status.Phase, "the store holds what watchers saw")
	assert.EqualValues(t, 1, g.r.Metrics.JobLatency.Count())
	jobs := g.r.Jobs("data-1")
	require.Len(t, jobs, 1, "the job log keeps the run with its steps")
	assert.Equal(t, v.Status.JobID, jobs[0].JID)
	assert.Equal(t, SLSPrepared, jobs[0].SLS)
	assert.Equal(t, "succeeded", jobs[0].Result)
	require.Len(t, jobs[0].Steps, 3, "the late step is logged in its place")
	assert.Equal(t, "recorded", jobs[0].Steps[0].Name)
	assert.Equal(t, "attached", jobs[0].Steps[1].Name)
	assert.Equal(t, "linked", jobs[0].Steps[2].Name)
	assert.False(t, jobs[0].Finished.Before(jobs[0].Steps[2].At))

	// A step the return overtook joins the job's log, in its place, once;
	// one of another uuid does not.
	for range 2 {
		g.send(events.Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{
			"cmd": "_minion_event", "id": "node-1", "data": map[string]any{"step": "formatted", "uuid": s.UUID, "seq": int64(3)}}})
	}
	g.send(events.Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-1", "data": map[string]any{"step": "stale", "uuid": "0d5d2ff4-87b3-4ab5-8e8b-6c9c2f0c0b11", "seq": int64(9)}}})
	require.Eventually(t, func() bool { return len(g.r.Jobs("data-1")[0].Steps) > 3 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	var names []string
	for _, st := range g.r.Jobs("data-1")[0].Steps {
		names = append(names, st.Name)
	}
	assert.Equal(t, []string{"recorded", "formatted", "attached", "linked"}, names)
	got, err = g.store.Get("data-1")
	require.NoError(t, err)
	assert.Equal(t, volume.Available, got.Status.Phase)
}

// A step arriving long after its job returned is not taken for it (progress
// events carry no job id: it may be another run's).
func TestStepsLongAfterTheReturnAreNotLogged(t *testing.T) {
	var l jobLog
	t0 := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	l.started("v", "j1", "prepared", t0)
	l.step("v", "j1", "attached", 4, t0.Add(time.Second), false)
	l.ended("v", "j1", "succeeded", "", t0.Add(2*time.Second))
	l.late("v", "formatted", 3, t0.Add(2*time.Second+lateStepGrace+time.Millisecond), false)
	l.late("v", "unnumbered", 0, t0.Add(3*time.Second), false)
	l.late("v", "recorded", 2, t0.Add(3*time.Second), false)
	jobs := l.m["v"]
	require.Len(t, jobs, 1)
	require.Len(t, jobs[0].Steps, 2)
	assert.Equal(t, "recorded", jobs[0].Steps[0].Name)
	assert.Equal(t, "attached", jobs[0].Steps[1].Name)
}

func TestFailedReturnCarriesSaltsMessage(t *testing.T) {
	g := newRig(t, Options{})
	_, err := g.r.Requests.Create(context.Background(), sparseSpec("bad"))
	require.NoError(t, err)
	v := g.until("bad", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 2, stateRet("bad", "prepared", false, "volume bad: rawBlockDevice.devicePath: /dev/nope does not exist", nil)))
	v = g.until("bad", "Failed")
	assert.Equal(t, ReasonPrepareFailed, v.Status.Reason)
	assert.Equal(t, "volume bad: rawBlockDevice.devicePath: /dev/nope does not exist", v.Status.Message)
}

func TestBusyMinionIsRetried(t *testing.T) {
	g := newRig(t, Options{RetryDelay: 20 * time.Millisecond})
	_, err := g.r.Requests.Create(context.Background(), sparseSpec("busy"))
	require.NoError(t, err)
	v := g.until("busy", "Pending")
	first := v.Status.JobID
	g.send(ret(first, "node-1", 1, []any{"The function \"state.apply\" is running as PID 4242 and was started at 2026"}))
	for v.Status.JobID == first || v.Status.JobID == "" {
		v = g.next("busy").Volume
	}
	assert.Equal(t, volume.Pending, v.Status.Phase)
	assert.Len(t, g.salt.launches(), 2)
}

func TestDeleteFollowsTheCriteria(t *testing.T) {
	g := newRig(t, Options{})
	s := sparseSpec("del")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("del", "Pending")
	var de *requests.DeleteError

	inUse := device(s)
	inUse["inUse"] = true
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("del", "prepared", true, "", inUse)))
	g.until("del", "Available")
	_, err = g.r.Requests.Delete(context.Background(), "del", false)
	require.ErrorAs(t, err, &de)
	assert.Contains(t, de.Reason, "in use")

	g.send(ret("20261122999999999999", "node-1", 0, stateRet("del", "prepared", true, "", device(s))))
	v = g.next("del").Volume
	assert.False(t, v.Status.InUse, "a salt-call run reported the device released")

	_, err = g.r.Requests.Delete(context.Background(), "del", true)
	require.NoError(t, err)
	v = g.until("del", "Terminating")
	calls := g.salt.launches()
	last := calls[len(calls)-1]
	assert.Equal(t, SLSUnprepared, last.SLS())
	assert.True(t, last.Wipe())
	_, err = g.r.Requests.Delete(context.Background(), "del", false)
	require.ErrorAs(t, err, &de, "already Terminating")

	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("del", "absent", true, "", nil)))
	g.until("del", store.Deleted)
	_, err = g.store.Get("del")
	assert.ErrorIs(t, err, store.ErrNotFound)
}

// A deletion asked for while the volume is being created is accepted and
// starts once the creation's run returns, whatever it says (seed 000).
func TestDeleteWhilePendingWaitsForTheCreation(t *testing.T) {
	for _, created := range []bool{true, false} {
		t.Run(fmt.Sprintf("creation succeeded %v", created), func(t *testing.T) {
			g := newRig(t, Options{})
			s := sparseSpec("hasty")
			_, err := g.r.Requests.Create(context.Background(), s)
			require.NoError(t, err)
			v := g.until("hasty", "Pending")
			prepare := v.Status.JobID
			require.NotEmpty(t, prepare)
			got, err := g.r.Requests.Delete(context.Background(), "hasty", false)
			require.NoError(t, err, "a deletion while Pending is accepted")
			view := got.View()
			assert.True(t, view.Deleting)
			assert.Contains(t, view.DeleteBlockedReason, "starts once the creation ends")
			v = g.next("hasty").Volume
			assert.True(t, v.DeleteRequested)
			assert.Equal(t, volume.Pending, v.Status.Phase)
			assert.Never(t, func() bool { return len(g.salt.launches()) > 1 }, 300*time.Millisecond, 10*time.Millisecond,
				"nothing else runs on the node while the creation's run is out")

			if created {
				g.send(ret(prepare, "node-1", 0, stateRet("hasty", "prepared", true, "", device(s))))
			} else {
				g.send(ret(prepare, "node-1", 2, stateRet("hasty", "prepared", false, "mkfs.ext4 failed", nil)))
			}
			v = g.until("hasty", "Terminating")
			calls := g.salt.launches()
			require.Len(t, calls, 2)
			assert.Equal(t, SLSUnprepared, calls[1].SLS(), "the removal runs after the creation's return, and reclaims what it left")
			g.send(ret(v.Status.JobID, "node-1", 0, stateRet("hasty", "absent", true, "", nil)))
			g.until("hasty", store.Deleted)
			_, err = g.store.Get("hasty")
			assert.ErrorIs(t, err, store.ErrNotFound)
		})
	}
}

func TestDeleteWhilePendingFollowsACreationThatTimesOut(t *testing.T) {
	g := newRig(t, Options{JobTimeout: 300 * time.Millisecond})
	s := sparseSpec("lost")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("lost", "Pending")
	_, err = g.r.Requests.Delete(context.Background(), "lost", false)
	require.NoError(t, err)
	// No return ever comes and Salt does not know the job: it times out,
	// and the removal asked for meanwhile starts.
	v = g.until("lost", "Terminating")
	calls := g.salt.launches()
	require.Len(t, calls, 2)
	assert.Equal(t, SLSUnprepared, calls[1].SLS())
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("lost", "absent", true, "", nil)))
	g.until("lost", store.Deleted)
}

func TestFailedUnprepareLeavesTheVolumeDeletable(t *testing.T) {
	g := newRig(t, Options{})
	s := sparseSpec("stuck")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("stuck", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("stuck", "prepared", true, "", device(s))))
	g.until("stuck", "Available")
	_, err = g.r.Requests.Delete(context.Background(), "stuck", false)
	require.NoError(t, err)
	v = g.until("stuck", "Terminating")
	g.send(ret(v.Status.JobID, "node-1", 2, stateRet("stuck", "absent", false, "volume stuck: device is mounted at /mnt", nil)))
	v = g.until("stuck", "Failed")
	assert.Equal(t, ReasonUnprepareFailed, v.Status.Reason)
	assert.False(t, v.DeleteRequested)
	ok, _ := volume.CanDelete(v)
	assert.True(t, ok)
}

// A volume whose node is gone can never be unprepared; forgetting it drops
// the object and runs nothing. Only Failed volumes can be forgotten.
func TestForgetFailedVolume(t *testing.T) {
	g := newRig(t, Options{RetryDelay: 20 * time.Millisecond})
	g.salt.err = []error{saltapi.ErrNoMinions, saltapi.ErrNoMinions}
	_, err := g.r.Requests.Create(context.Background(), sparseSpec("gone"))
	require.NoError(t, err)
	g.until("gone", "Failed")
	_, err = g.r.Requests.Delete(context.Background(), "gone", false)
	require.NoError(t, err)
	// The request itself shows first (still Failed, deleting), then the
	// outcome of the removal run.
	v := g.until("gone", "Failed")
	for v.DeleteRequested {
		v = g.until("gone", "Failed")
	}
	assert.Equal(t, ReasonNodeNotFound, v.Status.Reason, "unprepare cannot run either")

	launches := len(g.salt.launches())
	_, err = g.r.Requests.Forget(context.Background(), "gone")
	require.NoError(t, err)
	g.until("gone", store.Deleted)
	_, err = g.store.Get("gone")
	assert.ErrorIs(t, err, store.ErrNotFound)
	assert.Equal(t, launches, len(g.salt.launches()), "forget runs nothing on the node")

	_, err = g.r.Requests.Create(context.Background(), sparseSpec("alive"))
	require.NoError(t, err)
	jid := g.until("alive", "Pending").Status.JobID
	g.send(ret(jid, "node-1", 0, stateRet("alive", "prepared", true, "", device(sparseSpec("alive")))))
	g.until("alive", "Available")
	_, err = g.r.Requests.Forget(context.Background(), "alive")
	var de *requests.DeleteError
	require.ErrorAs(t, err, &de)
	assert.Contains(t, de.Reason, "only a Failed volume can be forgotten (it is Available)")
}

func TestLaunchErrors(t *testing.T) {
	g := newRig(t, Options{RetryDelay: 20 * time.Millisecond})
	g.salt.err = []error{saltapi.ErrNoMinions}
	_, err := g.r.Requests.Create(context.Background(), sparseSpec("nonode"))
	require.NoError(t, err)
	v := g.until("nonode", "Failed")
	assert.Equal(t, ReasonNodeNotFound, v.Status.Reason)
	assert.Contains(t, v.Status.Message, `"node-1"`)

	g.salt.mu.Lock()
	g.salt.err = []error{&saltapi.Error{Status: 503, Op: "local_async state.apply"}}
	g.salt.mu.Unlock()
	_, err = g.r.Requests.Create(context.Background(), sparseSpec("later"))
	require.NoError(t, err)
	v = g.until("later", "Pending")
	assert.Equal(t, ReasonSaltUnavailable, v.Status.Reason)
	assert.Empty(t, v.Status.JobID)
	for v.Status.JobID == "" {
		v = g.next("later").Volume
	}
	assert.Empty(t, v.Status.Reason, "the retry went through")
}

func TestReturnBeforeLocalAsyncAnswers(t *testing.T) {
	g := newRig(t, Options{})
	// The minion answers before salt-api does; a render error names no
	// state, so only the job id can match it.
	g.salt.onLaunch = func(jid string, _ call) {
		ev := ret(jid, "node-1", 1, []any{"Rendering SLS 'base:salt_volumes.prepared' failed"})
		g.record(ev)
		g.r.Handle(ev)
	}
	_, err := g.r.Requests.Create(context.Background(), sparseSpec("early"))
	require.NoError(t, err)
	v := g.until("early", "Failed")
	assert.Contains(t, v.Status.Message, "did not render")
}

func TestRestartLooksUpPendingJobsOnce(t *testing.T) {
	now := time.Now().UTC()
	done := sparseSpec("done-while-down")
	lost := sparseSpec("lost")
	running := sparseSpec("running")
	seed := []*volume.Volume{
		{Spec: *done, CreatedAt: now, Status: volume.Status{Status: saltvolumes.Status{Phase: volume.Pending, JobID: "j-done"}, JobStartedAt: now}},
		{Spec: *lost, CreatedAt: now, Status: volume.Status{Status: saltvolumes.Status{Phase: volume.Pending, JobID: "j-lost"}, JobStartedAt: now}},
		{Spec: *running, CreatedAt: now, Status: volume.Status{Status: saltvolumes.Status{Phase: volume.Pending, JobID: "j-running"}, JobStartedAt: now}},
	}
	body, _ := json.Marshal(stateRet(done.Name, "prepared", true, "", device(done)))
	g := &fakeSalt{jobs: map[string]saltapi.JobInfo{
		"j-done":    {Known: true, Returns: map[string]saltapi.MinionReturn{"node-1": {Return: body}}},
		"j-running": {Known: true, Function: "state.apply", Minions: []string{"node-1"}, Returns: map[string]saltapi.MinionReturn{}},
	}}
	rg := newRigWith(t, g, Options{}, seed...)
	v := rg.until("done-while-down", "Available")
	assert.Equal(t, "/dev/loop3", v.Status.DevicePath)
	v = rg.next("lost").Volume
	for v.Status.JobID == "j-lost" || v.Status.JobID == "" {
		v = rg.next("lost").Volume
	}
	assert.Equal(t, volume.Pending, v.Status.Phase, "unknown job launched again")
	assert.EqualValues(t, 1, rg.r.Metrics.JobsReconstructed.Value())
	assert.EqualValues(t, 1, rg.r.Metrics.JobsRelaunched.Value())
	r, err := rg.store.Get("running")
	require.NoError(t, err)
	assert.Equal(t, "j-running", r.Status.JobID, "a running job is left to its return event")
	rg.send(ret("j-running", "node-1", 0, stateRet("running", "prepared", true, "", device(running))))
	rg.until("running", "Available")
}

func newRigWith(t *testing.T, salt *fakeSalt, opt Options, seed ...*volume.Volume) *rig {
	g := newRigNoRun(t, seed...)
	g.salt = salt
	g.r = New(g.store, salt, g.src, opt, nil)
	hub := store.NewHub()
	t.Cleanup(g.store.Watch(hub.Publish))
	w, stop := hub.Subscribe(256)
	t.Cleanup(stop)
	g.watch = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return g
}

func newRigNoRun(t *testing.T, seed ...*volume.Volume) *rig {
	st, err := store.Open(filepath.Join(t.TempDir(), "volumes.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	for _, v := range seed {
		require.NoError(t, st.Create(context.Background(), v))
	}
	return &rig{t: t, src: &chanSource{ch: make(chan forged, 16)}, store: st}
}

func TestJobTimeout(t *testing.T) {
	g := newRig(t, Options{JobTimeout: 100 * time.Millisecond})
	_, err := g.r.Requests.Create(context.Background(), sparseSpec("slow"))
	require.NoError(t, err)
	v := g.until("slow", "Pending")
	g.salt.mu.Lock()
	g.salt.jobs[v.Status.JobID] = saltapi.JobInfo{Known: true, Function: "state.apply", Returns: map[string]saltapi.MinionReturn{}}
	g.salt.mu.Unlock()
	v = g.until("slow", "Failed")
	assert.Equal(t, ReasonJobTimeout, v.Status.Reason)
	assert.Contains(t, v.Status.Message, "jobs.lookup_jid "+v.Status.JobID)
}

// preparedByHand is the return of salt_volumes.prepared run by someone
// else (salt-call) for a new volume: its spec and device, ready to adopt.
func preparedByHand(t *testing.T, name string) map[string]any {
	t.Helper()
	s := sparseSpec(name)
	r := stateRet(name, "prepared", true, "", device(s))
	specMap := map[string]any{}
	b, _ := json.Marshal(s)
	require.NoError(t, json.Unmarshal(b, &specMap))
	r["salt_volumes_|-salt_volumes "+name+"_|-"+name+"_|-prepared"].(map[string]any)["spec"] = specMap
	return r
}

func TestStateRunsOfOthersAreTracked(t *testing.T) {
	g := newRig(t, Options{})
	g.send(ret("20261122111111111111", "node-1", 0, preparedByHand(t, "by-hand")))
	ev := g.next("by-hand")
	assert.Equal(t, store.Added, ev.Type)
	assert.Equal(t, volume.Available, ev.Volume.Status.Phase)
	assert.Equal(t, "salt", ev.Volume.Origin)
	assert.Equal(t, "node-1", ev.Volume.Spec.Node)
	assert.Equal(t, spec.Size("1Gi"), ev.Volume.Spec.SparseLoopDevice.Size)
	// The watch event comes from the store write; the counter follows it.
	assert.Eventually(t, func() bool { return g.r.Metrics.Adopted.Value() == 1 }, 5*time.Second, 10*time.Millisecond,
		"salt_volumes_adopted_total after one adoption")
	assert.Empty(t, g.salt.launches(), "an adopted volume needs no job")

	// A return from another node for the same name is not this volume.
	g.send(ret("20261122111111111112", "node-2", 0, stateRet("by-hand", "absent", true, "", nil)))
	// salt-call state.apply salt_volumes.unprepared on its node removes it.
	g.send(ret("20261122111111111113", "node-1", 0, stateRet("by-hand", "absent", true, "", nil)))
	assert.Equal(t, store.Deleted, g.next("by-hand").Type)
}

func TestVolumesReconcileConcurrently(t *testing.T) {
	g := newRig(t, Options{Workers: 8})
	const n = 200
	for i := range n {
		// One node each: a node runs one state run of ours at a time.
		s := sparseSpec(fmt.Sprintf("v-%03d", i))
		s.Node = fmt.Sprintf("node-%03d", i)
		_, err := g.r.Requests.Create(context.Background(), s)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return len(g.salt.launches()) == n }, 10*time.Second, 10*time.Millisecond)
	seen := map[string]int{}
	for _, c := range g.salt.launches() {
		b, _ := json.Marshal(c.Arg)
		seen[string(b)]++
	}
	for k, c := range seen {
		assert.Equal(t, 1, c, "one launch per volume: %s", k)
	}
}

// adoptable is a prepared state return that carries its spec, as the
// prepared state returns it.
func adoptable(t *testing.T, s *spec.Spec, dev map[string]any) map[string]any {
	r := stateRet(s.Name, "prepared", true, "", dev)
	specMap := map[string]any{}
	b, _ := json.Marshal(s)
	require.NoError(t, json.Unmarshal(b, &specMap))
	r["salt_volumes_|-salt_volumes "+s.Name+"_|-"+s.Name+"_|-prepared"].(map[string]any)["spec"] = specMap
	return r
}

// A job return on the bus that Salt's job cache does not hold changes
// nothing: not a pending volume, not an available one, not the store.
func TestForgedReturnsChangeNothing(t *testing.T) {
	g := newRig(t, Options{})
	pending := sparseSpec("pending")
	_, err := g.r.Requests.Create(context.Background(), pending)
	require.NoError(t, err)
	pv := g.until("pending", "Pending")
	avail := sparseSpec("avail")
	_, err = g.r.Requests.Create(context.Background(), avail)
	require.NoError(t, err)
	av := g.until("avail", "Pending")
	g.send(ret(av.Status.JobID, "node-1", 0, stateRet("avail", "prepared", true, "", device(avail))))
	av = g.until("avail", "Available")

	evil := device(avail)
	evil["persistentPath"], evil["devicePath"] = "/", "/"
	for _, ev := range []events.Event{
		// settle the pending volume, as failed or as prepared
		ret(pv.Status.JobID, "node-1", 2, stateRet("pending", "prepared", false, "forged failure", nil)),
		ret(pv.Status.JobID, "node-1", 0, stateRet("pending", "prepared", true, "", device(pending))),
		// remove, re-point or fail the available one through someone else's run
		ret("20261122222222222221", "node-1", 0, stateRet("avail", "absent", true, "", nil)),
		ret("20261122222222222222", "node-1", 0, stateRet("avail", "prepared", true, "", evil)),
		ret("20261122222222222223", "node-2", 0, stateRet("avail", "absent", true, "", nil)),
		// adopt a volume nobody made
		ret("20261122222222222224", "node-2", 0, adoptable(t, sparseSpec("ghost"), device(sparseSpec("ghost")))),
	} {
		g.forge(ev)
	}
	require.Eventually(t, func() bool { return g.r.Metrics.Rejected.Unconfirmed.Value() >= 6 }, 10*time.Second, 10*time.Millisecond,
		"every forged return is counted once its lookups are exhausted")
	got, err := g.store.Get("pending")
	require.NoError(t, err)
	assert.Equal(t, volume.Pending, got.Status.Phase)
	got, err = g.store.Get("avail")
	require.NoError(t, err)
	assert.Equal(t, av.Status, got.Status, "status untouched")
	_, err = g.store.Get("ghost")
	assert.ErrorIs(t, err, store.ErrNotFound)

	// The real return still settles the pending volume.
	g.send(ret(pv.Status.JobID, "node-1", 0, stateRet("pending", "prepared", true, "", device(pending))))
	assert.Equal(t, "/dev/disk/by-uuid/"+pending.UUID, g.until("pending", "Available").Status.PersistentPath)
}

// Progress counts only from the volume's own node, in Salt's single-event
// envelope; the node field inside the data is not trusted.
func TestProgressOnlyFromTheVolumesNode(t *testing.T) {
	g := newRig(t, Options{})
	s := sparseSpec("prog")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	g.until("prog", "Pending")
	g.forge(events.Event{Tag: "salt-volumes/prog/progress", Data: map[string]any{"step": "batched", "uuid": s.UUID, "node": "node-1"}})
	g.forge(events.Event{Tag: "salt-volumes/prog/progress", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-2", "data": map[string]any{"step": "other-minion", "uuid": s.UUID, "node": "node-1"}}})
	g.send(events.Event{Tag: "salt-volumes/prog/progress", Data: map[string]any{
		"cmd": "_minion_event", "id": "node-1", "data": map[string]any{"step": "attached", "uuid": s.UUID}}})
	assert.Equal(t, "attached", g.next("prog").Volume.Status.Step, "the first change is the real one")
	assert.EqualValues(t, 2, g.r.Metrics.Rejected.Progress.Value())
}

// The volume's own node, confirmed by the job cache, still cannot make the
// control plane publish a path that is not the volume's.
func TestDeviceInfoIsValidated(t *testing.T) {
	g := newRig(t, Options{})
	s := sparseSpec("dev")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	v := g.until("dev", "Pending")
	bad := device(s)
	bad["persistentPath"] = "/"
	g.send(ret(v.Status.JobID, "node-1", 0, stateRet("dev", "prepared", true, "", bad)))
	v = g.until("dev", "Failed")
	assert.Equal(t, ReasonInvalidReturn, v.Status.Reason)
	assert.Contains(t, v.Status.Message, `persistentPath "/"`)
	assert.EqualValues(t, 1, g.r.Metrics.Rejected.Device.Value())
	assert.Empty(t, v.Status.PersistentPath)
}

// One highstate returning several volumes costs one lookup.
func TestOneLookupPerJob(t *testing.T) {
	g := newRig(t, Options{})
	r := map[string]any{}
	for _, n := range []string{"h-1", "h-2", "h-3"} {
		for k, v := range adoptable(t, sparseSpec(n), device(sparseSpec(n))) {
			r[k] = v
		}
	}
	g.send(ret("20261122333333333333", "node-1", 0, r))
	for _, n := range []string{"h-1", "h-2", "h-3"} {
		assert.Equal(t, store.Added, g.next(n).Type)
	}
	assert.EqualValues(t, 1, g.r.Metrics.Lookups.Value())
}

// A deletion is on disk before Delete returns: the API's 202 is a promise
// that survives a crash.
func TestDeleteIsPersistedBeforeItIsAccepted(t *testing.T) {
	s := sparseSpec("keep")
	v := &volume.Volume{Spec: *s, Status: volume.Status{Status: saltvolumes.Status{Phase: volume.Available}}}
	g := newRigNoRun(t, v)
	r := New(g.store, &fakeSalt{jobs: map[string]saltapi.JobInfo{}}, g.src, Options{}, nil)
	_, err := r.Requests.Delete(context.Background(), "keep", true)
	require.NoError(t, err)
	got, err := g.store.Get("keep")
	require.NoError(t, err)
	assert.True(t, got.DeleteRequested)
	assert.True(t, got.Wipe)

	require.NoError(t, g.store.Close())
	_, err = r.Requests.Delete(context.Background(), "keep", false)
	assert.Error(t, err, "a deletion that cannot be recorded is not accepted")
}

// A volume that found its minion busy is launched again as soon as a run
// of ours on that minion ends, not at its backoff.
func TestOneRunOfOursPerNode(t *testing.T) {
	g := newRig(t, Options{RetryDelay: time.Hour})
	a, b, c := sparseSpec("first"), sparseSpec("second"), sparseSpec("third")
	_, err := g.r.Requests.Create(context.Background(), a)
	require.NoError(t, err)
	va := g.until("first", "Pending")
	require.NotEmpty(t, va.Status.JobID)
	for _, s := range []*spec.Spec{b, c} {
		_, err = g.r.Requests.Create(context.Background(), s)
		require.NoError(t, err)
	}
	vb := g.until("second", "Pending")
	for vb.Status.Step == "" {
		vb = g.next("second").Volume
	}
	assert.Empty(t, vb.Status.JobID, "no second run on a node while one of ours runs: it would only come back busy")
	assert.Contains(t, vb.Status.Step, "for volume first", "the wait names the run it waits for")
	// Both have stored their wait before the run ends: a volume whose
	// worker had not would get the run after (batching is opportunistic),
	// which under load made this test wait for a run that never returns.
	for v := g.until("third", "Pending"); v.Status.Step == ""; {
		v = g.next("third").Volume
	}
	assert.Len(t, g.salt.launches(), 1)

	// The run ends: the volumes that queued are launched at once, not
	// after their one-hour fallback, in one run that prepares both.
	g.send(ret(va.Status.JobID, "node-1", 0, stateRet("first", "prepared", true, "", device(a))))
	g.until("first", "Available")
	for vb.Status.JobID == "" {
		vb = g.next("second").Volume
	}
	assert.Empty(t, vb.Status.Step)
	vc := g.until("third", "Pending")
	for vc.Status.JobID == "" {
		vc = g.next("third").Volume
	}
	assert.Equal(t, vb.Status.JobID, vc.Status.JobID, "one run prepares both queued volumes")
	calls := g.salt.launches()
	require.Len(t, calls, 2)
	assert.Equal(t, []string{"second", "third"}, calls[1].Names())

	// Each volume is settled by its own state in the shared return: one
	// failing does not fail the other.
	both := stateRet("second", "prepared", true, "", device(b))
	maps.Copy(both, stateRet("third", "prepared", false, "third's disk is full", nil))
	g.send(ret(vb.Status.JobID, "node-1", 2, both))
	g.until("second", "Available")
	vc = g.until("third", "Failed")
	assert.Equal(t, "third's disk is full", vc.Status.Message)
	assert.Len(t, g.salt.launches(), 2)
}

// A run that prepares several volumes comes back busy (someone's salt-call
// held the minion): each waits again, and the next run takes them together.
func TestBatchedRunBusyRetriesTogether(t *testing.T) {
	g := newRig(t, Options{RetryDelay: 20 * time.Millisecond})
	a := sparseSpec("b1")
	_, err := g.r.Requests.Create(context.Background(), a)
	require.NoError(t, err)
	va := g.until("b1", "Pending")
	for _, n := range []string{"b2", "b3"} {
		_, err = g.r.Requests.Create(context.Background(), sparseSpec(n))
		require.NoError(t, err)
		v := g.until(n, "Pending")
		for v.Status.Step == "" {
			v = g.next(n).Volume
		}
	}
	g.send(ret(va.Status.JobID, "node-1", 0, stateRet("b1", "prepared", true, "", device(a))))
	jobOf := func(n string, not string) string {
		v := g.until(n, "Pending")
		for v.Status.JobID == "" || v.Status.JobID == not {
			v = g.next(n).Volume
		}
		return v.Status.JobID
	}
	jid := jobOf("b2", "")
	require.Equal(t, jid, jobOf("b3", ""))
	g.send(ret(jid, "node-1", 1, []any{"The function \"state.apply\" is running as PID 4242 and was started at 2026 with jid 1"}))
	again := jobOf("b2", jid)
	assert.Equal(t, again, jobOf("b3", jid), "the busy pair is retried in one run")
	calls := g.salt.launches()
	require.Len(t, calls, 3)
	assert.Equal(t, []string{"b2", "b3"}, calls[2].Names())
}

func TestOneRunOfOursPerNodeWhenDeleting(t *testing.T) {
	g := newRig(t, Options{})
	names := []string{"d1", "d2", "d3"}
	for _, n := range names {
		s := sparseSpec(n)
		_, err := g.r.Requests.Create(context.Background(), s)
		require.NoError(t, err)
		v := g.until(n, "Pending")
		for v.Status.JobID == "" {
			v = g.next(n).Volume
		}
		g.send(ret(v.Status.JobID, "node-1", 0, stateRet(n, "prepared", true, "", device(s))))
		g.until(n, "Available")
	}
	_, err := g.r.Requests.Delete(context.Background(), "d1", false)
	require.NoError(t, err)
	v1 := g.until("d1", "Terminating")
	for v1.Status.JobID == "" {
		v1 = g.next("d1").Volume
	}
	for _, n := range names[1:] {
		_, err := g.r.Requests.Delete(context.Background(), n, false)
		require.NoError(t, err)
	}
	for _, n := range names[1:] {
		v := g.until(n, "Terminating")
		for v.Status.Step == "" {
			v = g.next(n).Volume
		}
		assert.Empty(t, v.Status.JobID, "%s waits for d1's run", n)
	}
	g.send(ret(v1.Status.JobID, "node-1", 0, stateRet("d1", "unprepared", true, "", nil)))
	for g.next("d1").Type != store.Deleted {
	}
	// The two that queued are removed by one run: each unprepare is its
	// own state in it, and none was settled by its earlier prepare's return.
	jobOf := func(n string) string {
		v := g.until(n, "Terminating")
		for v.Status.JobID == "" {
			v = g.next(n).Volume
		}
		return v.Status.JobID
	}
	jid := jobOf("d2")
	require.Equal(t, jid, jobOf("d3"))
	both := stateRet("d2", "unprepared", true, "", nil)
	maps.Copy(both, stateRet("d3", "unprepared", true, "", nil))
	g.send(ret(jid, "node-1", 0, both))
	for _, n := range names[1:] {
		for g.next(n).Type != store.Deleted {
		}
	}
	calls := g.salt.launches()
	require.Len(t, calls, 5)
	for _, c := range calls[3:] {
		assert.Equal(t, SLSUnprepared, c.SLS())
	}
	assert.Equal(t, []string{"d2", "d3"}, calls[4].Names())
}

// interposer writes a user's deletion request just before the reconciler's
// save of a settled volume: the save meets a conflict.
type interposer struct {
	store.Store
	once sync.Once
	t    *testing.T
}

func (w *interposer) Update(ctx context.Context, v *volume.Volume) error {
	if v.Status.Phase == volume.Available {
		w.once.Do(func() {
			cur, err := w.Store.Get(v.Spec.Name)
			require.NoError(w.t, err)
			cur.DeleteRequested = true
			require.NoError(w.t, w.Store.Update(context.Background(), cur), "the request, as another replica writes it")
		})
	}
	return w.Store.Update(ctx, v)
}

// A deletion requested (through any replica) while a worker was saving the
// volume is merged into that save: neither the settled return nor the
// request is lost.
func TestRequestWrittenDuringASaveIsKept(t *testing.T) {
	g := newRigNoRun(t)
	g.salt = &fakeSalt{jobs: map[string]saltapi.JobInfo{}}
	g.r = New(g.store, g.salt, g.src, Options{}, nil)
	hub := store.NewHub()
	t.Cleanup(g.store.Watch(hub.Publish))
	w, stop := hub.Subscribe(256)
	t.Cleanup(stop)
	g.watch = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.r.Lead(ctx, &interposer{Store: g.store, t: t}); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	s := sparseSpec("merge")
	_, err := g.r.Requests.Create(context.Background(), s)
	require.NoError(t, err)
	jid := g.until("merge", "Pending").Status.JobID
	g.send(ret(jid, "node-1", 0, stateRet("merge", "prepared", true, "", device(s))))
	v := g.until("merge", "Terminating")
	assert.True(t, v.DeleteRequested)
	assert.Equal(t, "/dev/disk/by-uuid/"+s.UUID, v.Status.PersistentPath, "the settled return's device info was kept")
	assert.EqualValues(t, 1, g.r.Metrics.JobsSucceeded.Value())
	calls := g.salt.launches()
	require.Len(t, calls, 2)
	assert.Equal(t, SLSUnprepared, calls[1].SLS(), "the merged request was acted on")
}

// A forget recorded while the volume was Failed lapses if it is Failed no
// more when its worker gets to it: the volume stays, the request is gone,
// so a later failure does not forget it unasked.
func TestForgetLapsesOnceNotFailed(t *testing.T) {
	v := &volume.Volume{Spec: *sparseSpec("back"), CreatedAt: time.Now().UTC(), ForgetRequested: true,
		Status: volume.Status{Status: saltvolumes.Status{Phase: volume.Available}}}
	g := newRig(t, Options{}, v)
	require.Eventually(t, func() bool {
		got, err := g.store.Get("back")
		return err == nil && !got.ForgetRequested
	}, 5*time.Second, 10*time.Millisecond)
	got, err := g.store.Get("back")
	require.NoError(t, err, "the volume stays")
	assert.Equal(t, volume.Available, got.Status.Phase)
	assert.Empty(t, g.salt.launches())
}

func TestForgetNodeDropsItsVolumesWithoutRunningAnything(t *testing.T) {
	g := newRig(t, Options{})
	ready := func(name, node string) {
		s := sparseSpec(name)
		s.Node = node
		_, err := g.r.Requests.Create(context.Background(), s)
		require.NoError(t, err)
		v := g.until(name, "Pending")
		g.send(ret(v.Status.JobID, node, 0, stateRet(name, "prepared", true, "", device(s))))
		g.until(name, "Available")
	}
	ready("a", "node-1")
	ready("other", "node-2")
	failing := sparseSpec("f")
	_, err := g.r.Requests.Create(context.Background(), failing)
	require.NoError(t, err)
	v := g.until("f", "Pending")
	g.send(ret(v.Status.JobID, "node-1", 2, stateRet("f", "prepared", false, "mkfs failed", nil)))
	g.until("f", "Failed")
	_, err = g.r.Requests.Create(context.Background(), sparseSpec("p"))
	require.NoError(t, err)
	g.until("p", "Pending") // its run never returns: the node is gone
	launched := len(g.salt.launches())

	_, err = g.r.Requests.ForgetNode(context.Background(), "node-1", []string{"a", "other", "nope"})
	var ne *requests.NodeForgetError
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, []string{"other", "nope"}, ne.Missing)
	for _, n := range []string{"a", "f", "p", "other"} {
		v, err := g.store.Get(n)
		require.NoError(t, err, "a refused drain changes nothing")
		assert.False(t, v.ForgetRequested, n)
	}

	got, err := g.r.Requests.ForgetNode(context.Background(), "node-1", []string{"a", "f", "p"})
	require.NoError(t, err)
	assert.Len(t, got, 3)
	for _, n := range []string{"a", "f", "p"} {
		g.until(n, store.Deleted)
		_, err := g.store.Get(n)
		assert.ErrorIs(t, err, store.ErrNotFound, n)
	}
	assert.Len(t, g.salt.launches(), launched, "nothing ran on any node")
	v, err = g.store.Get("other")
	require.NoError(t, err)
	assert.Equal(t, volume.Available, v.Status.Phase, "another node's volume is untouched")
}

// A snapshot's copy reports its bytes on the origin volume, which runs no
// job of its own: the reconciler hands the node's report to the snapshots
// service, which shows it on the snapshot whose job runs there.
func TestASnapshotsCopyShowsItsBytesOnTheSnapshot(t *testing.T) {
	g := newRigNoRun(t)
	g.salt = &fakeSalt{jobs: map[string]saltapi.JobInfo{}}
	snaps := &snapshots.Service{Records: g.store, Salt: g.salt, Every: 20 * time.Millisecond, JobTimeout: time.Hour}
	g.r = New(g.store, g.salt, g.src, Options{}, nil)
	g.r.Snapshots = snaps
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); g.r.Run(ctx) }()
	go func() { defer wg.Done(); snaps.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	s := sparseSpec("data-1")
	v := &volume.Volume{Spec: *s}
	v.Status.Phase = volume.Available
	_, _, err := snaps.Take(ctx, v, "before", "alice")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := snaps.Get(ctx, "before")
		return err == nil && got.JobID != ""
	}, 5*time.Second, 10*time.Millisecond, "the snapshot's job is started")
	progress := func(from string, done, total int64) {
		g.send(events.Event{Tag: "salt-volumes/data-1/progress", Data: map[string]any{"cmd": "_minion_event", "id": from,
			"data": map[string]any{"step": "copying", "uuid": s.UUID, "seq": 3, "done": done, "total": total}}})
	}
	progress("node-2", 1<<20, 1<<20) // not the volume's node
	progress("node-1", 64<<20, 64<<20)
	var got saltvolumes.Snapshot
	require.Eventually(t, func() bool {
		got, err = snaps.Get(ctx, "before")
		return err == nil && got.Progress != nil
	}, 5*time.Second, 10*time.Millisecond, "the copy's last report is shown on the snapshot")
	assert.Equal(t, saltvolumes.Progress{Step: "copying", Done: 64 << 20, Total: 64 << 20}, *got.Progress)
}
