package api

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

// GET /api/v1/info tells any valid token the server's version and job
// timeout (the CLI's --wait waits that and a minute), and nobody else.
func TestInfo(t *testing.T) {
	for _, tc := range []struct {
		name       string
		jobTimeout time.Duration
		want       string
		seconds    float64
	}{
		{"configured", 3 * time.Minute, "3m0s", 180},
		{"the reconciler's default", 0, "10m0s", 600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st *store.Bolt
			ts, _ := newServerWith(t, func(s *Server) {
				withAccess(&st)(s)
				s.Version, s.JobTimeout = "v0.4.0-test", tc.jobTimeout
			})
			code, m := do(t, ts, "POST", "/api/v1/tokens", token, `{"name":"dash","role":"viewer"}`)
			require.Equal(t, 201, code, m)
			viewer, _ := m["token"].(string)
			code, m = do(t, ts, "GET", "/api/v1/info", viewer, "")
			require.Equal(t, 200, code, m)
			assert.Equal(t, map[string]any{"version": "v0.4.0-test", "jobTimeout": tc.want, "jobTimeoutSeconds": tc.seconds}, m)
			code, _ = do(t, ts, "GET", "/api/v1/info", "", "")
			assert.Equal(t, 401, code)
			code, m = do(t, ts, "GET", "/api/v1/info?x=1", viewer, "")
			assert.Equal(t, 400, code, m)
		})
	}
}
