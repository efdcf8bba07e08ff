package kube

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Restoring a bound claim's volume in place, from Kubernetes: whoever may
// change a claim annotates it with the name of a VolumeSnapshot object of
// its namespace; the leader checks that the object's snapshot is of this
// very volume, asks the snapshots service for the restore (the node's
// snapshot-restore, which refuses a volume in use), and writes the
// outcome on the claim. The request is the claim's, not the snapshot's:
// putting a volume back loses what was written since, which is the
// claim's owner's call, as deleting the claim is.
//
// Exactly once per request: the leader writes its intent on the claim
// (AnnRestoreStatus, phase Restoring, a request id, the object's uid)
// before it asks the snapshots service, under the id; a restart, a new
// leader or a re-list then follows that request by its id (restoreBy)
// instead of asking again, and an answered request (Restored, Failed,
// Refused) is never acted on again. A new request is a new value of
// AnnRestoreFrom, or the status set empty.
//
// The status is on an object the claim's owner (and their tooling) writes,
// so it is not the only memory of an answer: the snapshot's record keeps
// its last restore, whose requestedBy names the claim (uid), the request
// id and the object (uid). A status that is there but is not one the
// leader writes (unreadable, cut short, a request id it never makes) is
// answered Refused; a status that is gone (a replace-style GitOps sync
// drops it) while the snapshot's last restore is this very request's is
// written back from that record, never asked again.

// Annotations of a claim's restore.
const (
	// AnnRestoreFrom asks for the claim's volume to be put back to the
	// snapshot of the VolumeSnapshot (salt-volumes.io) of that name in
	// the claim's namespace.
	AnnRestoreFrom = "salt-volumes.io/restore-from"
	// AnnRestoreStatus is the leader's record of the last request (JSON,
	// RestoreStatus). Set empty, it asks for the request once more.
	AnnRestoreStatus = "salt-volumes.io/restore-status"
)

// Phases of a claim's restore (RestoreStatus.Phase).
const (
	RestoreRestoring = "Restoring" // asked of the node; its job runs
	RestoreRestored  = "Restored"
	RestoreFailed    = "Failed"  // the node refused (in use) or failed: see the message
	RestoreRefused   = "Refused" // refused before anything was asked of the node
)

// RestoreStatus is AnnRestoreStatus's value.
type RestoreStatus struct {
	// From is the AnnRestoreFrom value this status answers (a value
	// longer than a name is kept cut, with its digest: fromKey).
	From  string `json:"from"`
	Phase string `json:"phase"`
	// Request identifies the request in the snapshot's record (restoreBy):
	// 16 hex digits.
	Request string `json:"request"`
	// Snapshot is the control plane's name of the snapshot restored.
	Snapshot string `json:"snapshot,omitempty"`
	// Object is the uid of the VolumeSnapshot object asked for, when the
	// request was made: a request is never carried over to another object
	// made under the same name.
	Object      types.UID  `json:"objectUID,omitempty"`
	RequestedAt time.Time  `json:"requestedAt"`
	FinishedAt  *time.Time `json:"finishedAt,omitempty"`
	Message     string     `json:"message,omitempty"`
}

// errRestoreWaiting: the VolumeSnapshot's snapshot is being taken, or
// another job of the volume's snapshots runs; the request is looked at
// again in a moment, for restoreWaitLimit at most.
var errRestoreWaiting = errors.New("the VolumeSnapshot's snapshot is being taken")

const (
	restoreFollowEvery = time.Second     // while the node's job runs
	restoreWaitEvery   = 2 * time.Second // first looks while the snapshot is taken
	restoreWaitMax     = 30 * time.Second
)

// restoreWaitLimit is how long a request waits for its snapshot to be
// taken (or for another job of the volume's snapshots to end) before it is
// answered Refused. A variable for tests.
var restoreWaitLimit = 10 * time.Minute

// restoreWaitAfter is the next look of a request that has waited that
// long: every 2 s at first, then a fifth of the wait so far, 30 s at most.
func restoreWaitAfter(waited time.Duration) time.Duration {
	return min(max(restoreWaitEvery, waited/5), restoreWaitMax)
}

// snapshotObject is what a restore reads of a VolumeSnapshot object.
type snapshotObject struct {
	UID     types.UID
	Phase   string // its status.phase
	Message string
}

