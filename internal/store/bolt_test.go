package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// vol is a volume as the API stores it (its spec validated: defaults in).
func vol(name string) *volume.Volume {
	v := &volume.Volume{Spec: spec.Spec{Name: name, UUID: uuid.NewSHA1(uuid.NameSpaceOID, []byte(name)).String(), Node: "n",
		MkfsOptions: []string{"-m", "0"}, SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}, CreatedAt: time.Unix(1, 0).UTC()}
	if err := v.Spec.Validate(); err != nil {
		panic(err)
	}
	v.Spec.SizeBytes = 0 // derived, not stored
	return v
}

func TestSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	s, err := Open(path)
	require.NoError(t, err)
	v := vol("a")
	v.Status = volume.Status{Status: saltvolumes.Status{Phase: volume.Pending, JobID: "j1", Step: "attached"}}
	require.NoError(t, s.Create(context.Background(), v))
	require.NoError(t, s.Create(context.Background(), vol("b")))
	b, _ := s.Get("b")
	require.NoError(t, s.Delete(context.Background(), b))
	require.NoError(t, s.Close())

	s, err = Open(path)
	require.NoError(t, err)
	defer s.Close()
	got, err := s.Get("a")
	require.NoError(t, err)
	v.Revision = got.Revision
	assert.Equal(t, v, got)
	_, err = s.Get("b")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Equal(t, 1, s.Len())
}

func TestReadsAreCopies(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "v.db"))
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Create(context.Background(), vol("a")))
	got, _ := s.Get("a")
	got.Status.Phase = volume.Failed
	got.Spec.MkfsOptions[0] = "-X"
	got.Spec.SparseLoopDevice.Size = "2Gi"
	again, _ := s.Get("a")
	assert.Equal(t, volume.Unknown, again.Status.Phase)
	assert.Equal(t, "-m", again.Spec.MkfsOptions[0])
	assert.Equal(t, spec.Size("1Gi"), again.Spec.SparseLoopDevice.Size)
}

func TestSecondServeIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	s, err := Open(path)
	require.NoError(t, err)
	defer s.Close()
	openTimeout = 100 * time.Millisecond
	_, err = Open(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another salt-volumes serve (or store migrate) holds it")
}

// A bad record is skipped and reported; the others load.
func TestBadRecordIsSkipped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	s, err := Open(path)
	require.NoError(t, err)
	require.NoError(t, s.Create(context.Background(), vol("good")))
	require.NoError(t, s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Put([]byte("bad"), []byte("{not json"))
	}))
	require.NoError(t, s.Close())
	s, err = Open(path)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Get("good")
	assert.NoError(t, err)
	require.Len(t, s.Skipped, 1)
	assert.Contains(t, s.Skipped[0], `volume "bad"`)
}

// A file whose pages are garbage is an error naming the file and the way
// out, never a panic.
func TestCorruptFileIsAClearError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	s, err := Open(path)
	require.NoError(t, err)
	for i := range 50 {
		require.NoError(t, s.Create(context.Background(), vol(fmt.Sprintf("v-%d", i))))
	}
	require.NoError(t, s.Close())
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	junk := make([]byte, 3*4096)
	for i := range junk {
		junk[i] = byte(i*7 + 3)
	}
	_, err = f.WriteAt(junk, 2*4096) // the freelist and the first data pages
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = Open(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "move the file aside")
}
