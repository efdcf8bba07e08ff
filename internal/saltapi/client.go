// Package saltapi is a client for salt-api's rest_cherrypy: login with any
// eauth, token reuse, one re-login on 401, bounded retries with backoff on
// 5xx and connection errors, and the calls the control plane needs. Tokens
// and passwords are never logged.
package saltapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// Config says how to reach and authenticate to salt-api.
type Config struct {
	URL      string // e.g. https://salt-master:8000
	Username string
	Password string `json:"-"`
	Eauth    string // file, pam, sharedsecret, ...
	// CAFile verifies a salt-api certificate signed by a private CA.
	CAFile string
	// InsecureSkipVerify is for tests only.
	InsecureSkipVerify bool
	Timeout            time.Duration
	RetryMax           int
	Log                *slog.Logger
}

// Jobs is what starting and looking up jobs takes: the Client, or a
// job-cache overlay in front of it.
type Jobs interface {
	LocalAsync(ctx context.Context, tgt, fun string, arg []any, kwarg map[string]any) (Job, error)
	ListJob(ctx context.Context, jid string) (JobInfo, error)
}

// Error is an answer salt-api gave that is not a success.
type Error struct {
	Status int
	Body   string
	Op     string
}

func (e *Error) Error() string {
	hint := ""
	switch e.Status {
	case http.StatusUnauthorized:
		hint = " (check the salt-api credentials and the eauth ACL)"
	case http.StatusBadRequest:
		hint = " (is the client listed in netapi_enable_clients?)"
	case http.StatusServiceUnavailable:
		hint = " (is salt-master running?)"
	}
	return fmt.Sprintf("salt-api %s: HTTP %d%s: %s", e.Op, e.Status, hint, strings.TrimSpace(e.Body))
}

// Client talks to one salt-api.
type Client struct {
	cfg   Config
	http  *retryablehttp.Client
	login *http.Client // separate: logging in from inside CheckRetry must not recurse
	// transport carries the TLS settings to the long-lived /events stream.
	transport *http.Transport

	loginMu sync.Mutex
	// A failed login is shared for a second by every caller that waited
	// for it: with salt-api down, sixteen workers do not take turns
	// failing, one after the other.
	loginErr    error
	loginFailed time.Time
	mu          sync.Mutex
	token       string
	expiry      time.Time
	// Logins counts successful logins (for tests and metrics).
	Logins int
}

// New builds a client; TLS is verified unless told otherwise.
func New(cfg Config) (*Client, error) {
	if cfg.URL == "" {
		return nil, errors.New("salt-api url is required")
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.Eauth == "" {
		cfg.Eauth = "file"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = 4
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.InsecureSkipVerify} //nolint:gosec // opt-in, tests
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading salt-api CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", cfg.CAFile)
		}
		tlsCfg.RootCAs = pool
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsCfg
	c := &Client{cfg: cfg, login: &http.Client{Transport: transport, Timeout: cfg.Timeout}, transport: transport}

	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: transport, Timeout: cfg.Timeout}
	rc.Logger = nil // its logger prints request URLs and would need scrubbing
	rc.RetryMax = cfg.RetryMax
	rc.RetryWaitMin = 100 * time.Millisecond
	rc.RetryWaitMax = 5 * time.Second
	rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	rc.CheckRetry = c.checkRetry
	rc.Backoff = func(lo, hi time.Duration, n int, resp *http.Response) time.Duration {
		if resp != nil && resp.StatusCode == http.StatusUnauthorized {
			return 0
		}
		return retryablehttp.DefaultBackoff(lo, hi, n, resp)
	}
	rc.PrepareRetry = func(req *http.Request) error {
		req.Header.Set("X-Auth-Token", c.currentToken())
		return nil
	}
	c.http = rc
	return c, nil
}

type relogin struct{}

// checkRetry logs in again once per request on 401 (the token expired, or
// salt-api restarted and forgot its sessions), and otherwise retries on
// connection errors and 5xx.
func (c *Client) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if resp != nil && resp.StatusCode == http.StatusUnauthorized {
		flag, _ := resp.Request.Context().Value(relogin{}).(*bool)
		if flag == nil || *flag {
			return false, nil
		}
		*flag = true
		if lerr := c.Login(ctx); lerr != nil {
			return false, lerr
		}
		return true, nil
	}
	return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
}

func (c *Client) currentToken() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.token
}

