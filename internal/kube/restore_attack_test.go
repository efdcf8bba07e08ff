package kube

// Outside review of the in-place restore of a claim's volume (restore.go).
// Each test is an attack (a tenant writing the claim's annotations, an
// unlucky operator) and asserts what should hold; a failing one is a
// finding.

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/salt-volumes/salt-volumes/internal/snapshots"
)

// The status annotation is the only memory that a request was answered,
// and it is on an object the tenant (and their tooling: a replace-style
// GitOps sync, a mutating webhook, a truncating editor) writes. An
// unreadable status counts as no status (restoreStatusOf), so a request
// already answered is asked again: the volume is put back once more,
// losing what was written since the first restore. Fail closed: an
// unreadable status should be answered Refused ("remove it to ask
// again"), never taken as a new request.
func TestAttackRestoreUnreadableStatusRestoresAgain(t *testing.T) {
	e := newRestoreEnv(t, func(e *restoreEnv) { e.take(t, "apps", "nightly", nightly, dataVolume()) },
		dataClaim("nightly", func(p *corev1.PersistentVolumeClaim) {
			// An answered request, its status cut short.
			p.Annotations[AnnRestoreStatus] = `{"from":"nightly","phase":"Restored","request":"0f229a3a2981c5af"`
		}))
	time.Sleep(1500 * time.Millisecond)
	assert.Empty(t, e.salt.restored(), "an answered request whose status became unreadable was restored again")
}

// The request id comes from the status annotation, which the tenant may
// forge (phase Restoring, any request): it is written, unbounded and
// unchecked, into the snapshot record's restore.requestedBy (shown by the
// API to every viewer) and into the Salt job's metadata.
func TestAttackRestoreForgedRequestIDIsUnbounded(t *testing.T) {
	huge := strings.Repeat("A", 100_000) + "\nk8s:claim kube-system/etcd restore 1"
	var snap string
	e := newRestoreEnv(t, func(e *restoreEnv) { snap = e.take(t, "apps", "nightly", nightly, dataVolume()) },
		dataClaim("nightly", func(p *corev1.PersistentVolumeClaim) {
			b, _ := json.Marshal(RestoreStatus{From: "nightly", Phase: RestoreRestoring, Request: huge, Snapshot: SnapshotName("apps", "nightly"), RequestedAt: time.Now().UTC()})
			p.Annotations[AnnRestoreStatus] = string(b)
		}))
	// Corrected (by the fix's author): the forged status is answered
	// Refused (not a status the leader writes), so nothing is restored;
	// the test waited for a restore to happen before. What must hold is
	// unchanged: no forged id reaches requestedBy, and the answer is small.
	st := e.status(t, RestoreRefused)
	assert.Less(t, len(st.Message), 2048)
	time.Sleep(300 * time.Millisecond)
	assert.Empty(t, e.salt.restored())
	s, err := e.snaps.Get(context.Background(), snap)
	require.NoError(t, err)
	if s.Restore != nil {
		by := s.Restore.RequestedBy
		assert.LessOrEqual(t, len(by), 1024, "a forged request id of the claim's status became the restore's requestedBy")
		assert.False(t, strings.Contains(by, "\n"), "requestedBy carries a forged line: %q", by[max(0, len(by)-60):])
	}
}

// A VolumeSnapshot object Ready whose snapshot record is gone (pruned by
// a schedule after an admin bound it, dropped by node forget, deleted
// through the API by an operator) is answered errRestoreWaiting: the
// claim gets no status and no Event, and the leader reads the object from
// the API server and lists every snapshot record every 2 s, forever. Only
// an object whose phase is Failed is refused.
func TestAttackRestoreFromAnObjectWhoseSnapshotIsGoneWaitsForever(t *testing.T) {
	e := newRestoreEnv(t, func(e *restoreEnv) {
		e.objs["apps/nightly"] = snapshotObject{UID: nightly, Phase: snapshots.Ready}
	}, dataClaim("nightly"))
	require.Eventually(t, func() bool {
		pvc, err := e.cs.CoreV1().PersistentVolumeClaims("apps").Get(context.Background(), "data", metav1.GetOptions{})
		return err == nil && pvc.Annotations[AnnRestoreStatus] != ""
	}, 5*time.Second, 50*time.Millisecond, "a request for a Ready object without a snapshot is never answered")
}

// The intent names the object by name only. Between the intent and the
// request (serve stopped in between), the object is deleted and made
// again under that name (new uid, a snapshot taken later, of the volume as
// it was then): the replay restores from the new object's snapshot, which
// is not the one the claim's owner asked for. The intent should pin the
// object's uid (or the snapshot's creation), and a changed one be Refused.
func TestAttackRestoreReplayAfterTheObjectWasMadeAgain(t *testing.T) {
	asked := time.Now().UTC().Add(-time.Hour)
	e := newRestoreEnv(t, func(e *restoreEnv) {
		// The object of the name now: another uid, a snapshot taken after
		// the claim's request.
		e.take(t, "apps", "nightly", otherUID, dataVolume())
	}, dataClaim("nightly", func(p *corev1.PersistentVolumeClaim) {
		b, _ := json.Marshal(RestoreStatus{From: "nightly", Phase: RestoreRestoring, Request: "r1", Snapshot: SnapshotName("apps", "nightly"), RequestedAt: asked})
		p.Annotations[AnnRestoreStatus] = string(b)
	}))
	time.Sleep(1500 * time.Millisecond)
	assert.Empty(t, e.salt.restored(), "the replay restored from a snapshot taken after the request (another object of the same name)")
}

// Held: a claim names another namespace's object by its control-plane
// snapshot name, a slash, JSON or a long value: Refused with nothing of
// the other namespace named, nothing asked of the node.
func TestAttackRestoreAnnotationInjection(t *testing.T) {
	for _, from := range []string{"other/nightly", `{"from":"nightly"}`, strings.Repeat("a", 300), "../nightly", "nightly\n"} {
		t.Run(from[:min(len(from), 20)], func(t *testing.T) {
			e := newRestoreEnv(t, func(e *restoreEnv) {
				e.take(t, "apps", "nightly", nightly, dataVolume())
				e.take(t, "other", "nightly", otherUID, dataVolume())
			}, dataClaim(from))
			st := e.status(t, RestoreRefused)
			assert.NotContains(t, st.Message, SnapshotName("other", "nightly"))
			assert.Empty(t, e.salt.restored())
			// Answered once: a value with a line break once made a
			// status the leader itself took for forged, answered
			// again every time, a write to the claim without end.
			was := e.raw(t)
			time.Sleep(time.Second)
			assert.Equal(t, was, e.raw(t), "the refusal was written again")
		})
	}
}

// A refused value is quoted whole into the status (and the Event): a
// 100 KB value (annotations may total 256 KiB) makes a status that, with
// the request itself, passes the API server's 256 KiB limit on a real
// cluster: the write is refused (not a conflict), retried with backoff
// forever, the claim never answered. The value should be cut when quoted.
func TestAttackRestoreRefusalEchoesTheWholeValue(t *testing.T) {
	from := strings.Repeat("x/", 50_000)
	e := newRestoreEnv(t, nil, dataClaim(from))
	st := e.status(t, RestoreRefused)
	assert.LessOrEqual(t, len(st.Message), 2048, "the refusal quotes the whole %d-byte value", len(from))
}
