// Package saltreq publishes jobs through the Salt master's request server
// (ret_port, 4506), the door salt's own LocalClient uses: a ZeroMQ REQ
// socket carrying clear loads in msgpack. It authenticates like salt-api
// does, with an eauth token the master issues (mk_token) for the same
// account, so the master checks the same ACL; no minion or master key is
// read. Clear loads are not encrypted: use it on the master host only.
package saltreq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/salt-volumes/salt-volumes/internal/events"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
)

// DefaultURL is the request server of a master on this host.
const DefaultURL = "tcp://127.0.0.1:4506"

// Config says where the master's request server is and which eauth
// account publishes.
type Config struct {
	URL      string // tcp://host:port; default DefaultURL
	Username string
	Password string `json:"-"`
	Eauth    string
	// Timeout bounds one request and its reply (default 30 s, Salt's
	// publish_timeout).
	Timeout time.Duration
	Log     *slog.Logger
}

// Error is the master's refusal of a request.
type Error struct {
	Name    string // AuthenticationError, AuthorizationError, ...
	Message string
	Op      string
}

func (e *Error) Error() string {
	hint := ""
	switch e.Name {
	case "AuthenticationError":
		hint = " (check salt.username, salt.password and salt.eauth)"
	case "AuthorizationError":
		hint = " (the account's external_auth ACL does not allow it: see deploy/master.d/salt-volumes.conf)"
	}
	return fmt.Sprintf("salt master %s: %s: %s%s", e.Op, e.Name, e.Message, hint)
}

// Client publishes through one master. Each request has a connection of
// its own, as Salt's own LocalClient opens a channel per publish: the
// master sends ZMTP heartbeats (PING every 10 s, and drops a peer that
// does not answer within 30 s), which zmq4's REQ socket neither answers
// nor keeps out of the replies; a connection that lives milliseconds meets
// none. Requests are serialised: the token is shared.
type Client struct {
	cfg Config

	mu     sync.Mutex
	token  string
	expire time.Time
	life   time.Duration
	logins int
}

// CheckURL is the one check of salt.master, shared with config loading so
// a bad address is refused before serve starts anything.
func CheckURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" || u.Path != "" {
		return fmt.Errorf("salt.master: %q is not tcp://HOST:PORT (the master's ret_port, e.g. %s)", s, DefaultURL)
	}
	return nil
}

// New checks cfg; nothing is dialled until the first request.
func New(cfg Config) (*Client, error) {
	if cfg.URL == "" {
		cfg.URL = DefaultURL
	}
	if err := CheckURL(cfg.URL); err != nil {
		return nil, err
	}
	if cfg.Username == "" || cfg.Password == "" || cfg.Eauth == "" {
		return nil, errors.New("salt.username, salt.password and salt.eauth are needed to publish through the master (the same eauth account as for salt-api)")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Client{cfg: cfg}, nil
}

// Logins is how many tokens the master has issued to this client.
func (c *Client) Logins() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logins
}

// Close forgets the token; nothing else is held between requests.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.token = ""
}

