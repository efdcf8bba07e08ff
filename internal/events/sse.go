package events

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// SSE reads salt-api's GET /events stream: the same bus, for a control plane
// that does not run on the master host. salt-api sends every event to every
// valid token (no ACL filtering), JSON-encoded.
type SSE struct {
	URL    string // salt-api base URL
	Client *http.Client
	// Token returns a session token; Relogin forces a new one after a 401
	// (salt-api forgets sessions when it restarts).
	Token   func(ctx context.Context) (string, error)
	Relogin func(ctx context.Context) error
	Log     *slog.Logger
	Stats   *Stats

	MinBackoff, MaxBackoff time.Duration
}

// errUnauthorized makes Run log in again before reconnecting.
var errUnauthorized = errors.New("salt-api /events: 401 unauthorized")

// Run connects, reads and reconnects with backoff until ctx is done.
func (s *SSE) Run(ctx context.Context, onConnect func(), handle func(Event)) error {
	if s.Client == nil {
		s.Client = &http.Client{}
	}
	l := &loop{what: "salt-api " + s.URL + "/events", stats: s.Stats, log: s.Log, minB: s.MinBackoff, maxB: s.MaxBackoff}
	s.Stats = l.init()
	return l.run(ctx, onConnect,
		func(ctx context.Context) (io.ReadCloser, error) {
			body, err := s.open(ctx)
			if errors.Is(err, errUnauthorized) && s.Relogin != nil {
				if lerr := s.Relogin(ctx); lerr == nil {
					body, err = s.open(ctx)
				}
			}
			return body, err
		},
		func(r io.Reader) error { return s.read(r, handle) })
}

func (s *SSE) open(ctx context.Context) (io.ReadCloser, error) {
	tok, err := s.Token(ctx)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(s.URL, "/")+"/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Auth-Token", tok)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := s.Client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusUnauthorized {
		resp.Body.Close()
		return nil, errUnauthorized
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("salt-api /events: HTTP %d", resp.StatusCode)
	}
	return resp.Body, nil
}

// read parses "tag:" and "data:" fields; a blank line ends a record. The
// data field holds {"tag": ..., "data": {...}}; other fields (retry:, id:,
// comments) are ignored.
func (s *SSE) read(body io.Reader, handle func(Event)) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if data.Len() > 0 {
				s.dispatch(data.String(), handle)
				data.Reset()
			}
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		if field == "data" {
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(value)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.EOF
}

func (s *SSE) dispatch(data string, handle func(Event)) {
	var rec struct {
		Tag  string         `json:"tag"`
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal([]byte(data), &rec); err != nil || rec.Tag == "" {
		s.Stats.Skipped.Add(1)
		return
	}
	s.Stats.Decoded.Add(1)
	handle(Event{Tag: rec.Tag, Data: rec.Data})
}
