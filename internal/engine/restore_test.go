package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The last report carries the counts of the runs before it, a bounded few,
// across a reboot too (the control plane may not have read them yet).
func TestRestoreReportKeepsTheRunsBeforeIt(t *testing.T) {
	e := New(t.TempDir(), nil)
	boot, realBoot := "b1", bootID
	bootID = func() string { return boot }
	t.Cleanup(func() { bootID = realBoot })
	save := func(id string, restored int) *RestoreReport {
		rep := &RestoreReport{ID: id, At: time.Now().UTC(), Boot: bootID(), Restored: restored}
		require.NoError(t, e.saveRestore(rep))
		got, err := e.LastRestore()
		require.NoError(t, err)
		require.Equal(t, id, got.ID)
		return got
	}
	save("boot", 4)
	got := save("beacon", 1)
	require.Len(t, got.Earlier, 1)
	assert.Equal(t, "boot", got.Earlier[0].ID)
	assert.Equal(t, 4, got.Earlier[0].Restored)
	got = save("beacon", 1)
	assert.Len(t, got.Earlier, 1, "the same run saved again is not its own earlier run")

	for i := range 2 * keptRestores {
		got = save(fmt.Sprint("hand", i), 0)
	}
	require.Len(t, got.Earlier, keptRestores, "bounded")
	assert.Equal(t, fmt.Sprint("hand", 2*keptRestores-2), got.Earlier[keptRestores-1].ID, "the newest kept, oldest first")

	boot = "b2"
	got = save("after-reboot", 3)
	require.Len(t, got.Earlier, keptRestores)
	assert.Equal(t, "b1", got.Earlier[keptRestores-1].Boot, "the last run before the reboot")
	assert.Equal(t, "b2", got.Boot)
}
