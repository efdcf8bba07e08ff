package nodestate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSaveLoadRoundTrip(t *testing.T) {
	d := Dir{Root: t.TempDir()}
	require.NoError(t, d.Init())
	s, err := spec.Parse(strings.NewReader(`{"name":"a","uuid":"3f2504e0-4f89-41d3-9a0c-0305e82c3301","sparseLoopDevice":{"size":"1Gi"}}`))
	require.NoError(t, err)
	require.NoError(t, d.Save(&Record{Spec: s, Phase: PhasePreparing}))
	r, err := d.Load(s.UUID)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<30), r.Spec.SizeBytes, "the parsed size survives the round trip")
	assert.Equal(t, PhasePreparing, r.Phase)
	st, err := os.Stat(filepath.Join(d.Root, "volumes", s.UUID+".json"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	left, _ := filepath.Glob(filepath.Join(d.Root, "volumes", ".*tmp*"))
	assert.Empty(t, left, "no temp files left behind")

	missing, err := d.Load("00000000-0000-4000-8000-000000000000")
	assert.NoError(t, err)
	assert.Nil(t, missing)

	require.NoError(t, os.WriteFile(filepath.Join(d.Root, "volumes", "bad.json"), []byte("{"), 0o600))
	recs, errs := d.All()
	assert.Len(t, recs, 1, "good records are still returned")
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0].Error(), "corrupt")
}

func TestLockSerialises(t *testing.T) {
	d := Dir{Root: t.TempDir()}
	require.NoError(t, d.Init())
	l, err := d.Lock("v")
	require.NoError(t, err)
	got := make(chan struct{})
	go func() {
		l2, err := d.Lock("v")
		if err == nil {
			l2.Unlock()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second holder got the lock while the first held it")
	case <-time.After(100 * time.Millisecond):
	}
	l.Unlock()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the lock was not released")
	}
}