// errNoObject: no VolumeSnapshot object of that name in the namespace.
var errNoObject = errors.New("no such VolumeSnapshot object")

// restoreBy is the snapshot record's requestedBy for request st of claim
// pvc: how a restart recognises its own request, and how a lost status is
// told from a new request (answeredBefore). Every part is bounded: st
// is one the leader wrote (validStatus).
func restoreBy(pvc *corev1.PersistentVolumeClaim, st *RestoreStatus) string {
	return fmt.Sprintf("k8s:claim %s/%s restore %s (claim uid %s, VolumeSnapshot %s uid %s)", pvc.Namespace, pvc.Name, st.Request, pvc.UID, st.From, st.Object)
}

// restoreByRequest finds the request id in a restoreBy.
var restoreByRequest = regexp.MustCompile(`^k8s:claim [^ ]+ restore ([0-9a-f]{16}) \(`)

var requestIDs = regexp.MustCompile(`^[0-9a-f]{16}$`)

func newRequestID() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// maxQuoted is how much of a value of the claim's is quoted back (the
// longest name): the status must stay far under the API server's 256 KiB
// of annotations.
const maxQuoted = validation.DNS1123SubdomainMaxLength

// cut is s, at most n bytes of it (valid UTF-8), marked when cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// quote is a value of the claim's, quoted, cut to maxQuoted.
func quote(s string) string { return strconv.Quote(cut(s, maxQuoted)) }

// fromKey is AnnRestoreFrom's value as a status keeps it: a name as it
// is, a longer value cut, with its digest (so that the status answers
// that very value, and stays small).
// A value with a control character is kept in the digest form too, with
// the characters dropped: a status holding a line break is not one the
// leader writes (validStatus), so keeping it as is would make every
// answer unreadable and answered again, a write to the claim each time,
// without end.
func fromKey(from string) string {
	controls := strings.IndexFunc(from, unicode.IsControl) >= 0
	if len(from) <= maxQuoted && !controls {
		return from
	}
	sum := sha256.Sum256([]byte(from))
	shown := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, from)
	return cut(shown, 200) + " sha256:" + hex.EncodeToString(sum[:8])
}

// Status annotation states.
const (
	statusNone  = iota // no annotation
	statusEmpty        // set empty: ask again
	statusBad          // not a status the leader writes
	statusOK
)

// restoreStatusOf is the claim's last restore and the annotation's state:
// st is set only with statusOK.
func restoreStatusOf(pvc *corev1.PersistentVolumeClaim) (*RestoreStatus, int) {
	raw, ok := pvc.Annotations[AnnRestoreStatus]
	switch {
	case !ok:
		return nil, statusNone
	case strings.TrimSpace(raw) == "":
		return nil, statusEmpty
	}
	var st RestoreStatus
	if json.Unmarshal([]byte(raw), &st) != nil || !validStatus(&st) {
		return nil, statusBad
	}
	return &st, statusOK
}

// validStatus tells whether st could have been written by the leader:
// every field it reuses (in the snapshot's record, in a message) bounded.
func validStatus(st *RestoreStatus) bool {
	switch st.Phase {
	case RestoreRestoring, RestoreRestored, RestoreFailed, RestoreRefused:
	default:
		return false
	}
	if !requestIDs.MatchString(st.Request) || len(st.From) > maxQuoted || len(st.Object) > 64 ||
		strings.ContainsAny(string(st.Object), " ,()\n") || strings.ContainsAny(st.From, "\n") {
		return false
	}
	if st.Snapshot != "" && len(validation.IsDNS1123Label(st.Snapshot)) > 0 {
		return false
	}
	// A request asked of the node names its snapshot and its object.
	return st.Phase != RestoreRestoring || st.Snapshot != "" && st.Object != ""
}

// queueRestore queues a claim that asks for a restore, whatever its class
// (an operator's claim of salt-volumes-static too).
func (c *Controller) queueRestore(pvc *corev1.PersistentVolumeClaim) {
	if c.restores == nil {
		return
	}
	if pvc.Annotations[AnnRestoreFrom] == "" {
		// Withdrawn while its restore runs: its outcome is still written.
		if st, _ := restoreStatusOf(pvc); st == nil || st.Phase != RestoreRestoring {
			return
		}
	}
	if key, err := cache.MetaNamespaceKeyFunc(pvc); err == nil {
		c.restores.Add(key)
	}
}

