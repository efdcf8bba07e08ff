package store

import (
	"fmt"
	"strconv"
)

// Format is the layout of the records this build writes, recorded in each
// store (bbolt: the meta bucket; etcd: <prefix>/format) when it is first
// opened. A store of a newer format is refused at open, before anything
// is read or written: an older salt-volumes after a downgrade says so
// instead of misreading volumes. A store from before formats were
// recorded is format 1. (Volume objects carry theirs in the API version
// of the Volume resource.)
const Format = 1

// formatKey names the format record in either backend.
const formatKey = "format"

// FormatError refuses a store this build cannot read.
type FormatError struct {
	Where  string
	Stored string
}

func (e *FormatError) Error() string {
	if _, err := strconv.Atoi(e.Stored); err != nil {
		return fmt.Sprintf("store %s records format %q, which is not a number: it was not written by salt-volumes; nothing was changed", e.Where, e.Stored)
	}
	return fmt.Sprintf("store %s has format %s, newer than this salt-volumes reads (%d): a newer salt-volumes wrote it; run that version (or a later one) again; nothing was changed", e.Where, e.Stored, Format)
}

// checkFormat reads a stored format ("" when none is recorded yet).
func checkFormat(where, stored string) error {
	if stored == "" {
		return nil
	}
	if n, err := strconv.Atoi(stored); err != nil || n > Format {
		return &FormatError{Where: where, Stored: stored}
	}
	return nil
}
