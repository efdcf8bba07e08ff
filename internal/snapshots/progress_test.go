package snapshots

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// A snapshot's copy and a restore's show their bytes while their job
// runs: the report of the volume's own node, saved at most every 5 s but
// for the last, and gone once the job ends. Reports from another node,
// for another volume, or from before the job started are not shown.
func TestProgressShowsTheRunningJobsCopy(t *testing.T) {
	s, f, v := setup(t)
	ctx := context.Background()
	get := func(name string) Snapshot {
		t.Helper()
		got, err := s.Get(ctx, name)
		require.NoError(t, err)
		return got
	}
	// The save is due: the record was last written over 5 s ago.
	age := func(name string) {
		t.Helper()
		s.mu.Lock()
		defer s.mu.Unlock()
		r, err := s.read(ctx, name)
		require.NoError(t, err)
		r.UpdatedAt = r.UpdatedAt.Add(-progressSaveEvery)
		b, err := json.Marshal(r)
		require.NoError(t, err)
		require.NoError(t, s.Records.PutRecord(ctx, Kind, name, b))
	}

	s.Progress("node-1", v.Spec.UUID, "copying", 1, 100) // before any job: not its
	_, _, err := s.Take(ctx, v, "before", "alice")
	require.NoError(t, err)
	s.pass(ctx)
	s.Progress("node-1", v.Spec.UUID, "copying", 0, 1<<30)
	s.pass(ctx)
	assert.Nil(t, get("before").Progress, "the job was just started: the next save is due in 5 s")
	age("before")
	s.Progress("node-2", v.Spec.UUID, "copying", 7, 1<<30) // another node's word: not taken, nor hiding the node's
	s.pass(ctx)
	assert.Equal(t, &saltvolumes.Progress{Step: "copying", Done: 0, Total: 1 << 30}, get("before").Progress)
	age("before")
	s.Progress("node-1", v.Spec.UUID, "copying", 1<<29, 1<<30)
	s.Progress("node-1", "00000000-0000-4000-8000-000000000000", "copying", 3, 4) // another volume
	s.pass(ctx)
	assert.Equal(t, &saltvolumes.Progress{Step: "copying", Done: 1 << 29, Total: 1 << 30}, get("before").Progress)
	s.Progress("node-1", v.Spec.UUID, "copying", 3<<28, 1<<30)
	s.pass(ctx)
	assert.Equal(t, int64(1<<29), get("before").Progress.Done, "saved at most every 5 s")
	s.Progress("node-1", v.Spec.UUID, "copying", 1<<30, 1<<30)
	s.pass(ctx)
	assert.Equal(t, int64(1<<30), get("before").Progress.Done, "the last report is saved at once")
	for _, bad := range [][2]int64{{-1, 10}, {11, 10}, {0, 0}} {
		s.Progress("node-1", v.Spec.UUID, "copying", bad[0], bad[1])
	}
	f.answer(f.lastJID(), 0, map[string]any{"name": "before", "volumeUUID": v.Spec.UUID, "method": "sparse-copy"})
	s.pass(ctx)
	got := get("before")
	assert.Equal(t, Ready, got.Phase)
	assert.Nil(t, got.Progress, "gone once the job ended")

	// A restore's copy, on its own field.
	_, _, err = s.Restore(ctx, v, "before", "bob")
	require.NoError(t, err)
	s.pass(ctx)
	s.Progress("node-1", v.Spec.UUID, "copying", 5, 10)
	age("before")
	s.pass(ctx)
	got = get("before")
	require.NotNil(t, got.Restore)
	assert.Equal(t, &saltvolumes.Progress{Step: "copying", Done: 5, Total: 10}, got.Restore.Progress)
	assert.Nil(t, got.Progress)
	f.answer(f.lastJID(), 0, map[string]any{"snapshot": "before", "method": "sparse-copy", "volume": map[string]any{"uuid": v.Spec.UUID}})
	s.pass(ctx)
	got = get("before")
	assert.Equal(t, Restored, got.Restore.Phase)
	assert.Nil(t, got.Restore.Progress, "gone once the restore ended")
}

// A minion that fires reports for made-up volumes fills a bounded table.
func TestProgressNotesAreBounded(t *testing.T) {
	s, _, _ := setup(t)
	for i := 0; i < maxProgressNotes+100; i++ {
		s.Progress("node-1", fmt.Sprintf("00000000-0000-4000-8000-%012d", i), "copying", 1, 2)
	}
	s.progMu.Lock()
	defer s.progMu.Unlock()
	assert.Len(t, s.prog, maxProgressNotes)
	// Old ones make room.
	for u, n := range s.prog {
		n.at = time.Now().Add(-2 * restoreJobLimit)
		s.prog[u] = n
		break
	}
	s.progMu.Unlock()
	s.Progress("node-1", "11111111-0000-4000-8000-000000000000", "copying", 1, 2)
	s.progMu.Lock()
	_, ok := s.prog["node-1/11111111-0000-4000-8000-000000000000"]
	assert.True(t, ok)
}