func (c *Controller) nextRestore(ctx context.Context) bool {
	key, quit := c.restores.Get()
	if quit {
		return false
	}
	defer c.restores.Done(key)
	if !c.leading() {
		// The next leader queues every claim when it takes over.
		c.restores.Forget(key)
		return true
	}
	again, err := c.syncRestore(ctx, key)
	switch {
	case err != nil:
		c.log.Warn("restoring a claim's volume; retrying", "claim", key, "error", err)
		c.restores.AddRateLimited(key)
	case again > 0:
		c.restores.Forget(key)
		c.restores.AddAfter(key, again)
	default:
		c.restores.Forget(key)
	}
	return true
}

// syncRestore acts on a claim's restore request; again > 0: look again
// after that long.
func (c *Controller) syncRestore(ctx context.Context, key string) (again time.Duration, err error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil
	}
	pvc, err := c.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.waitDone(key)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	from := pvc.Annotations[AnnRestoreFrom]
	st, state := restoreStatusOf(pvc)
	switch {
	case state == statusBad && from != "":
		// Not the leader's: whether the request it stood for was
		// answered cannot be told from it. Never taken for a new request.
		c.waitDone(key)
		now := time.Now().UTC()
		return 0, c.answerRestore(ctx, pvc, &RestoreStatus{From: fromKey(from), Phase: RestoreRefused, Request: newRequestID(), RequestedAt: now, FinishedAt: &now,
			Message: fmt.Sprintf("%s is not a status salt-volumes writes (unreadable, cut short or changed): whether the request it stood for ran is not known; nothing was changed now; look at the volume's data, then ask again by setting it empty (%s)", AnnRestoreStatus, askAgain(pvc))})
	case st != nil && st.Phase == RestoreRestoring:
		// Answered first, even if the request changed or went since: a
		// new one is looked at once this one's outcome is written.
		return c.followRestore(ctx, pvc, st, from)
	case from == "" || st != nil && st.From == fromKey(from):
		c.waitDone(key)
		return 0, nil // none, or answered: never again for this request
	}
	return c.startRestore(ctx, pvc, key, from, state == statusNone)
}

// waitKey is the request of claim key waited for.
func waitKey(key, from string) string { return key + "\x00" + fromKey(from) }

// waited is how long the claim's new request has waited (for its
// snapshot), counting from its first wait; done forgets it.
func (c *Controller) waited(key, from string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.restoreWaits == nil {
		c.restoreWaits = map[string]time.Time{}
	}
	k := waitKey(key, from)
	first, ok := c.restoreWaits[k]
	if !ok {
		c.restoreWaits[k] = time.Now()
		return 0
	}
	return time.Since(first)
}

// waitDone forgets every wait of claim key.
func (c *Controller) waitDone(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.restoreWaits {
		if strings.HasPrefix(k, key+"\x00") {
			delete(c.restoreWaits, k)
		}
	}
}

// startRestore checks a new request and, if it holds, records the intent
// on the claim and asks for the restore. statusGone: the claim has no
// status at all (not even an empty one): the request may be one already
// answered whose status was lost.
func (c *Controller) startRestore(ctx context.Context, pvc *corev1.PersistentVolumeClaim, key, from string, statusGone bool) (time.Duration, error) {
	src, refuse, err := c.restoreSource(ctx, pvc, from)
	if errors.Is(err, errRestoreWaiting) {
		waited := c.waited(key, from)
		if waited < restoreWaitLimit {
			return restoreWaitAfter(waited), nil
		}
		refuse = fmt.Sprintf("VolumeSnapshot %s's snapshot is still not Ready after %s: nothing was changed; ask again once it is (%s)", from, restoreWaitLimit, askAgain(pvc))
	} else if err != nil {
		return 0, err
	}
	c.waitDone(key)
	now := time.Now().UTC()
	st := &RestoreStatus{From: fromKey(from), Request: newRequestID(), RequestedAt: now}
	if refuse != "" {
		st.Phase, st.FinishedAt, st.Message = RestoreRefused, &now, refuse
		return 0, c.answerRestore(ctx, pvc, st)
	}
	st.Object = src.obj.UID
	if statusGone {
		if again, done, err := c.answeredBefore(ctx, pvc, st, src.snap); done || err != nil {
			return again, err
		}
	}
	st.Phase, st.Snapshot = RestoreRestoring, src.snap.Name
	// The intent first: once it is on the claim, whatever happens next is
	// followed by its id, never asked a second time.
	pvc, err = c.writeRestoreStatus(ctx, pvc, st)
	if err != nil || pvc == nil {
		return 0, err
	}
	return c.askRestore(ctx, pvc, src.v, st)
}

