package nodestate

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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

func TestStagedRecordIsNoRecordUntilCommitted(t *testing.T) {
	d := Dir{Root: t.TempDir()}
	require.NoError(t, d.Init())
	s, err := spec.Parse(strings.NewReader(`{"name":"a","uuid":"3f2504e0-4f89-41d3-9a0c-0305e82c3301","rawBlockDevice":{"devicePath":"/dev/sdz"}}`))
	require.NoError(t, err)
	rec := &Record{Spec: s, Phase: PhasePreparing, Device: "sdz"}
	st, err := d.Stage(rec)
	require.NoError(t, err)

	// Staged, it speaks for nothing: a crash now leaves no record.
	got, err := d.Load(s.UUID)
	require.NoError(t, err)
	assert.Nil(t, got, "a staged record is not the volume's record")
	all, errs := d.All()
	assert.Empty(t, all)
	assert.Empty(t, errs, "the staged file is not read as a (corrupt) record")

	assert.True(t, st.Holds(rec), "the record it was staged from")
	changed := *rec
	changed.Written = "ext4"
	assert.False(t, st.Holds(&changed), "a record that changed since staging")
	assert.True(t, rec.CreatedAt.IsZero(), "staging stamps its copy, not the caller's record")

	require.NoError(t, st.Commit(rec))
	got, err = d.Load(s.UUID)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, "sdz", got.Device)
	assert.Equal(t, rec.UpdatedAt, got.UpdatedAt, "the caller's record carries the times that were saved")
	assert.False(t, rec.CreatedAt.IsZero())

	// A stage that is never committed (a crash, a failed mkfs) is removed
	// with the record.
	_, err = d.Stage(&changed)
	require.NoError(t, err)
	require.NoError(t, d.Remove(s.UUID))
	left, _ := filepath.Glob(filepath.Join(d.Root, "volumes", "*"))
	hidden, _ := filepath.Glob(filepath.Join(d.Root, "volumes", ".*"))
	assert.Empty(t, append(left, hidden...), "nothing left of the volume")
}

// A record written by a newer node binary (a downgrade) is refused by
// name, never misread, and left as it is.
func TestNewerRecordVersionRefused(t *testing.T) {
	d := Dir{Root: t.TempDir()}
	require.NoError(t, d.Init())
	s, err := spec.Parse(strings.NewReader(`{"name":"a","uuid":"3f2504e0-4f89-41d3-9a0c-0305e82c3301","sparseLoopDevice":{"size":"1Gi"}}`))
	require.NoError(t, err)
	require.NoError(t, d.Save(&Record{Spec: s, Phase: PhasePrepared}))
	path := filepath.Join(d.Root, "volumes", s.UUID+".json")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"version": 1`, "records carry their version")
	newer := strings.Replace(string(b), `"version": 1`, `"version": 2`, 1)
	require.NoError(t, os.WriteFile(path, []byte(newer), 0o600))

	_, err = d.Load(s.UUID)
	assert.ErrorContains(t, err, "record version 2 was written by a newer salt-volume-exec (this one reads up to 1)")
	_, errs := d.All()
	require.Len(t, errs, 1, "prepares, which read every record, refuse too")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, newer, string(after))
}

// The ordered write (an intent on xfs) replaces a record whole and
// leaves no temporary file, on xfs and elsewhere alike.
func TestWriteFileAtomicOrdered(t *testing.T) {
	dirs := map[string]string{"here": t.TempDir()}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("mkfs.xfs"); err == nil {
			d := testenv.FakeDiskWith(t, 320<<20, func(img string) error {
				return exec.Command("mkfs.xfs", "-q", img).Run()
			})
			mnt := t.TempDir()
			require.NoError(t, unix.Mount(d.Path, mnt, "xfs", 0, ""))
			t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
			dirs["xfs"] = mnt
		}
	}
	for name, dir := range dirs {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, "s1.json")
			require.NoError(t, WriteFileAtomicOrdered(p, []byte(`{"phase":"taking"}`), 0o600))
			require.NoError(t, WriteFileAtomicOrdered(p, []byte(`{"phase":"taken"}`), 0o600))
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			assert.Equal(t, `{"phase":"taken"}`, string(b))
			st, err := os.Stat(p)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
			left, _ := filepath.Glob(filepath.Join(dir, ".s1.json.tmp*"))
			assert.Empty(t, left)
		})
	}
}
