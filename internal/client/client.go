// Package client talks to the salt-volumes API; the CLI and the tests use it.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// Client is an API client.
type Client struct {
	URL   string
	Token string
	// HTTP is the client requests go through (nil: http.DefaultClient's
	// transport); whatever its CheckRedirect, no redirect is followed.
	HTTP *http.Client
	// HeaderTimeout is how long a request but a watch waits for the
	// answer's headers (0: DefaultHeaderTimeout; negative: forever).
	HeaderTimeout time.Duration
}

// DefaultHeaderTimeout is how long a request (but a watch, which waits
// for events) waits for its answer to begin: a server that stopped
// answering is then a TransportError, Retryable, not a hang.
const DefaultHeaderTimeout = 60 * time.Second

// MaxAnswer is the largest answer read (a list of every volume fits many
// times over).
const MaxAnswer = 256 << 20

// maxAnswer is MaxAnswer, smaller in the tests.
var maxAnswer = MaxAnswer

// Error is an error answer from the server.
type Error struct {
	Status int
	Body   saltvolumes.Error
	// RetryAfter is the answer's Retry-After (0: none): the server says
	// the same request may succeed that much later (a 503, a rate limit,
	// a conflict with a concurrent change), where a 429 without it is a
	// limit that waiting does not lift (limits.volumes).
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Body.Message }

// TransportError is a request that got no answer: refused, reset, a TLS
// or DNS failure, a stream cut. Whether the server acted on it is
// unknown; Retryable says whether asking again can get an answer (the
// CLI's create sends its own uuid so that a retry recognises its volume,
// and rm takes a volume already being deleted as done).
type TransportError struct {
	URL string
	Err error
}

func (e *TransportError) Error() string {
	return "salt-volumes API at " + Redact(e.URL) + ": " + e.Err.Error()
}
func (e *TransportError) Unwrap() error { return e.Err }

// Retryable: asking again may get an answer. Only the network's
// failures are: a connection refused, reset or cut (EOF), a host or
// network unreachable, a timeout (of the network, of a TLS handshake, of
// the answer's headers), a DNS failure its resolver calls temporary.
// What a retry meets again is not: a certificate one side refused (an
// unknown CA, a wrong name, a client certificate missing), https to a
// port that speaks http, a scheme that is not http or https, a header
// the request cannot carry, a name DNS does not know.
func (e *TransportError) Retryable() bool {
	err := e.Err
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns.IsTimeout || dns.IsTemporary
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN, syscall.ENETDOWN, syscall.ENETRESET, syscall.ETIMEDOUT} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// errHeaderTimeout: no answer began within the client's HeaderTimeout.
type errHeaderTimeout time.Duration

func (e errHeaderTimeout) Error() string {
	return fmt.Sprintf("no answer within %s (the server stopped answering?)", time.Duration(e))
}
func (errHeaderTimeout) Timeout() bool   { return true }
func (errHeaderTimeout) Temporary() bool { return true }

// Redact is a URL as messages show it: without a password it holds.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// CheckToken refuses a token no request can carry: a control character
// (a newline from a file of two lines) would be refused by the HTTP
// library, no answer a retry mends.
func CheckToken(tok string) error {
	for i, r := range tok {
		if unicode.IsControl(r) {
			return fmt.Errorf("it holds a control character (%q) at byte %d", r, i)
		}
	}
	return nil
}

// RedirectError is a 3xx answer: the client follows no redirect, which
// would take the token (or a login's password) along to wherever the
// answer points.
type RedirectError struct {
	URL      string // where the request went
	Status   int
	Location string // where the answer points, "" if nowhere
}

func (e *RedirectError) Error() string {
	to := "nowhere"
	if e.Location != "" {
		to = Redact(e.Location)
	}
	return fmt.Sprintf("salt-volumes API at %s answered HTTP %d, a redirect to %s: salt-volumes does not follow redirects (the token or password would go along): set --url to the final address",
		Redact(e.URL), e.Status, to)
}

func redirectError(base string, resp *http.Response) *RedirectError {
	loc := ""
	if u, err := resp.Location(); err == nil {
		loc = u.String()
	}
	return &RedirectError{URL: base, Status: resp.StatusCode, Location: loc}
}