// answeredBefore writes back the status of a request the control plane
// already answered (or is restoring): the snapshot's last restore is
// this claim's (uid), from this object (uid), for this value. Then a
// status dropped by a sync, or removed by hand, is not a second restore;
// setting it empty is. done: written back (or being written).
func (c *Controller) answeredBefore(ctx context.Context, pvc *corev1.PersistentVolumeClaim, st *RestoreStatus, snap snapshots.Snapshot) (time.Duration, bool, error) {
	r := snap.Restore
	if r == nil {
		return 0, false, nil
	}
	m := restoreByRequest.FindStringSubmatch(r.RequestedBy)
	if m == nil {
		return 0, false, nil
	}
	was := &RestoreStatus{From: st.From, Request: m[1], Snapshot: snap.Name, Object: st.Object, RequestedAt: r.RequestedAt}
	if r.RequestedBy != restoreBy(pvc, was) {
		return 0, false, nil
	}
	note := fmt.Sprintf("written back from the control plane's record of request %s: the claim's %s was removed after it was answered; to restore from VolumeSnapshot %s once more, set it empty (%s)",
		was.Request, AnnRestoreStatus, st.From, askAgain(pvc))
	c.log.Info("claim's restore status was gone: written back from the snapshot's record, not asked again", "claim", pvc.Namespace+"/"+pvc.Name, "volumeSnapshot", st.From, "request", was.Request)
	switch r.Phase {
	case snapshots.Restoring:
		was.Phase = RestoreRestoring
		_, err := c.writeRestoreStatus(ctx, pvc, was)
		return restoreFollowEvery, true, err
	case snapshots.Restored:
		was.Phase, was.Message = RestoreRestored, restoredMessage(r)+"; "+note
	default:
		was.Phase, was.Message = RestoreFailed, cut(r.Message, 1024)+"; "+note
	}
	was.FinishedAt = r.FinishedAt
	if was.FinishedAt == nil {
		now := time.Now().UTC()
		was.FinishedAt = &now
	}
	return 0, true, c.answerRestore(ctx, pvc, was)
}

// restoreBusy tells a refusal of the snapshots service that passes by
// itself (another job of the volume's snapshots runs, the volume is not
// Available yet) from one that stays.
func restoreBusy(se *snapshots.Error) bool {
	return strings.HasSuffix(se.Msg, "restore it once that has finished") || strings.Contains(se.Msg, "restore it once it is Available")
}

// askRestore asks the snapshots service for the restore recorded in st.
func (c *Controller) askRestore(ctx context.Context, pvc *corev1.PersistentVolumeClaim, v *volume.Volume, st *RestoreStatus) (time.Duration, error) {
	// Leading, and the snapshots service in this term (its writes fenced
	// on it), right before the record is written: a deposed leader asks
	// nothing. Looked at again in a moment (then dropped if not leading:
	// the next leader follows the claim's intent).
	if !c.leading() || c.cfg.Leading != nil && !c.snaps.LeadsTerm() {
		return restoreFollowEvery, nil
	}
	snap, started, err := c.snaps.Restore(ctx, v, st.Snapshot, restoreBy(pvc, st))
	var se *snapshots.Error
	if errors.As(err, &se) {
		if restoreBusy(se) {
			return c.waitOrRefuse(ctx, pvc, st, se.Msg)
		}
		now := time.Now().UTC()
		st.Phase, st.FinishedAt, st.Message = RestoreRefused, &now, fmt.Sprintf("%s: nothing was changed; ask again once that is fixed (%s)", cut(se.Msg, 1024), askAgain(pvc))
		return 0, c.answerRestore(ctx, pvc, st)
	}
	if err != nil {
		return 0, fmt.Errorf("asking for the restore of volume %s from snapshot %s: %w", v.Spec.Name, st.Snapshot, err)
	}
	if started {
		c.log.Info("claim's volume being restored from its snapshot", "claim", pvc.Namespace+"/"+pvc.Name, "volumeSnapshot", st.From,
			"snapshot", snap.Name, "volume", v.Spec.Name, "node", v.Spec.Node, "request", st.Request)
		c.event(claimRef(pvc), corev1.EventTypeNormal, "Restoring", fmt.Sprintf("salt-volumes is putting volume %s back to VolumeSnapshot %s (snapshot %s) on Salt minion %s",
			v.Spec.Name, st.From, snap.Name, v.Spec.Node))
	}
	// Not started: a restore from that snapshot runs already (asked
	// through the API); this request is asked again once it ends.
	return restoreFollowEvery, nil
}

