package snapshots

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// progressRig is a service with volume v, and helpers to read a
// snapshot and to make its next save due (its record last written over
// progressSaveEvery ago).
func progressRig(t *testing.T) (*Service, *fakeSalt, func(string) Snapshot, func(string), string) {
	s, f, v := setup(t)
	ctx := context.Background()
	get := func(name string) Snapshot {
		t.Helper()
		got, err := s.Get(ctx, name)
		require.NoError(t, err)
		return got
	}
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
	return s, f, get, age, v.Spec.UUID
}

// A snapshot's copy and a restore's show their bytes while their job
// runs: the report of the volume's own node, saved at most every 5 s but
// for the last, and gone once the job ends. Reports from another node,
// for another volume, or from before the job started are not shown.
func TestProgressShowsTheRunningJobsCopy(t *testing.T) {
	s, f, get, age, u := progressRig(t)
	_, _, v := setup(t)
	ctx := context.Background()

	s.Progress("node-1", u, "copying", 1, 1, 100) // before any job: not its
	_, _, err := s.Take(ctx, v, "before", "alice")
	require.NoError(t, err)
	s.pass(ctx)
	s.Progress("node-1", u, "copying", 2, 0, 1<<30)
	s.pass(ctx)
	assert.Nil(t, get("before").Progress, "the job was just started: the next save is due in 5 s")
	age("before")
	s.Progress("node-2", u, "copying", 9, 7, 1<<30) // another node's word: not taken, nor hiding the node's
	s.pass(ctx)
	assert.Equal(t, &saltvolumes.Progress{Step: "copying", Done: 0, Total: 1 << 30}, get("before").Progress)
	age("before")
	s.Progress("node-1", u, "copying", 3, 1<<29, 1<<30)
	s.Progress("node-1", "00000000-0000-4000-8000-000000000000", "copying", 4, 3, 4) // another volume
	s.pass(ctx)
	assert.Equal(t, &saltvolumes.Progress{Step: "copying", Done: 1 << 29, Total: 1 << 30}, get("before").Progress)
	s.Progress("node-1", u, "copying", 4, 3<<28, 1<<30)
	s.pass(ctx)
	assert.Equal(t, int64(1<<29), get("before").Progress.Done, "saved at most every 5 s")
	s.Progress("node-1", u, "copying", 5, 1<<30, 1<<30)
	s.pass(ctx)
	assert.Equal(t, int64(1<<30), get("before").Progress.Done, "the last report is saved at once")
	for _, bad := range [][2]int64{{-1, 10}, {11, 10}, {0, 0}} {
		s.Progress("node-1", u, "copying", 6, bad[0], bad[1])
	}
	f.answer(f.lastJID(), 0, map[string]any{"name": "before", "volumeUUID": u, "method": "sparse-copy"})
	s.pass(ctx)
	got := get("before")
	assert.Equal(t, Ready, got.Phase)
	assert.Nil(t, got.Progress, "gone once the job ended")
	s.pass(ctx)
	s.progMu.Lock()
	assert.Empty(t, s.prog, "no job runs: no report kept")
	s.progMu.Unlock()

	// A restore's copy, on its own field.
	_, _, err = s.Restore(ctx, v, "before", "bob")
	require.NoError(t, err)
	s.pass(ctx)
	s.Progress("node-1", u, "copying", 1, 5, 10)
	age("before")
	s.pass(ctx)
	got = get("before")
	require.NotNil(t, got.Restore)
	assert.Equal(t, &saltvolumes.Progress{Step: "copying", Done: 5, Total: 10}, got.Restore.Progress)
	assert.Nil(t, got.Progress)
	f.answer(f.lastJID(), 0, map[string]any{"snapshot": "before", "method": "sparse-copy", "volume": map[string]any{"uuid": u}})
	s.pass(ctx)
	got = get("before")
	assert.Equal(t, Restored, got.Restore.Phase)
	assert.Nil(t, got.Restore.Progress, "gone once the restore ended")
	s.pass(ctx)
	s.progMu.Lock()
	assert.Empty(t, s.prog, "no job runs: no report kept")
	s.progMu.Unlock()
}

// What a hostile or confused sender can do: nothing beyond the progress
// shown, at the cost of one write each 5 s.
func TestProgressFromAHostileSender(t *testing.T) {
	s, _, get, age, u := progressRig(t)
	_, _, v := setup(t)
	ctx := context.Background()
	_, _, err := s.Take(ctx, v, "before", "alice")
	require.NoError(t, err)
	s.pass(ctx)
	s.pass(ctx)

	t.Run("no report kept for a volume without a job of ours, nor a malformed one", func(t *testing.T) {
		for i, r := range []struct{ node, uuid, step string }{
			{"node-1", "00000000-0000-4000-8000-000000000001", "copying"},
			{"node-1", strings.Repeat("a", 1<<20), "copying"},
			{"node-1", u, strings.Repeat("x", 1<<20)},
			{"node-1", u, "copying\x1b]0;pwned\x07"},
			{strings.Repeat("n", 1<<10), u, "copying"},
			{"node-1", strings.ToUpper(u), "copying"},
		} {
			s.Progress(r.node, r.uuid, r.step, i, 1, 2)
		}
		s.progMu.Lock()
		defer s.progMu.Unlock()
		assert.Empty(t, s.prog)
	})
	t.Run("one last report after another: saved once, then each 5 s", func(t *testing.T) {
		s.Progress("node-1", u, "copying", 10, 1, 1)
		s.pass(ctx)
		require.Equal(t, int64(1), get("before").Progress.Done)
		for i := int64(2); i < 50; i++ {
			s.Progress("node-1", u, "copying", int(10+i), i, i)
			s.pass(ctx)
		}
		assert.Equal(t, int64(1), get("before").Progress.Done, "no save within 5 s of the last")
		age("before")
		s.pass(ctx)
		assert.Equal(t, int64(49), get("before").Progress.Done)
	})
	t.Run("a report that came late does not go back", func(t *testing.T) {
		s.Progress("node-1", u, "copying", 100, 8, 10)
		s.Progress("node-1", u, "copying", 99, 7, 10) // Salt 3006's minion, concurrently
		age("before")
		s.pass(ctx)
		assert.Equal(t, int64(8), get("before").Progress.Done)
	})
	t.Run("two snapshots of one volume at once: a report is neither's", func(t *testing.T) {
		_, _, err := s.Take(ctx, v, "second", "alice")
		require.NoError(t, err)
		s.pass(ctx)
		s.Progress("node-1", u, "copying", 200, 9, 10)
		age("before")
		age("second")
		s.pass(ctx)
		assert.Equal(t, int64(8), get("before").Progress.Done, "not shown on either")
		assert.Nil(t, get("second").Progress)
	})
}
