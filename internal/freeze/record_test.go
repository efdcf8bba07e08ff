package freeze

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A record is stale only when its watchdog is gone, in this boot, without
// having said it thawed: that is the one freeze a later run may undo.
func TestRecordStale(t *testing.T) {
	self := os.Getpid()
	start := processStart(self)
	require.NotZero(t, start, "our own start time")
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	boot := BootID()
	require.NotEmpty(t, boot)

	for _, tc := range []struct {
		name  string
		rec   Record
		stale bool
	}{
		{"its watchdog runs", Record{WatchdogPID: self, WatchdogStart: start, BootID: boot}, false},
		{"its watchdog is gone", Record{WatchdogPID: gone.Process.Pid, WatchdogStart: 1, BootID: boot}, true},
		{"its pid is another process now", Record{WatchdogPID: self, WatchdogStart: start + 1, BootID: boot}, true},
		{"its watchdog thawed on its own", Record{WatchdogPID: gone.Process.Pid, WatchdogStart: 1, BootID: boot, Thawed: ThawedParentGone}, false},
		{"its watchdog's thaw failed", Record{WatchdogPID: gone.Process.Pid, WatchdogStart: 1, BootID: boot, Thawed: ThawedAtBound, ThawError: "thawing /mnt: input/output error"}, true},
		{"its thaw found it thawed", Record{WatchdogPID: gone.Process.Pid, WatchdogStart: 1, BootID: boot, Thawed: ThawedAtBound, ThawError: "thawing /mnt: " + ErrNotFrozen.Error()}, false},
		{"another boot's", Record{WatchdogPID: gone.Process.Pid, WatchdogStart: 1, BootID: "another"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.stale, tc.rec.Stale())
		})
	}
}

// Settle removes a record of another boot without touching anything; one
// whose mountpoint is not the recorded filesystem it keeps, thawing
// nothing (removed only when an operator forces it); a stale one past
// the time it could only be ours it keeps and leaves alone.
func TestSettleWithoutThawing(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.freeze")
	now := time.Now()
	for _, tc := range []struct {
		rec   Record
		force bool
		what  string
		kept  bool
	}{
		{Record{Version: 1, Mountpoint: dir, BootID: "another", FrozenAt: now}, false, SettledOtherBoot, false},
		{Record{Version: 1, Mountpoint: dir, BootID: BootID(), FrozenAt: now, Limit: "1s", Identity: Identity{Dev: "0:0", MountID: 1}}, false, SettledNotSame, true},
		{Record{Version: 1, Mountpoint: filepath.Join(dir, "gone"), BootID: BootID(), FrozenAt: now, Limit: "1s"}, false, SettledNotSame, true},
		{Record{Version: 1, Mountpoint: filepath.Join(dir, "gone"), BootID: BootID(), FrozenAt: now, Limit: "1s"}, true, SettledNotSame, false},
		{Record{Version: 1, Mountpoint: dir, BootID: BootID(), FrozenAt: now.Add(-time.Minute), Limit: "1s"}, false, SettledStaleLeft, true},
		{Record{Version: 1, Mountpoint: dir, BootID: BootID(), FrozenAt: now, ThawBy: now.Add(-StaleGrace - time.Second)}, false, SettledStaleLeft, true},
	} {
		require.NoError(t, WriteRecord(p, &tc.rec))
		s, err := Settle(p, time.Second, tc.force)
		require.NoError(t, err)
		assert.Equal(t, tc.what, s.What)
		assert.Equal(t, tc.kept, s.Kept)
		_, err = os.Stat(p)
		assert.Equal(t, !tc.kept, os.IsNotExist(err), "removed unless kept")
		require.NoError(t, RemoveRecord(p))
	}
	s, err := Settle(p, time.Second, false)
	assert.NoError(t, err)
	assert.Nil(t, s, "no record, nothing to settle")
}
