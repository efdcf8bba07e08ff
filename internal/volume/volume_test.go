package volume

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

func TestDeletionCriteria(t *testing.T) {
	cases := []struct {
		phase  Phase
		inUse  bool
		can    bool
		reason string
	}{
		{Unknown, false, true, ""},
		{Pending, false, true, ""},
		{Terminating, false, false, "already being deleted"},
		{Available, true, false, "in use"},
		{Failed, true, false, "in use"},
		{Available, false, true, ""},
		{Failed, false, true, ""},
	}
	for _, c := range cases {
		v := &Volume{Status: Status{Status: saltvolumes.Status{Phase: c.phase, InUse: c.inUse}}}
		v.Spec.Node = "node-1"
		can, why := CanDelete(v)
		assert.Equal(t, c.can, can, "%s inUse=%v", c.phase, c.inUse)
		assert.Contains(t, why, c.reason)
	}
	assert.Equal(t, "Unknown", Unknown.String())
}

func TestViewOfARequestedDeletion(t *testing.T) {
	for _, c := range []struct {
		phase  Phase
		job    string
		reason string
	}{
		{Unknown, "", "starts once the creation ends"},
		{Pending, "20261124", "starts once the creation ends"},
		{Available, "", "already being deleted"},
		{Terminating, "20261124", "already being deleted"},
	} {
		v := &Volume{DeleteRequested: true}
		v.Status.Phase, v.Status.JobID = c.phase, c.job
		view := v.View()
		assert.True(t, view.Deleting, c.phase)
		assert.False(t, view.Deletable, "%s: a deletion is requested once", c.phase)
		assert.Contains(t, view.DeleteBlockedReason, c.reason, c.phase)
	}
}

// A real return of state.apply salt_volumes.prepared (as seen in the job
// return event, decoded from JSON).
const realPrepared = `{"salt_volumes_|-salt_volumes v1_|-v1_|-prepared": {"name": "v1", "result": true,
 "changes": {}, "comment": "Volume v1 prepared at /dev/disk/by-uuid/u",
 "volume": {"name": "v1", "uuid": "u", "size": 33554432, "devicePath": "/dev/loop0", "deviceName": "loop0",
 "persistentPath": "/dev/disk/by-uuid/u", "state": "prepared", "inUse": false},
 "__sls__": "salt_volumes.prepared", "__run_num__": 0, "__id__": "salt_volumes v1"}}`

// decode is the answer as the job cache gives it: JSON.
func decode(t *testing.T, s string) json.RawMessage {
	require.True(t, json.Valid([]byte(s)), s)
	return json.RawMessage(s)
}

func TestParseStateReturn(t *testing.T) {
	o := ParseStateReturn(0, decode(t, realPrepared))
	require.True(t, o.OK)
	var st Status
	st.ApplyDevice(o.Device)
	assert.Equal(t, Status{Status: saltvolumes.Status{DeviceName: "loop0", DevicePath: "/dev/loop0", PersistentPath: "/dev/disk/by-uuid/u", Size: 33554432}}, st)

	failed := `{"a": {"result": false, "comment": "volume v1: rawBlockDevice.devicePath: /dev/nope does not exist on this node", "__run_num__": 0},
	            "b": {"result": false, "comment": "One or more requisite failed: a", "__run_num__": 1}}`
	o = ParseStateReturn(2, decode(t, failed))
	assert.False(t, o.OK)
	assert.Equal(t, "volume v1: rawBlockDevice.devicePath: /dev/nope does not exist on this node", o.Message)
	assert.False(t, o.Retryable)

	o = ParseStateReturn(1, decode(t, `["Rendering SLS 'base:salt_volumes.prepared' failed: mapping values are not allowed"]`))
	assert.False(t, o.OK)
	assert.Contains(t, o.Message, "did not render")
	assert.False(t, o.ModulesMissing)

	// A reinstalled minion's new cache: the message Salt 3008 gives.
	o = ParseStateReturn(1, decode(t, `["Rendering SLS 'base:salt_volumes.unprepared' failed: Jinja variable 'salt.utils.templates.AliasedLoader object' has no attribute 'salt_volumes.volumes'; line 4"]`))
	assert.True(t, o.ModulesMissing)
	assert.False(t, o.Retryable, "the reconciler decides whether to sync and run again")
	assert.Contains(t, o.Message, "saltutil.sync_all")

	o = ParseStateReturn(1, decode(t, `["The function \"state.apply\" is running as PID 4242 and was started at 2026 with jid 1"]`))
	assert.True(t, o.Retryable, "a concurrent state run is retried, not failed")

	o = ParseStateReturn(1, decode(t, `"ERROR: salt_volumes.prepare failed"`))
	assert.Equal(t, "ERROR: salt_volumes.prepare failed", o.Message)
	o = ParseStateReturn(0, nil)
	assert.False(t, o.OK)
	o = ParseStateReturn(0, decode(t, `null`))
	assert.Contains(t, o.Message, "returned nothing")
	o = ParseStateReturn(1, decode(t, `{"a": {"result": false, "comment": ["first", "second"], "__run_num__": 0}}`))
	assert.Equal(t, "first; second", o.Message, "Salt gives some comments as lists")

	o = ParseStateReturn(2, decode(t, `{"a": {"result": true, "__run_num__": 0}}`))
	assert.False(t, o.OK, "a non-zero retcode is a failure even if every state looks fine")
	assert.Contains(t, o.Message, "retcode 2")
}

func TestCanDeleteFollowsThePersistentVolume(t *testing.T) {
	for phase, want := range map[string]string{
		"Available": "", "Released": "", "Failed": "",
		"Bound":   "is Bound to apps/data: delete that claim",
		"Pending": "is Pending: wait",
	} {
		v := &Volume{Status: Status{Status: saltvolumes.Status{Phase: Available,
			PersistentVolume: &saltvolumes.PersistentVolume{Name: "pv-1", Phase: phase, Claim: "apps/data"}}}}
		ok, why := CanDelete(v)
		if want == "" {
			assert.True(t, ok, phase)
			continue
		}
		assert.False(t, ok, phase)
		assert.Contains(t, why, want, phase)
	}
}