// waitOrRefuse has request st (its intent on the claim, nothing asked of
// the node) wait for why to pass, counted from its request, for
// restoreWaitLimit at most; then it is Refused.
func (c *Controller) waitOrRefuse(ctx context.Context, pvc *corev1.PersistentVolumeClaim, st *RestoreStatus, why string) (time.Duration, error) {
	waited := time.Since(st.RequestedAt)
	if waited < restoreWaitLimit {
		return restoreWaitAfter(max(waited, 0)), nil
	}
	return c.restoreEnds(ctx, pvc, st, RestoreRefused, fmt.Sprintf("%s, still after %s: nothing was changed; ask again once that has finished (%s)", cut(why, 1024), restoreWaitLimit, askAgain(pvc)))
}

// followRestore follows a request the claim says was asked, by its id in
// the snapshot's record.
func (c *Controller) followRestore(ctx context.Context, pvc *corev1.PersistentVolumeClaim, st *RestoreStatus, from string) (time.Duration, error) {
	snap, owner, err := c.snaps.Lookup(ctx, st.Snapshot)
	if err != nil && !errors.Is(err, snapshots.ErrNotFound) {
		return 0, err
	}
	// The status is on the claim, where its owner may write too: the
	// snapshot it names is read only if it is the object's of this
	// namespace, by the name and uid asked for.
	if err != nil || owner == nil || owner.Namespace != pvc.Namespace || owner.Name != st.From || owner.UID != string(st.Object) {
		return c.restoreEnds(ctx, pvc, st, RestoreFailed, fmt.Sprintf("snapshot %s is no longer VolumeSnapshot %s's (uid %s): whether the restore ran is not known; look at the volume's data before asking again (%s)",
			st.Snapshot, st.From, st.Object, askAgain(pvc)))
	}
	r := snap.Restore
	mine := r != nil && r.RequestedBy == restoreBy(pvc, st)
	switch {
	case mine && r.Phase == snapshots.Restoring:
		return restoreFollowEvery, nil
	case mine && r.Phase == snapshots.Restored:
		return c.restoreEnds(ctx, pvc, st, RestoreRestored, restoredMessage(r))
	case mine:
		return c.restoreEnds(ctx, pvc, st, RestoreFailed, failedMessage(pvc, r.Message))
	case r != nil && r.Phase == snapshots.Restoring:
		return restoreFollowEvery, nil // another's runs: this one is asked once it ends
	case r != nil && r.RequestedAt.After(st.RequestedAt):
		// A later restore of that snapshot replaced this one's record:
		// whether this one ran cannot be told.
		return c.restoreEnds(ctx, pvc, st, RestoreFailed, fmt.Sprintf("the snapshot's last restore is another's (%s, at %s): whether this one ran is not known; look at the volume's data before asking again (%s)",
			cut(r.RequestedBy, maxQuoted), r.RequestedAt.Format(time.RFC3339), askAgain(pvc)))
	}
	if snap.TakenAt != nil && snap.TakenAt.After(st.RequestedAt) {
		// The snapshot of that name was taken after this request: not
		// the one asked for (taken again under the object's name), and
		// whether this request ran is not known: never asked again.
		return c.restoreEnds(ctx, pvc, st, RestoreFailed, fmt.Sprintf("snapshot %s was taken at %s, after this request (%s): it is not the snapshot asked for, and whether the restore ran is not known; look at the volume's data before asking again (%s)",
			st.Snapshot, snap.TakenAt.Format(time.RFC3339), st.RequestedAt.Format(time.RFC3339), askAgain(pvc)))
	}
	// Never reached the snapshot's record (serve stopped between the
	// claim's status and the request, or the request failed or waited):
	// asked now, after the same checks as a new one, unless the claim's
	// owner withdrew or replaced it meanwhile, or the object is another
	// one now (made again under that name).
	if fromKey(from) != st.From {
		return c.restoreEnds(ctx, pvc, st, RestoreRefused, fmt.Sprintf("%s is %s now: this request was withdrawn before it reached the node; nothing was changed", AnnRestoreFrom, quote(from)))
	}
	src, refuse, err := c.restoreSource(ctx, pvc, st.From)
	if errors.Is(err, errRestoreWaiting) {
		return c.waitOrRefuse(ctx, pvc, st, fmt.Sprintf("VolumeSnapshot %s's snapshot is not Ready", st.From))
	}
	if err != nil {
		return 0, err
	}
	switch {
	case refuse != "":
	case src.obj.UID != st.Object:
		refuse = fmt.Sprintf("VolumeSnapshot %s is another object now (uid %s, asked: %s): this request was not carried over to it; nothing was changed; ask again (%s)", st.From, src.obj.UID, st.Object, askAgain(pvc))
	case src.snap.Name != st.Snapshot:
		refuse = fmt.Sprintf("VolumeSnapshot %s's snapshot is %s now, not %s: nothing was changed; ask again (%s)", st.From, src.snap.Name, st.Snapshot, askAgain(pvc))
	}
	if refuse != "" {
		return c.restoreEnds(ctx, pvc, st, RestoreRefused, refuse)
	}
	return c.askRestore(ctx, pvc, src.v, st)
}