// noRedirect is every client's CheckRedirect: the API never redirects on
// purpose, and a redirect followed would carry the Authorization header
// (to another port of the same host, or from https down to http) and, on
// a 307 or 308, a login's password to any host.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// send sends req through the client's HTTP client, following no
// redirect. With headers, the answer must begin within HeaderTimeout
// (the body is read without it).
func (c *Client) send(req *http.Request, headers bool) (*http.Response, error) {
	if c.Token != "" {
		if err := CheckToken(c.Token); err != nil {
			return nil, fmt.Errorf("the API token: %w: not sent", err)
		}
	}
	hc := http.Client{}
	if c.HTTP != nil {
		hc = *c.HTTP
	}
	hc.CheckRedirect = noRedirect
	d := c.HeaderTimeout
	if d == 0 {
		d = DefaultHeaderTimeout
	}
	if !headers || d < 0 {
		resp, err := hc.Do(req)
		if err != nil {
			return nil, &TransportError{URL: c.URL, Err: err}
		}
		return resp, nil
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	t := time.AfterFunc(d, func() { cancel(errHeaderTimeout(d)) })
	resp, err := hc.Do(req.WithContext(ctx))
	t.Stop()
	if err != nil {
		cancel(nil)
		var ht errHeaderTimeout
		if cause := context.Cause(ctx); errors.As(cause, &ht) && req.Context().Err() == nil {
			err = ht
		}
		return nil, &TransportError{URL: c.URL, Err: err}
	}
	// The context ends with the body: the caller closes it.
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// ErrStreamEnded: the server closed a watch stream (a restart, a
// failover, its write timeout); watching again picks up from the
// current state.
var ErrStreamEnded = errors.New("watch stream closed by the server")

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		// 0 still says "retry": a second, not "no header".
		return max(time.Duration(n)*time.Second, time.Second)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), time.Second)
	}
	return 0
}

func mib(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// maxErrorText is how much of an error answer that is not the API's (an
// HTML page of a proxy) its message keeps.
const maxErrorText = 300

// cut is text cut to n bytes (on a character boundary), saying so.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + fmt.Sprintf("... (%d bytes in all)", len(s))
}

// answerError is the error of a non-2xx answer whose body was raw.
func answerError(resp *http.Response, raw []byte) *Error {
	var e struct {
		Error saltvolumes.Error `json:"error"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Error.Message == "" {
		e.Error = saltvolumes.Error{Code: "http", Message: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, cut(strings.TrimSpace(string(raw)), maxErrorText))}
	}
	return &Error{Status: resp.StatusCode, Body: e.Error, RetryAfter: retryAfter(resp.Header)}
}

func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.URL, "/")+path, rd)
	if err != nil {
		return err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req, true)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return redirectError(c.URL, resp)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxAnswer)+1))
	if err != nil {
		return &TransportError{URL: c.URL, Err: err}
	}
	if len(raw) > maxAnswer {
		return fmt.Errorf("salt-volumes API at %s: %s %s: the answer is larger than %s, the most salt-volumes reads", Redact(c.URL), method, path, mib(maxAnswer))
	}
	if resp.StatusCode >= 300 {
		return answerError(resp, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("salt-volumes API: unexpected answer: %w", err)
		}
	}
	return nil
}

// Create creates a volume from a spec (the ARCHITECTURE.md contract).
func (c *Client) Create(ctx context.Context, spec any) (saltvolumes.View, error) {
	var v saltvolumes.View
	err := c.do(ctx, http.MethodPost, "/api/v1/volumes", spec, &v)
	return v, err
}

// List lists volumes, on one node when node is set.
func (c *Client) List(ctx context.Context, node string) ([]saltvolumes.View, error) {
	var out struct {
		Items []saltvolumes.View `json:"items"`
	}
	path := "/api/v1/volumes"
	if node != "" {
		path += "?node=" + url.QueryEscape(node)
	}
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out.Items, err
}

// Get returns one volume.
func (c *Client) Get(ctx context.Context, name string) (saltvolumes.View, error) {
	var v saltvolumes.View
	err := c.do(ctx, http.MethodGet, "/api/v1/volumes/"+url.PathEscape(name), nil, &v)
	return v, err
}

// Delete asks for a volume's deletion.
func (c *Client) Delete(ctx context.Context, name string, wipe bool) (saltvolumes.View, error) {
	var v saltvolumes.View
	path := "/api/v1/volumes/" + url.PathEscape(name)
	if wipe {
		path += "?wipe=true"
	}
	err := c.do(ctx, http.MethodDelete, path, nil, &v)
	return v, err
}

// Resize asks a sparse volume to grow to size (a quantity).
// An empty size grows a raw volume to what its device has become.
func (c *Client) Resize(ctx context.Context, name, size string) (saltvolumes.View, error) {
	var v saltvolumes.View
	body := map[string]any{"size": size}
	if size == "" {
		body = map[string]any{"toDevice": true}
	}
	err := c.do(ctx, http.MethodPost, "/api/v1/volumes/"+url.PathEscape(name)+"/resize", body, &v)
	return v, err
}

// ForgetNode forgets the named volumes of a node that is gone for good,
// whatever their phase, without running anything on it.
func (c *Client) ForgetNode(ctx context.Context, node string, names []string) ([]saltvolumes.View, error) {
	var out struct {
		Items []saltvolumes.View `json:"items"`
	}
	err := c.do(ctx, http.MethodPost, "/api/v1/nodes/"+url.PathEscape(node)+"/forget", map[string]any{"volumes": names}, &out)
	return out.Items, err
}

// Forget drops a Failed volume without running anything on its node.
func (c *Client) Forget(ctx context.Context, name string) (saltvolumes.View, error) {
	var v saltvolumes.View
	err := c.do(ctx, http.MethodDelete, "/api/v1/volumes/"+url.PathEscape(name)+"?forget=true", nil, &v)
	return v, err
}

// Nodes lists Salt's minions with their volumes.
func (c *Client) Nodes(ctx context.Context) ([]saltvolumes.Node, string, error) {
	var out struct {
		Items   []saltvolumes.Node `json:"items"`
		Warning string             `json:"warning"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/nodes", nil, &out)
	return out.Items, out.Warning, err
}

// Synced is the Event.Type that marks the end of the initial list.
const Synced = "SYNCED"

// Closed is the event a server sends before it ends a stream whose token
// stopped being valid (logged out, revoked, expired, role lost).
const Closed = "CLOSED"

// Watch streams changes (after the current volumes as ADDED and one SYNCED
// event) until fn returns false, ctx ends, or the stream breaks.
func (c *Client) Watch(ctx context.Context, node, name string, fn func(saltvolumes.Event) bool) error {
	q := url.Values{}
	if node != "" {
		q.Set("node", node)
	}
	if name != "" {
		q.Set("name", name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.URL, "/")+"/api/v1/watch?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(req, false)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return redirectError(c.URL, resp)
	}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return answerError(resp, raw)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return fmt.Errorf("salt-volumes API at %s: GET /api/v1/watch answered %q, not an event stream: is that the salt-volumes API?",
			Redact(c.URL), cut(resp.Header.Get("Content-Type"), 100))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var typ, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		case line == "" && typ != "":
			if typ == Closed {
				var why struct{ Reason string }
				_ = json.Unmarshal([]byte(data), &why)
				return &Error{Status: http.StatusUnauthorized, Body: saltvolumes.Error{Code: saltvolumes.CodeUnauthorized, Message: "watch ended by the server: " + why.Reason}}
			}
			ev := saltvolumes.Event{Type: typ}
			if typ != Synced {
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					return fmt.Errorf("watch: bad event: %w", err)
				}
			}
			if !fn(ev) {
				return nil
			}
			typ, data = "", ""
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return &TransportError{URL: c.URL, Err: err}
	}
	return ErrStreamEnded
}

