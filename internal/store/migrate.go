package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
)

// Migrate copies every volume of src into dst, which must hold none, then
// verifies dst record by record against src. Nothing reconciles either
// store meanwhile: every serve using them is stopped first (a bbolt file
// is locked by its serve; for etcd the caller checks that no leader runs).
func Migrate(ctx context.Context, src Reader, dst Store) (int, error) {
	if n := dst.Len(); n > 0 {
		return 0, fmt.Errorf("the target already holds %d volumes: migrate only into an empty store (a new etcd prefix or a new bbolt file)", n)
	}
	vols := src.List()
	for i, v := range vols {
		c := v.Clone()
		if err := dst.Create(ctx, c); err != nil {
			return i, fmt.Errorf("copying volume %q (%d of %d copied; the target holds them: clear it before trying again): %w", v.Spec.Name, i, len(vols), err)
		}
	}
	return len(vols), Verify(src, dst)
}

// Verify compares two stores record by record (revisions aside).
func Verify(a, b Reader) error {
	if a.Len() != b.Len() {
		return fmt.Errorf("verification failed: %d volumes in the source, %d in the target", a.Len(), b.Len())
	}
	for _, v := range a.List() {
		w, err := b.Get(v.Spec.Name)
		if err != nil {
			return fmt.Errorf("verification failed: volume %q is missing from the target", v.Spec.Name)
		}
		x, _ := json.Marshal(v)
		y, _ := json.Marshal(w)
		if !bytes.Equal(x, y) {
			return fmt.Errorf("verification failed: volume %q differs:\nsource %s\ntarget %s", v.Spec.Name, x, y)
		}
	}
	return nil
}

// RecordKinds are the records store migrate moves with the volumes:
// tokens (and sessions) and the audit trail.
var RecordKinds = []string{"tokens", "audit"}

// MigrateRecords copies every record of kinds from src to dst (a put
// replaces a record of the same key: running it again is safe) and
// verifies the count of each kind.
func MigrateRecords(ctx context.Context, src, dst Records, kinds []string) (int, error) {
	n := 0
	for _, kind := range kinds {
		recs, err := src.ListRecords(ctx, kind)
		if err != nil {
			return n, fmt.Errorf("listing the source's %s records: %w", kind, err)
		}
		for _, r := range recs {
			if err := dst.PutRecord(ctx, kind, r.Key, r.Data); err != nil {
				return n, fmt.Errorf("copying %s record %s (%d copied): %w", kind, r.Key, n, err)
			}
			n++
		}
		got, err := dst.ListRecords(ctx, kind)
		if err != nil {
			return n, fmt.Errorf("verifying the target's %s records: %w", kind, err)
		}
		if len(got) < len(recs) {
			return n, fmt.Errorf("verification failed: %d %s records in the source, %d in the target", len(recs), kind, len(got))
		}
	}
	return n, nil
}