// methodLVMThick is a thick LVM snapshot's method (the node's answer).
const methodLVMThick = "lvm-thick"

// failedMessage is a failed restore's message with the fix: a volume in
// use (the node names the mount and the process) is restored once the
// claim's pods are stopped.
func failedMessage(pvc *corev1.PersistentVolumeClaim, msg string) string {
	msg = cut(msg, 1024)
	if strings.Contains(msg, "in use") || strings.Contains(msg, "in_use") {
		return fmt.Sprintf("%s; stop the pods that use claim %s (scale their workload to 0), then ask again (%s)", msg, pvc.Name, askAgain(pvc))
	}
	return fmt.Sprintf("%s; ask again once that is fixed (%s)", msg, askAgain(pvc))
}

func restoredMessage(r *saltvolumes.SnapshotRestore) string {
	msg := "restored"
	if r.Method != "" {
		msg += " (" + r.Method
		if r.Took != "" {
			msg += ", " + r.Took
		}
		msg += ")"
	}
	for _, w := range r.Warnings {
		msg += "; " + w
	}
	return cut(msg, 1024)
}

// restoreEnds writes a request's outcome.
func (c *Controller) restoreEnds(ctx context.Context, pvc *corev1.PersistentVolumeClaim, st *RestoreStatus, phase, msg string) (time.Duration, error) {
	now := time.Now().UTC()
	st.Phase, st.FinishedAt, st.Message = phase, &now, msg
	return 0, c.answerRestore(ctx, pvc, st)
}

// answerRestore writes a request's outcome on the claim, then says it
// with an Event (only once written: a conflict is read again and
// answered then).
func (c *Controller) answerRestore(ctx context.Context, pvc *corev1.PersistentVolumeClaim, st *RestoreStatus) error {
	written, err := c.writeRestoreStatus(ctx, pvc, st)
	if err != nil || written == nil {
		return err
	}
	kind, reason := corev1.EventTypeWarning, "RestoreRefused"
	switch st.Phase {
	case RestoreRestored:
		kind, reason = corev1.EventTypeNormal, "Restored"
	case RestoreFailed:
		reason = "RestoreFailed"
	}
	msg := st.Message
	if st.Phase == RestoreRestored {
		msg = fmt.Sprintf("volume %s put back to VolumeSnapshot %s (snapshot %s): %s", pvc.Spec.VolumeName, st.From, st.Snapshot, st.Message)
	}
	c.log.Info("claim's restore answered", "claim", pvc.Namespace+"/"+pvc.Name, "volumeSnapshot", st.From, "phase", st.Phase, "message", st.Message)
	c.event(claimRef(pvc), kind, reason, msg)
	return nil
}

