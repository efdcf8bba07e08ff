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

// Settle removes a record of another boot without touching anything, and
// one whose mountpoint is not the recorded filesystem without thawing it.
func TestSettleWithoutThawing(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.freeze")
	for _, tc := range []struct {
		rec  Record
		what string
	}{
		{Record{Version: 1, Mountpoint: dir, BootID: "another", FrozenAt: time.Now()}, SettledOtherBoot},
		{Record{Version: 1, Mountpoint: dir, BootID: BootID(), Identity: Identity{Dev: "0:0", MountID: 1}}, SettledNotSame},
		{Record{Version: 1, Mountpoint: filepath.Join(dir, "gone"), BootID: BootID()}, SettledNotSame},
	} {
		require.NoError(t, WriteRecord(p, &tc.rec))
		s, err := Settle(p, time.Second)
		require.NoError(t, err)
		assert.Equal(t, tc.what, s.What)
		_, err = os.Stat(p)
		assert.True(t, os.IsNotExist(err), "removed")
	}
	s, err := Settle(p, time.Second)
	assert.NoError(t, err)
	assert.Nil(t, s, "no record, nothing to settle")
}