// Login authenticates and keeps the token.
func (c *Client) Login(ctx context.Context) error {
	body, _ := json.Marshal(map[string]string{"username": c.cfg.Username, "password": c.cfg.Password, "eauth": c.cfg.Eauth})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.URL+"/login", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.login.Do(req)
	if err != nil {
		return fmt.Errorf("salt-api login: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return &Error{Status: resp.StatusCode, Body: string(raw), Op: "login as " + c.cfg.Username}
	}
	var out struct {
		Return []struct {
			Token  string  `json:"token"`
			Expire float64 `json:"expire"`
		} `json:"return"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Return) == 0 || out.Return[0].Token == "" {
		return fmt.Errorf("salt-api login: unexpected answer (no token)")
	}
	c.mu.Lock()
	c.token = out.Return[0].Token
	c.expiry = time.Unix(int64(out.Return[0].Expire), 0)
	c.Logins++
	c.mu.Unlock()
	c.cfg.Log.Info("logged in to salt-api", "user", c.cfg.Username, "eauth", c.cfg.Eauth, "expires", c.expiry)
	return nil
}

// ensureLogin logs in when there is no token or it is about to expire.
func (c *Client) ensureLogin(ctx context.Context) error {
	// One login at a time: concurrent callers wait for it and reuse its token.
	c.loginMu.Lock()
	defer c.loginMu.Unlock()
	c.mu.Lock()
	need := c.token == "" || (!c.expiry.IsZero() && time.Until(c.expiry) < time.Minute)
	c.mu.Unlock()
	if !need {
		return nil
	}
	if c.loginErr != nil && time.Since(c.loginFailed) < time.Second {
		return c.loginErr
	}
	err := c.Login(ctx)
	c.loginErr, c.loginFailed = err, time.Now()
	return err
}

// Token returns a valid session token, logging in if needed.
func (c *Client) Token(ctx context.Context) (string, error) {
	if err := c.ensureLogin(ctx); err != nil {
		return "", err
	}
	return c.currentToken(), nil
}

// LoginCount is the number of successful logins so far.
func (c *Client) LoginCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Logins
}

// URL is the salt-api base URL.
func (c *Client) URL() string { return c.cfg.URL }

// StreamClient is an HTTP client with the configured TLS settings and no
// overall timeout, for GET /events.
func (c *Client) StreamClient() *http.Client { return &http.Client{Transport: c.transport} }

// Lowstate is one salt-api command chunk.
type Lowstate map[string]any

// Run posts lowstate chunks to / and returns the "return" list.
func (c *Client) Run(ctx context.Context, chunks ...Lowstate) ([]json.RawMessage, error) {
	if err := c.ensureLogin(ctx); err != nil {
		return nil, err
	}
	body, err := json.Marshal(chunks)
	if err != nil {
		return nil, err
	}
	var flag bool
	ctx = context.WithValue(ctx, relogin{}, &flag)
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, c.cfg.URL+"/", body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("X-Auth-Token", c.currentToken())
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("salt-api %s: %w", describe(chunks), err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, &Error{Status: resp.StatusCode, Body: string(raw), Op: describe(chunks)}
	}
	var out struct {
		Return []json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("salt-api %s: unexpected answer: %w", describe(chunks), err)
	}
	return out.Return, nil
}

func describe(chunks []Lowstate) string {
	var parts []string
	for _, ch := range chunks {
		parts = append(parts, fmt.Sprintf("%v %v", ch["client"], ch["fun"]))
	}
	return strings.Join(parts, ", ")
}

// Job is a started asynchronous job.
type Job struct {
	JID     string   `json:"jid"`
	Minions []string `json:"minions"`
}

// ErrNoMinions means the target matched no minion: the job never started.
var ErrNoMinions = errors.New("no minion matched the target")

// LocalAsync starts fun on tgt and returns the job id.
//
// tgt is one minion id, targeted as a list of one: never a glob, so a name
// like "*" or "a,b" cannot fan a job out to other minions.
func (c *Client) LocalAsync(ctx context.Context, tgt, fun string, arg []any, kwarg map[string]any) (Job, error) {
	low := Lowstate{"client": "local_async", "tgt": []string{tgt}, "tgt_type": "list", "fun": fun}
	if len(arg) > 0 {
		low["arg"] = arg
	}
	if len(kwarg) > 0 {
		low["kwarg"] = kwarg
	}
	if md := Metadata(ctx); md != nil {
		low["metadata"] = md
	}
	ret, err := c.Run(ctx, low)
	if err != nil {
		return Job{}, err
	}
	if len(ret) == 0 {
		return Job{}, fmt.Errorf("salt-api local_async %s: empty answer", fun)
	}
	var job Job
	if err := json.Unmarshal(ret[0], &job); err != nil {
		return Job{}, fmt.Errorf("salt-api local_async %s: unexpected answer %s", fun, ret[0])
	}
	if job.JID == "" {
		return Job{}, fmt.Errorf("%w (%s)", ErrNoMinions, tgt)
	}
	return job, nil
}

// Runner runs a runner function synchronously and returns its raw return.
func (c *Client) Runner(ctx context.Context, fun string, kwarg map[string]any) (json.RawMessage, error) {
	low := Lowstate{"client": "runner", "fun": fun}
	for k, v := range kwarg {
		low[k] = v
	}
	ret, err := c.Run(ctx, low)
	if err != nil {
		return nil, err
	}
	if len(ret) == 0 {
		return nil, fmt.Errorf("salt-api runner %s: empty answer", fun)
	}
	return ret[0], nil
}

// LookupJID returns each minion's return of a finished job. found is false
// for a job Salt does not know (never ran, expired from the job cache, or a
// restarted master with another cache): the caller may launch it again.
// Minions still running are absent from the map.
func (c *Client) LookupJID(ctx context.Context, jid string) (map[string]json.RawMessage, bool, error) {
	raw, err := c.Runner(ctx, "jobs.lookup_jid", map[string]any{"jid": jid})
	if err != nil {
		return nil, false, err
	}
	return ParseLookup(raw)
}

// ParseLookup handles both shapes jobs.lookup_jid returns: {minion: ret},
// and {"outputter": ..., "data": {minion: ret}} when returns carry an
// outputter (always for state runs). {} means unknown.
func ParseLookup(raw json.RawMessage) (map[string]json.RawMessage, bool, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, false, fmt.Errorf("jobs.lookup_jid: unexpected answer %s", truncate(raw))
	}
	if data, ok := m["data"]; ok {
		if _, hasOut := m["outputter"]; hasOut {
			var inner map[string]json.RawMessage
			if err := json.Unmarshal(data, &inner); err != nil {
				return nil, false, fmt.Errorf("jobs.lookup_jid: unexpected data %s", truncate(data))
			}
			m = inner
		}
	}
	return m, len(m) > 0, nil
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// Minions lists the minions Salt knows are up (manage.up).
func (c *Client) Minions(ctx context.Context) ([]string, error) {
	raw, err := c.Runner(ctx, "manage.up", nil)
	if err != nil {
		return nil, err
	}
	var ids []string
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, fmt.Errorf("manage.up: unexpected answer %s", truncate(raw))
	}
	return ids, nil
}

// MinionReturn is one minion's stored return of a job.
type MinionReturn struct {
	Return  json.RawMessage `json:"return"`
	Retcode int             `json:"retcode"`
}

// JobInfo is what the master's job cache knows of a job.
type JobInfo struct {
	Known    bool
	Function string
	Minions  []string
	Returns  map[string]MinionReturn
}

// ListJob asks the job cache about jid (jobs.list_job). Unlike lookup_jid it
// tells a running job (known, no returns yet) from one the master never saw
// or has expired (Function "unknown-function"), and it keeps each minion's
// retcode.
func (c *Client) ListJob(ctx context.Context, jid string) (JobInfo, error) {
	raw, err := c.Runner(ctx, "jobs.list_job", map[string]any{"jid": jid})
	if err != nil {
		return JobInfo{}, err
	}
	return ParseListJob(raw)
}

// ParseListJob reads a jobs.list_job answer.
func ParseListJob(raw json.RawMessage) (JobInfo, error) {
	var m struct {
		Function string                     `json:"Function"`
		Minions  []string                   `json:"Minions"`
		Result   map[string]json.RawMessage `json:"Result"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return JobInfo{}, fmt.Errorf("jobs.list_job: unexpected answer %s", truncate(raw))
	}
	info := JobInfo{Function: m.Function, Minions: m.Minions, Returns: map[string]MinionReturn{}}
	info.Known = m.Function != "" && m.Function != "unknown-function"
	for minion, r := range m.Result {
		var mr MinionReturn
		if err := json.Unmarshal(r, &mr); err != nil || mr.Return == nil {
			// Very old caches stored the bare return.
			mr = MinionReturn{Return: r}
		}
		info.Returns[minion] = mr
		info.Known = true
	}
	return info, nil
}