// writeRestoreStatus writes st on the claim, conditioned on the claim as
// read (its resourceVersion) and on this replica leading. nil and no
// error: not written (the claim changed, or leadership was lost); the
// watch brings the claim back.
func (c *Controller) writeRestoreStatus(ctx context.Context, pvc *corev1.PersistentVolumeClaim, st *RestoreStatus) (*corev1.PersistentVolumeClaim, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	if !c.leading() {
		return nil, nil
	}
	upd := pvc.DeepCopy()
	if upd.Annotations == nil {
		upd.Annotations = map[string]string{}
	}
	upd.Annotations[AnnRestoreStatus] = string(b)
	got, err := c.cs.CoreV1().PersistentVolumeClaims(pvc.Namespace).Update(ctx, upd, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("writing %s on claim %s/%s: %w", AnnRestoreStatus, pvc.Namespace, pvc.Name, err)
	}
	return got, nil
}

func claimRef(pvc *corev1.PersistentVolumeClaim) *saltvolumes.Claim {
	return &saltvolumes.Claim{Namespace: pvc.Namespace, Name: pvc.Name, UID: string(pvc.UID)}
}

// askAgain is how the claim's owner asks for a restore once more: the
// status set empty (removed, it is written back when the request was
// answered: answeredBefore).
func askAgain(pvc *corev1.PersistentVolumeClaim) string {
	return fmt.Sprintf("kubectl annotate --overwrite pvc -n %s %s %s=", pvc.Namespace, pvc.Name, AnnRestoreStatus)
}

// restoreSrc is what a request restores: the claim's volume, the object
// asked for and its snapshot.
type restoreSrc struct {
	v    *volume.Volume
	obj  snapshotObject
	snap snapshots.Snapshot
}

// restoreSource checks a request: the claim is bound to a volume of ours,
// the VolumeSnapshot object of that name is in the claim's namespace, and
// its snapshot (owned by that object: namespace, name and uid) is of this
// very volume and Ready. refuse says why not, and the fix, naming nothing
// of another namespace.
func (c *Controller) restoreSource(ctx context.Context, pvc *corev1.PersistentVolumeClaim, from string) (restoreSrc, string, error) {
	var none restoreSrc
	ns := pvc.Namespace
	if errs := validation.IsDNS1123Subdomain(from); len(errs) > 0 {
		return none, fmt.Sprintf("%s: %q is not the name of a VolumeSnapshot: give the name of a VolumeSnapshot (salt-volumes.io) of namespace %s; a claim is restored only from its own namespace's objects", AnnRestoreFrom, cut(from, maxQuoted), ns), nil
	}
	if c.snaps == nil {
		return none, "this control plane keeps no snapshots: nothing to restore from", nil
	}
	held, ok := heldVolume(c.pvs, pvc)
	if !ok {
		return none, fmt.Sprintf("claim %s is not bound to its PersistentVolume: only a bound claim's volume is restored in place; a new claim starts from a snapshot with dataSourceRef: {apiGroup: %s, kind: %s, name: %s}", pvc.Name, ourGroup, kindSnapshot, from), nil
	}
	v, err := c.vols.Get(held)
	if err != nil {
		return none, fmt.Sprintf("claim %s is bound to PersistentVolume %s, which is not a salt-volumes volume: nothing to restore", pvc.Name, held), nil
	}
	obj, err := c.readSnapshotObject(ctx, ns, from)
	if errors.Is(err, errNoObject) {
		return none, fmt.Sprintf("%s: no VolumeSnapshot %s in namespace %s (kubectl get volumesnapshots.salt-volumes.io -n %s): a claim is restored only from a VolumeSnapshot object of its own namespace", AnnRestoreFrom, from, ns, ns), nil
	}
	if err != nil {
		return none, "", fmt.Errorf("reading VolumeSnapshot %s/%s: %w", ns, from, err)
	}
	snap, found, err := c.objectSnapshot(ctx, snapshots.Owner{Namespace: ns, Name: from, UID: string(obj.UID)})
	if err != nil {
		return none, "", err
	}
	if !found {
		switch obj.Phase {
		case snapshots.Failed:
			return none, fmt.Sprintf("VolumeSnapshot %s failed: %s", from, cut(obj.Message, 1024)), nil
		case snapshots.Ready:
			// Its snapshot was, and is gone: pruned by a schedule, forgotten
			// with its node, deleted through the API.
			return none, fmt.Sprintf("VolumeSnapshot %s is Ready but its snapshot is gone (pruned by a schedule, forgotten with its node or deleted through the API): nothing to restore from; nothing was changed", from), nil
		}
		return none, "", errRestoreWaiting // not taken yet
	}
	if snap.VolumeUUID != v.Spec.UUID {
		return none, fmt.Sprintf("VolumeSnapshot %s is a snapshot of volume %s, not of this claim's volume %s: a volume is put back only to a snapshot of its own; a new claim starts from it with dataSourceRef: {apiGroup: %s, kind: %s, name: %s}", from, snap.Volume, v.Spec.Name, ourGroup, kindSnapshot, from), nil
	}
	switch snap.Phase {
	case snapshots.Ready:
		if snap.Method == methodLVMThick {
			// Its restore uses it up (LVM merges it into the volume), and
			// the object would then take a new snapshot under its name,
			// which a claim's restore could be asked from again.
			return none, fmt.Sprintf("VolumeSnapshot %s's snapshot %s is a thick LVM snapshot, which a restore in place uses up (LVM merges it into the volume): a claim is not restored from one; a new claim starts from it with dataSourceRef: {apiGroup: %s, kind: %s, name: %s}, or an operator restores it through the API (salt-volumes snapshot restore %s); nothing was changed", from, snap.Name, ourGroup, kindSnapshot, from, snap.Name), nil
		}
		return restoreSrc{v: v, obj: obj, snap: snap}, "", nil
	case snapshots.Pending:
		return none, "", errRestoreWaiting
	}
	return none, fmt.Sprintf("VolumeSnapshot %s's snapshot %s is %s: %s", from, snap.Name, snap.Phase, cut(snap.Message, 1024)), nil
}