// request sends one clear load and returns the decoded reply. Callers
// hold mu.
func (c *Client) request(ctx context.Context, op string, load map[string]any) (any, error) {
	msg, err := msgpack.Marshal(map[string]any{"enc": "clear", "load": load, "version": 3})
	if err != nil {
		return nil, fmt.Errorf("salt master %s: encoding the request: %w", op, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	sock := zmq4.NewReq(context.Background(), zmq4.WithDialerTimeout(5*time.Second))
	// Closing it also ends a Send or Recv still waiting (timeout).
	defer sock.Close()
	if err := sock.Dial(c.cfg.URL); err != nil {
		return nil, &sendError{fmt.Errorf("salt master %s: connecting to %s: %w (is salt-master running, and is salt.master its ret_port?)", op, c.cfg.URL, err)}
	}
	type result struct {
		m   zmq4.Msg
		err error
	}
	done := make(chan result, 1)
	go func() {
		if err := sock.Send(zmq4.NewMsg(msg)); err != nil {
			done <- result{err: &sendError{err}}
			return
		}
		for range 10 {
			m, err := sock.Recv()
			// A ZMTP command (the master's heartbeat PING) is not the
			// reply: zmq4's REQ socket hands it over as a message.
			if err == nil && m.Type == zmq4.CmdMsg {
				continue
			}
			done <- result{m, err}
			return
		}
		done <- result{err: errors.New("only ZMTP commands came back, no reply")}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("salt master %s: no answer from %s within %s: %w", op, c.cfg.URL, c.cfg.Timeout, ctx.Err())
	}
	if r.err != nil {
		var se *sendError
		if errors.As(r.err, &se) {
			return nil, &sendError{fmt.Errorf("salt master %s: %w", op, se.err)}
		}
		return nil, fmt.Errorf("salt master %s: %w", op, r.err)
	}
	if len(r.m.Frames) != 1 {
		return nil, fmt.Errorf("salt master %s: a reply of %d frames, want 1", op, len(r.m.Frames))
	}
	v, err := events.DecodeMsgpack(r.m.Frames[0])
	if err != nil {
		return nil, fmt.Errorf("salt master %s: undecodable reply (%d bytes): %w", op, len(r.m.Frames[0]), err)
	}
	return v, nil
}

// sendError is a request that never left: no connection, or a broken one
// (a restarting master). Sending it again cannot run it twice.
type sendError struct{ err error }

func (e *sendError) Error() string { return e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }

// requestOnce is request, sent again once on a new socket when the first
// could not be sent. Callers hold mu.
func (c *Client) requestOnce(ctx context.Context, op string, load map[string]any) (any, error) {
	v, err := c.request(ctx, op, load)
	var se *sendError
	if errors.As(err, &se) {
		c.cfg.Log.Info("the salt master could not be reached; trying once more", "master", c.cfg.URL, "error", se.err)
		v, err = c.request(ctx, op, load)
	}
	return v, err
}

// Token is a token the master issued.
type Token struct {
	Token  string
	Expire time.Time
}

// ParseToken reads mk_token's reply: the token's fields, or "" when the
// master refused the credentials.
func ParseToken(v any) (Token, error) {
	m, ok := v.(map[string]any)
	if !ok {
		if s, isStr := v.(string); isStr && s == "" {
			return Token{}, &Error{Op: "mk_token", Name: "AuthenticationError", Message: "the master refused the credentials"}
		}
		return Token{}, fmt.Errorf("salt master mk_token: unexpected reply %s", brief(v))
	}
	tok, _ := m["token"].(string)
	if tok == "" {
		return Token{}, fmt.Errorf("salt master mk_token: a reply without a token %s", brief(keys(m)))
	}
	var exp time.Time
	switch e := m["expire"].(type) {
	case float64:
		exp = time.Unix(0, int64(e*float64(time.Second)))
	case int64:
		exp = time.Unix(e, 0)
	case uint64:
		exp = time.Unix(int64(e), 0)
	default:
		return Token{}, fmt.Errorf("salt master mk_token: a token without an expiry (%T)", m["expire"])
	}
	return Token{Token: tok, Expire: exp}, nil
}

// login gets a token unless the one held has enough life left: a minute,
// or a tenth of its life for tokens shorter than ten minutes. Callers hold
// mu.
func (c *Client) login(ctx context.Context, force bool) error {
	if !force && c.token != "" && time.Until(c.expire) > min(time.Minute, c.life/10) {
		return nil
	}
	v, err := c.requestOnce(ctx, "mk_token", map[string]any{
		"cmd": "mk_token", "eauth": c.cfg.Eauth, "username": c.cfg.Username, "password": c.cfg.Password,
	})
	if err != nil {
		return err
	}
	t, err := ParseToken(v)
	if err != nil {
		return err
	}
	c.token, c.expire, c.life = t.Token, t.Expire, time.Until(t.Expire)
	c.logins++
	c.cfg.Log.Info("token issued by the salt master", "username", c.cfg.Username, "eauth", c.cfg.Eauth, "expires", t.Expire.Round(time.Second))
	return nil
}

// ParsePublish reads publish's reply.
func ParsePublish(v any) (saltapi.Job, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return saltapi.Job{}, fmt.Errorf("salt master publish: unexpected reply %s", brief(v))
	}
	if e, ok := m["error"].(map[string]any); ok {
		name, _ := e["name"].(string)
		msg, _ := e["message"].(string)
		return saltapi.Job{}, &Error{Op: "publish", Name: name, Message: msg}
	}
	if s, ok := m["error"].(string); ok {
		return saltapi.Job{}, fmt.Errorf("salt master publish: %s", s)
	}
	load, ok := m["load"].(map[string]any)
	if !ok {
		return saltapi.Job{}, fmt.Errorf("salt master publish: a reply without a load %s", brief(keys(m)))
	}
	var job saltapi.Job
	job.JID, _ = load["jid"].(string)
	if ms, ok := load["minions"].([]any); ok {
		for _, x := range ms {
			if s, ok := x.(string); ok {
				job.Minions = append(job.Minions, s)
			}
		}
	}
	if job.JID == "" {
		if s, _ := load["error"].(string); s != "" && len(job.Minions) == 0 {
			return saltapi.Job{}, fmt.Errorf("%w: %s", saltapi.ErrNoMinions, s)
		}
		return saltapi.Job{}, fmt.Errorf("salt master publish: a reply without a jid %s", brief(load))
	}
	return job, nil
}

// LocalAsync publishes fun to the one minion tgt (a list of one: never a
// glob) and returns the job id, as salt-api's local_async does. A token
// the master no longer accepts (expired, or removed) is renewed once.
func (c *Client) LocalAsync(ctx context.Context, tgt, fun string, arg []any, kwarg map[string]any) (saltapi.Job, error) {
	args := append([]any{}, arg...)
	if len(kwarg) > 0 {
		// Salt's packing of keyword arguments into arg (LocalClient does
		// the same with salt.utils.args.condition_input).
		kw := map[string]any{"__kwarg__": true}
		for k, v := range kwarg {
			kw[k] = v
		}
		args = append(args, kw)
	}
	// What salt-api would get: the arguments as JSON sees them (field names
	// from json tags, quantities as their strings), not as msgpack would
	// encode Go structs.
	plainArgs, err := plain(args)
	if err != nil {
		return saltapi.Job{}, fmt.Errorf("salt master publish %s: encoding the arguments: %w", fun, err)
	}
	var md any
	if m := saltapi.Metadata(ctx); m != nil {
		if md, err = plain(m); err != nil {
			return saltapi.Job{}, fmt.Errorf("salt master publish %s: encoding the metadata: %w", fun, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for try := 0; ; try++ {
		if err := c.login(ctx, try > 0); err != nil {
			return saltapi.Job{}, err
		}
		kwargs := map[string]any{"token": c.token}
		if md != nil {
			kwargs["metadata"] = md
		}
		v, err := c.requestOnce(ctx, "publish", map[string]any{
			"cmd": "publish", "tgt": []string{tgt}, "tgt_type": "list", "fun": fun, "arg": plainArgs,
			"ret": "", "jid": "", "user": c.cfg.Username, "kwargs": kwargs,
		})
		if err != nil {
			return saltapi.Job{}, err
		}
		job, err := ParsePublish(v)
		var me *Error
		if try == 0 && errors.As(err, &me) && me.Name == "AuthenticationError" {
			c.cfg.Log.Info("the salt master refused the token; asking for a new one", "username", c.cfg.Username)
			continue
		}
		return job, err
	}
}

// plain turns v into maps, slices, strings, booleans and numbers by its
// JSON encoding; integers stay integers.
func plain(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		return nil, err
	}
	return numbers(out), nil
}

func numbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = numbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbers(e)
		}
	}
	return v
}

// Jobs publishes through the master and looks jobs up with Lookup (the
// job cache, or salt-api).
type Jobs struct {
	*Client
	Lookup saltapi.Jobs
}

// ListJob implements saltapi.Jobs.
func (j Jobs) ListJob(ctx context.Context, jid string) (saltapi.JobInfo, error) {
	return j.Lookup.ListJob(ctx, jid)
}

func keys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

// brief shows a reply's shape without a token or password that could be
// in it: types and keys only.
func brief(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return fmt.Sprintf("(a map of %s)", strings.Join(keys(x), ", "))
	case []string:
		return fmt.Sprintf("(keys %s)", strings.Join(x, ", "))
	case string:
		if len(x) > 80 {
			x = x[:80] + "..."
		}
		return fmt.Sprintf("%q", x)
	default:
		return fmt.Sprintf("(%T)", v)
	}
}
