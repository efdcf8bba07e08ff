// Package jobcache reads the salt-master's local job cache (the default
// local_cache returner) straight from disk, for a control plane that runs
// on the master as the master's user. It holds what jobs.list_job through
// salt-api would answer, from the same files, which the master writes
// (atomically) from returns authenticated with each minion's key: a job
// return is confirmed in a millisecond instead of a salt-api round trip
// that starts a runner.
package jobcache

import (
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
)

// Overlay answers ListJob from the files under Dir (<cachedir>/jobs), and
// passes everything else, and any job it cannot read, to salt-api.
type Overlay struct {
	saltapi.Jobs
	Dir string
	// HashType is the master's hash_type (default sha256).
	HashType string
	// Published tells the jobs this control plane published. A job of
	// anyone else's that the cache on disk does not hold is unknown: it is
	// not asked of salt-api, so that returns a minion forges under made-up
	// jids cost one failed file lookup each, never a runner on the master.
	Published func(jid string) bool
}

// maxFile bounds what is read of one cache file; Salt trims returns to
// max_event_size long before.
const maxFile = 64 << 20

func (o *Overlay) jidDir(jid string) (string, error) {
	var h hash.Hash
	switch o.HashType {
	case "", "sha256":
		h = sha256.New()
	case "sha1":
		h = sha1.New()
	case "sha512":
		h = sha512.New()
	case "md5":
		h = md5.New()
	default:
		return "", fmt.Errorf("hash_type %q is not supported", o.HashType)
	}
	h.Write([]byte(jid))
	sum := hex.EncodeToString(h.Sum(nil))
	return filepath.Join(o.Dir, sum[:2], sum[2:]), nil
}

func readMsgpack(path string) (any, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > maxFile {
		return nil, fmt.Errorf("%s: %d bytes", path, st.Size())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return events.DecodeMsgpack(b)
}

// ListJob reads the job's load and each minion's return.
func (o *Overlay) ListJob(ctx context.Context, jid string) (saltapi.JobInfo, error) {
	info, err := o.read(jid)
	switch {
	case err == nil:
		return info, nil
	case errors.Is(err, os.ErrNotExist) && (o.Published == nil || !o.Published(jid)):
		// The cache could be searched (no permission error) and does not
		// hold the job: Salt does not know it (yet).
		return saltapi.JobInfo{}, nil
	}
	// Ours and not there yet, or a cache file we cannot read: ask salt-api.
	return o.Jobs.ListJob(ctx, jid)
}

func (o *Overlay) read(jid string) (saltapi.JobInfo, error) {
	dir, err := o.jidDir(jid)
	if err != nil {
		return saltapi.JobInfo{}, err
	}
	load, err := readMsgpack(filepath.Join(dir, ".load.p"))
	if err != nil {
		return saltapi.JobInfo{}, err
	}
	lm, _ := load.(map[string]any)
	if lm == nil || lm["jid"] != jid {
		return saltapi.JobInfo{}, errors.New("job cache load is not this job's")
	}
	info := saltapi.JobInfo{Known: true, Returns: map[string]saltapi.MinionReturn{}}
	info.Function, _ = lm["fun"].(string)
	if ms, ok := lm["minions"].([]any); ok {
		for _, m := range ms {
			if s, ok := m.(string); ok {
				info.Minions = append(info.Minions, s)
			}
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return saltapi.JobInfo{}, err
	}
	for _, ent := range ents {
		if !ent.IsDir() {
			continue
		}
		v, err := readMsgpack(filepath.Join(dir, ent.Name(), "return.p"))
		if errors.Is(err, os.ErrNotExist) {
			continue // the directory comes before the file
		}
		if err != nil {
			return saltapi.JobInfo{}, err
		}
		rm, _ := v.(map[string]any)
		if rm == nil {
			continue
		}
		ret, err := json.Marshal(rm["return"])
		if err != nil {
			return saltapi.JobInfo{}, fmt.Errorf("job %s, %s: %w", jid, ent.Name(), err)
		}
		mr := saltapi.MinionReturn{Return: ret}
		switch rc := rm["retcode"].(type) {
		case int64:
			mr.Retcode = int(rc)
		case uint64:
			mr.Retcode = int(rc)
		}
		info.Returns[ent.Name()] = mr
	}
	return info, nil
}