// objectSnapshot is the snapshot that belongs to object o (namespace, name
// and uid): its own (SnapshotName), or an existing one bound to it.
func (c *Controller) objectSnapshot(ctx context.Context, o snapshots.Owner) (snapshots.Snapshot, bool, error) {
	snap, owner, err := c.snaps.Lookup(ctx, SnapshotName(o.Namespace, o.Name))
	if err != nil && !errors.Is(err, snapshots.ErrNotFound) {
		return snapshots.Snapshot{}, false, err
	}
	if err == nil && owner.Is(&o) {
		return snap, true, nil
	}
	owned, err := c.snaps.OwnedBy(ctx, o.Namespace, o.Name)
	if err != nil {
		return snapshots.Snapshot{}, false, err
	}
	for _, s := range owned {
		snap, owner, err := c.snaps.Lookup(ctx, s.Name)
		if err == nil && owner.Is(&o) {
			return snap, true, nil
		}
	}
	return snapshots.Snapshot{}, false, nil
}

// readSnapshotObject reads VolumeSnapshot ns/name from the API server
// (the leader's one read per request; errNoObject when there is none).
func (c *Controller) readSnapshotObject(ctx context.Context, ns, name string) (snapshotObject, error) {
	if c.snapshotObjects != nil {
		return c.snapshotObjects(ctx, ns, name)
	}
	rc := c.cs.Discovery().RESTClient()
	if rc == nil {
		return snapshotObject{}, errors.New("no REST client to read VolumeSnapshot objects with")
	}
	gv := SnapshotResource.GroupVersion()
	raw, err := rc.Get().AbsPath("/apis", gv.Group, gv.Version, "namespaces", ns, SnapshotResource.Resource, name).DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return snapshotObject{}, errNoObject
	}
	if err != nil {
		return snapshotObject{}, err
	}
	var obj struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Status   struct {
			Phase   string `json:"phase"`
			Message string `json:"message"`
		} `json:"status"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return snapshotObject{}, fmt.Errorf("VolumeSnapshot %s/%s: %w", ns, name, err)
	}
	return snapshotObject{UID: obj.Metadata.UID, Phase: obj.Status.Phase, Message: obj.Status.Message}, nil
}