// Status reads the server's /readyz: its readiness and role ("ok: leader",
// "ok: follower of ...", or "ok" for the only control plane).
func (c *Client) Status(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.URL, "/")+"/readyz", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.send(req, true)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return "", redirectError(c.URL, resp)
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	body := cut(strings.TrimSpace(string(raw)), maxErrorText)
	if resp.StatusCode != http.StatusOK {
		msg := body
		if msg == "" {
			msg = fmt.Sprintf("not ready (HTTP %d)", resp.StatusCode)
		}
		return body, &Error{Status: resp.StatusCode, Body: saltvolumes.Error{Code: "unavailable", Message: msg}, RetryAfter: retryAfter(resp.Header)}
	}
	return body, nil
}

// HTTPS is an HTTP client for an https URL: trusting caFile's CAs besides
// the system's when given, presenting the certificate in certFile and
// keyFile when given. No timeout: watch streams are long-lived (a
// Client sets its own for the answers' headers, and follows no
// redirect whatever this client's CheckRedirect).
func HTTPS(caFile, certFile, keyFile string) (*http.Client, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file: %s: no PEM certificate in it", caFile)
		}
		tc.RootCAs = pool
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert-file and --key-file: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = tc
	return &http.Client{Transport: t}, nil
}

// Info is what GET /api/v1/info says of the server: its version and how
// long it waits for a Salt job (what a client waiting for a volume
// should wait a little longer than).
type Info struct {
	Version           string `json:"version"`
	JobTimeout        string `json:"jobTimeout"`
	JobTimeoutSeconds int64  `json:"jobTimeoutSeconds"`
}

// Info reads the server's GET /api/v1/info (any valid token).
func (c *Client) Info(ctx context.Context) (Info, error) {
	var i Info
	err := c.do(ctx, http.MethodGet, "/api/v1/info", nil, &i)
	return i, err
}
