package keep

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

func TestCompactKeepsTheShape(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	var h []saltvolumes.UsageSample
	for i, a := range []int64{1, 1, 1, 1, 5, 5, 5, 2} {
		h = append(h, saltvolumes.UsageSample{At: t0.Add(time.Duration(i) * time.Minute), Allocated: a})
	}
	c := Compact(h)
	var got []int64
	for _, s := range c {
		got = append(got, s.Allocated)
	}
	assert.Equal(t, []int64{1, 1, 5, 5, 2}, got, "each flat run keeps its ends")
	assert.Equal(t, h[3].At, c[1].At)
	assert.Empty(t, Compact(nil))
}

func TestSaveLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "history.json")
	s, err := Load(p)
	require.NoError(t, err, "no file yet: empty")
	assert.Empty(t, s.Jobs)
	at := time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC)
	in := Snapshot{Usage: map[string][]saltvolumes.UsageSample{"u1": {{At: at, Allocated: 7}}},
		Jobs: map[string][]saltvolumes.Job{"v1": {{JID: "1", SLS: "salt_volumes.prepared", Started: at, Result: "succeeded", Steps: []saltvolumes.JobStep{{Name: "formatted", At: at}}}}}}
	require.NoError(t, Save(p, in))
	out, err := Load(p)
	require.NoError(t, err)
	assert.Equal(t, 1, out.Version)
	assert.Equal(t, in.Usage, out.Usage)
	assert.Equal(t, in.Jobs, out.Jobs)
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".history.json.tmp*"))
	assert.Empty(t, left)

	require.NoError(t, os.WriteFile(p, []byte("{broken"), 0o600))
	_, err = Load(p)
	assert.ErrorContains(t, err, "move it away")
}
