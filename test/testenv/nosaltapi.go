package testenv

import (
	"context"
	"errors"

	"github.com/salt-volumes/salt-volumes/internal/saltapi"
)

// NoSaltAPI stands for salt-api in tests where the master's job cache on
// this host must answer alone: any call reaching it fails the lookup.
type NoSaltAPI struct{}

func (NoSaltAPI) LocalAsync(context.Context, string, string, []any, map[string]any) (saltapi.Job, error) {
	return saltapi.Job{}, errors.New("asked salt-api")
}

func (NoSaltAPI) ListJob(context.Context, string) (saltapi.JobInfo, error) {
	return saltapi.JobInfo{}, errors.New("asked salt-api")
}
