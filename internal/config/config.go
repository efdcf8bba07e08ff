// Package config reads salt-volumes serve's YAML configuration.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/salt-volumes/salt-volumes/internal/saltreq"
)

// Config is the whole file. Unknown keys are errors, so a typo never falls
// back to a default silently.
type Config struct {
	// Listen is the API address. Beyond loopback it needs TLS, or
	// Insecure for a network that protects it some other way.
	Listen   string `yaml:"listen"`
	TLS      *TLS   `yaml:"tls"`
	Insecure bool   `yaml:"insecure"`
	// Token (or TokenFile) is the API bearer token.
	Token     string `yaml:"token"`
	TokenFile string `yaml:"tokenFile"`
	// Store is the bbolt file holding the volume objects (one control
	// plane); Etcd instead keeps them in etcd, for several replicas.
	Store  string `yaml:"store"`
	Etcd   *Etcd  `yaml:"etcd"`
	Salt   Salt   `yaml:"salt"`
	Events Events `yaml:"events"`
	// JobTimeout bounds the wait for a job's return (default 10m).
	JobTimeout Duration `yaml:"jobTimeout"`
	// PollInterval > 0 replaces the event source with job polling.
	PollInterval Duration `yaml:"pollInterval"`
	Workers      int      `yaml:"workers"`
	// BatchSize is the most volumes one state run prepares, or removes,
	// on a node (default 16; 1: each volume its own run).
	BatchSize int    `yaml:"batchSize"`
	LogLevel  string `yaml:"logLevel"`
	Limits    Limits `yaml:"limits"`
	// Audit bounds the audit trail kept in the store.
	Audit Audit `yaml:"audit"`
	// Access maps Salt users and groups who log in onto roles.
	Access Access `yaml:"access"`
	// Snapshots tunes the snapshots the control plane takes.
	Snapshots Snapshots `yaml:"snapshots"`
	// Version is the binary's, set by the command that runs serve (never
	// read from the file): GET /api/v1/info tells it.
	Version string `yaml:"-"`
	// Kubernetes turns on Kubernetes mode: PVs for volumes, provisioning
	// from claims. Absent: no Kubernetes at all.
	Kubernetes *Kubernetes `yaml:"kubernetes"`

	nonLoopback bool
	storeSet    bool // store was given (not defaulted)
}

// TLS is serve's own HTTPS: the certificate and key files are read again
// when they change (a renewal needs no restart).
type TLS struct {
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// ClientCAFile, when set, makes serve ask every client for a
	// certificate signed by one of its CAs, besides the token.
	ClientCAFile string `yaml:"clientCAFile"`
	// CAFile is what a follower trusts when it passes a request to the
	// leader's https advertise URL (default: the system's roots).
	CAFile string `yaml:"caFile"`
}

// Kubernetes is how to reach the API server and what to serve there.
type Kubernetes struct {
	// Kubeconfig is a kubeconfig file; empty: the in-cluster service
	// account (serve running in a pod).
	Kubeconfig string `yaml:"kubeconfig"`
	// NodeNameGrain names a grain holding each minion's Kubernetes node
	// name; empty: node names are the minion ids.
	NodeNameGrain string `yaml:"nodeNameGrain"`
	// StorageClass is the class of the PVs of volumes created through the
	// API, the CLI, the UI or Volume objects (default salt-volumes-static:
	// a class no provisioning class shares, so that tenants' claims of
	// those classes never bind them; deploy/kubernetes/claims-policy.yaml
	// keeps tenants out of this one). At start serve moves its PVs that no
	// claim holds into it; a Bound one keeps its class and is reported.
	StorageClass string `yaml:"storageClass"`
	// Provisioner is the name StorageClasses give to have their claims
	// provisioned by salt-volumes (default salt-volumes.io/sparse).
	Provisioner string `yaml:"provisioner"`
	// SyncTimeout bounds the first read of the API server's objects at
	// start (default 60s).
	SyncTimeout Duration `yaml:"syncTimeout"`
	// VolumeObjects keeps the volumes as Volume objects in the API server
	// (deploy/kubernetes/volume-crd.yaml) instead of the store file:
	// kubectl, GitOps and RBAC work on them, and replicas elect the one
	// that reconciles with a Lease.
	VolumeObjects bool `yaml:"volumeObjects"`
	// Namespace holds the election's Lease (default salt-volumes).
	Namespace string `yaml:"namespace"`
	// LeaseDuration is how long the Lease lasts unrenewed (default 15s,
	// at least 3s): a leader that stops renewing is replaced after it.
	LeaseDuration Duration `yaml:"leaseDuration"`
	// ReplicaID and AdvertiseURL name this replica to the others, as
	// etcd.replicaID and etcd.advertiseURL do.
	ReplicaID    string `yaml:"replicaID"`
	AdvertiseURL string `yaml:"advertiseURL"`
	// Audiences a Kubernetes bearer token must be made for to be taken by
	// the REST API (kubectl create token SA --audience salt-volumes);
	// default [salt-volumes]. Never the API server's own: any pod's
	// service-account token, or a user's kubeconfig token, would work.
	Audiences []string `yaml:"audiences"`
}

// Etcd is the replicated store: every replica serves, one elected leader
// reconciles.
type Etcd struct {
	Endpoints []string `yaml:"endpoints"`
	// Prefix roots our keys (default /salt-volumes).
	Prefix string `yaml:"prefix"`
	// TLS: the CA that signed the members' certificates, and this
	// replica's client certificate and key.
	CAFile   string `yaml:"caFile"`
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// RequestTimeout bounds one write (default 5s): past it the API
	// answers 503.
	RequestTimeout Duration `yaml:"requestTimeout"`
	// SessionTTL is the leader's lease (default 10s): a leader that stops
	// renewing it is replaced this long after its last renewal.
	SessionTTL Duration `yaml:"sessionTTL"`
	// ReplicaID names this replica in the election (default: the host
	// name and the listen port).
	ReplicaID string `yaml:"replicaID"`
	// AdvertiseURL is where other replicas and people reach this one's
	// API; shown by followers as the leader's address (default
	// http://<listen>).
	AdvertiseURL string `yaml:"advertiseURL"`
}

// Snapshots tunes the snapshots the control plane takes.
type Snapshots struct {
	// MinScheduleEvery is the shortest interval a snapshot schedule made
	// through the API may have (default 1m, at least 1s): a test knob,
	// so that a test sees a schedule run in seconds.
	MinScheduleEvery Duration `yaml:"minScheduleEvery"`
}

// Limits bound what API clients can make serve hold.
type Limits struct {
	// Watchers is the most watch streams open at once (default 1000).
	Watchers int `yaml:"watchers"`
	// Volumes is the most volumes the store holds (default 100000).
	Volumes int `yaml:"volumes"`
	// CreatesPerSecond bounds the create rate, with a burst of twice as
	// many (default 100).
	CreatesPerSecond float64 `yaml:"createsPerSecond"`
}

// Salt is how to reach salt-api.
type Salt struct {
	URL                string `yaml:"url"`
	Username           string `yaml:"username"`
	Password           string `yaml:"password"`
	PasswordFile       string `yaml:"passwordFile"`
	Eauth              string `yaml:"eauth"`
	CAFile             string `yaml:"caFile"`
	InsecureSkipVerify bool   `yaml:"insecureSkipVerify"`
	// JobCache is the master's local job cache (<cachedir>/jobs, by default
	// /var/cache/salt/master/jobs). Set, job returns are confirmed by
	// reading it (serve on the master's host, in the master's group or as
	// its user) instead of asking salt-api; jobs it cannot read still go
	// to salt-api.
	JobCache string `yaml:"jobCache"`
	// HashType is the master's hash_type, which names the cache's
	// directories (default sha256).
	HashType string `yaml:"hashType"`
	// Publish is the door jobs are started through: "master" (the master's
	// request server, Master; the default with events.source bus, i.e. on
	// the master host) or "salt-api" (the default elsewhere).
	Publish string `yaml:"publish"`
	// Master is the master's request server (its ret_port), for publish:
	// master.
	Master string `yaml:"master"`
}

// The doors jobs can be published through (Salt.Publish).
const (
	PublishMaster  = "master"
	PublishSaltAPI = "salt-api"
)

// Events selects the event source.
type Events struct {
	// Source is "bus" (the master's event socket; the control plane runs on
	// the master) or "sse" (salt-api's GET /events).
	Source string `yaml:"source"`
	// Socket is master_event_pub.ipc (ipc_mode: ipc); TCP is host:port of
	// the master's event publisher when ipc_mode is tcp (127.0.0.1:4512).
	Socket string `yaml:"socket"`
	TCP    string `yaml:"tcp"`
}

// Access: who may log in with their Salt identity, and with which role.
// A user's role is the highest of their own entry, their groups' entries
// (groups as the master's eauth reports them) and DefaultRole.
type Access struct {
	Users  map[string]string `yaml:"users"`
	Groups map[string]string `yaml:"groups"`
	// DefaultRole is the role of any other user the master authenticates
	// ("" or absent: their login is refused).
	DefaultRole string `yaml:"defaultRole"`
	// SessionTTL is how long a login lasts (default 12h).
	SessionTTL Duration `yaml:"sessionTTL"`
	// Eauth lists the eauth backends people may log in with (default:
	// pam alone). A user entry "NAME" is for NAME from any of them,
	// "EAUTH:NAME" (and a group "EAUTH:GROUP") for that backend alone.
	Eauth []string `yaml:"eauth"`
}

// Audit bounds the audit trail: entries older than MaxAge go, and the
// oldest beyond MaxEntries.
type Audit struct {
	MaxAge     Duration `yaml:"maxAge"`     // default 90d
	MaxEntries int      `yaml:"maxEntries"` // default 5000
}

// Duration is a time.Duration written as "10m", "30s", or in whole days
// as "90d".
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if days, ok := strings.CutSuffix(n.Value, "d"); ok && err != nil {
		if k, aerr := strconv.Atoi(days); aerr == nil && k >= 0 {
			v, err = time.Duration(k)*24*time.Hour, nil
		}
	}
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration: write it like 30s, 10m, 1h or 90d", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// Load reads, defaults and validates a config file.
func Load(path string) (*Config, error) { return LoadWith(path, Overrides{}) }

// Overrides are settings given on serve's command line, which win over the
// file's: what differs between replicas sharing one file (a ConfigMap).
type Overrides struct {
	// Listen replaces listen, before the replica's id and advertised URL
	// are derived from it.
	Listen string
	// MinScheduleEvery replaces snapshots.minScheduleEvery (a test knob).
	MinScheduleEvery time.Duration
}

// LoadWith is Load with o applied over the file.
func LoadWith(path string, o Overrides) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	c, err := parse(data, o)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates config text.
func Parse(data []byte) (*Config, error) { return parse(data, Overrides{}) }

func parse(data []byte, o Overrides) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if o.Listen != "" {
		c.Listen = o.Listen
	}
	if o.MinScheduleEvery != 0 {
		c.Snapshots.MinScheduleEvery = Duration(o.MinScheduleEvery)
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if err := c.checkTLS(); err != nil {
		return nil, err
	}
	if err := c.defaultStore(); err != nil {
		return nil, err
	}
	if c.Salt.Eauth == "" {
		c.Salt.Eauth = "file"
	}
	if c.Events.Source == "" {
		c.Events.Source = "bus"
	}
	if c.Salt.Publish == "" {
		// On the master host the request server is at hand, and faster:
		// salt-api builds a client per request (docs/development.md).
		c.Salt.Publish = PublishSaltAPI
		if c.Events.Source == "bus" {
			c.Salt.Publish = PublishMaster
		}
	}
	if c.Salt.Master == "" {
		c.Salt.Master = saltreq.DefaultURL
	}
	if c.Events.Socket == "" && c.Events.TCP == "" {
		c.Events.Socket = "/var/run/salt/master/master_event_pub.ipc"
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.Limits.Watchers == 0 {
		c.Limits.Watchers = 1000
	}
	if c.Limits.Volumes == 0 {
		c.Limits.Volumes = 100000
	}
	if c.Limits.CreatesPerSecond == 0 {
		c.Limits.CreatesPerSecond = 100
	}
	if k := c.Kubernetes; k != nil {
		if k.StorageClass == "" {
			k.StorageClass = "salt-volumes-static"
		}
		if k.Provisioner == "" {
			k.Provisioner = "salt-volumes.io/sparse"
		}
		if k.SyncTimeout == 0 {
			k.SyncTimeout = Duration(time.Minute)
		}
		if k.Audiences == nil {
			k.Audiences = []string{"salt-volumes"}
		}
		if len(k.Audiences) == 0 || slices.Contains(k.Audiences, "") {
			return nil, errors.New("kubernetes.audiences: give the audiences Kubernetes tokens must be made for (default [salt-volumes]: kubectl create token SA --audience salt-volumes), none empty")
		}
		if !strings.Contains(k.Provisioner, "/") {
			return nil, fmt.Errorf("kubernetes.provisioner: %q: use the <vendor>/<name> form Kubernetes expects, e.g. salt-volumes.io/sparse", k.Provisioner)
		}
		if k.Kubeconfig != "" {
			if _, err := os.Stat(k.Kubeconfig); err != nil {
				return nil, fmt.Errorf("kubernetes.kubeconfig: %w", err)
			}
		}
		if err := c.defaultVolumeObjects(k); err != nil {
			return nil, err
		}
	}
	if c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("tokenFile: %w", err)
		}
		c.Token = strings.TrimSpace(string(b))
	}
	if c.Salt.PasswordFile != "" {
		b, err := os.ReadFile(c.Salt.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("salt.passwordFile: %w", err)
		}
		c.Salt.Password = strings.TrimRight(string(b), "\r\n")
	}
	switch {
	case len(c.Token) < 16:
		return nil, errors.New("token: set token or tokenFile to a secret of at least 16 characters (e.g. openssl rand -hex 32)")
	case c.Salt.URL == "":
		return nil, errors.New("salt.url: missing: the salt-api address, e.g. https://127.0.0.1:8000")
	case c.Salt.Username == "" || c.Salt.Password == "":
		return nil, errors.New("salt.username/salt.password: missing: the eauth account the control plane logs in with")
	case c.Salt.Publish != PublishMaster && c.Salt.Publish != PublishSaltAPI:
		return nil, fmt.Errorf("salt.publish: %q: use master (the master's request server, on the master host) or salt-api", c.Salt.Publish)
	case c.Salt.Publish == PublishMaster && saltreq.CheckURL(c.Salt.Master) != nil:
		return nil, saltreq.CheckURL(c.Salt.Master)
	case c.Events.Source != "bus" && c.Events.Source != "sse":
		return nil, fmt.Errorf("events.source: %q: use bus (on the master host) or sse (salt-api /events)", c.Events.Source)
	case c.Workers < 0:
		return nil, errors.New("workers: must be positive")
	case c.BatchSize < 0:
		return nil, errors.New("batchSize: must be positive: the most volumes one state run prepares on a node (1: one each)")
	case c.Salt.HashType != "" && c.Salt.HashType != "sha256" && c.Salt.HashType != "sha1" && c.Salt.HashType != "sha512" && c.Salt.HashType != "md5":
		return nil, fmt.Errorf("salt.hashType: %q: use the master's hash_type: sha256 (Salt's default), sha512, sha1 or md5", c.Salt.HashType)
	case c.Limits.Watchers < 0 || c.Limits.Volumes < 0 || c.Limits.CreatesPerSecond < 0:
		return nil, errors.New("limits: watchers, volumes and createsPerSecond must be positive")
	case c.Audit.MaxAge < 0 || c.Audit.MaxEntries < 0:
		return nil, errors.New("audit: maxAge and maxEntries must be positive (leave them out for 90d and 5000)")
	case c.Access.SessionTTL < 0:
		return nil, errors.New("access.sessionTTL: must be positive (leave it out for 12h)")
	case c.Snapshots.MinScheduleEvery != 0 && (c.Snapshots.MinScheduleEvery < Duration(time.Second) || c.Snapshots.MinScheduleEvery > Duration(time.Hour)):
		return nil, fmt.Errorf("snapshots.minScheduleEvery: %s: give 1s to 1h, or leave it out for 1m (a lower floor is for tests)", time.Duration(c.Snapshots.MinScheduleEvery))
	}
	if c.Access.SessionTTL == 0 {
		c.Access.SessionTTL = Duration(12 * time.Hour)
	}
	for field, m := range map[string]map[string]string{"access.users": c.Access.Users, "access.groups": c.Access.Groups} {
		for k, v := range m {
			if !validRole(v) {
				return nil, fmt.Errorf("%s.%s: %q is not a role: give viewer, operator or admin", field, k, v)
			}
		}
	}
	if c.Access.DefaultRole != "" && !validRole(c.Access.DefaultRole) {
		return nil, fmt.Errorf("access.defaultRole: %q is not a role: give viewer, operator or admin, or leave it out to refuse users not listed", c.Access.DefaultRole)
	}
	if host, _, err := net.SplitHostPort(c.Listen); err != nil {
		return nil, fmt.Errorf("listen: %q: use host:port, e.g. 127.0.0.1:8080", c.Listen)
	} else if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		// The token (and a person's password, once they log in) would
		// cross the network in clear: refused unless the operator says
		// something else protects it.
		c.nonLoopback = true
		if c.TLS == nil && !c.Insecure {
			return nil, fmt.Errorf("listen: %s is beyond loopback without TLS: set tls.certFile and tls.keyFile, or insecure: true if a proxy or the network protects the API", c.Listen)
		}
	}
	return &c, nil
}

// defaultVolumeObjects checks and completes the settings of volumes kept
// as Volume objects.
func (c *Config) defaultVolumeObjects(k *Kubernetes) error {
	if !k.VolumeObjects {
		return nil
	}
	switch {
	case c.storeSet:
		return errors.New("store and kubernetes.volumeObjects: both set: with volumeObjects the volumes live in the API server; drop store (salt-volumes store migrate moves a store file's volumes into Volume objects)")
	case k.LeaseDuration != 0 && time.Duration(k.LeaseDuration) < 3*time.Second:
		return fmt.Errorf("kubernetes.leaseDuration: %s is too short: at least 3s (default 15s)", time.Duration(k.LeaseDuration))
	}
	c.Store = ""
	if k.Namespace == "" {
		k.Namespace = "salt-volumes"
	}
	if k.LeaseDuration == 0 {
		k.LeaseDuration = Duration(15 * time.Second)
	}
	if k.AdvertiseURL == "" {
		if wildcard(c.Listen) {
			return fmt.Errorf("kubernetes.advertiseURL: missing while listen is %s (every address): the other replicas would be sent to themselves; give the URL they reach this one at, e.g. https://master-1:8443", c.Listen)
		}
		k.AdvertiseURL = c.scheme() + "://" + c.Listen
	}
	if k.ReplicaID == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(c.Listen)
		k.ReplicaID = host + ":" + port
	}
	return nil
}

func (c *Config) defaultStore() error {
	e := c.Etcd
	c.storeSet = c.Store != ""
	if e == nil {
		if c.Store == "" {
			c.Store = "/var/lib/salt-volumes-control/volumes.db"
		}
		return nil
	}
	switch {
	case c.Store != "":
		return errors.New("store and etcd: both set: store names a bbolt file for one control plane, etcd a cluster for several; keep one (salt-volumes store migrate moves volumes between them)")
	case len(e.Endpoints) == 0:
		return errors.New("etcd.endpoints: missing: list the etcd members' client URLs, e.g. [https://10.0.0.1:2379, https://10.0.0.2:2379, https://10.0.0.3:2379]")
	case (e.CertFile == "") != (e.KeyFile == ""):
		return errors.New("etcd.certFile/etcd.keyFile: give both (this replica's client certificate and its key) or neither")
	case c.Kubernetes != nil:
		return errors.New("etcd and kubernetes: both set: in Kubernetes mode several replicas keep the volumes as Volume objects in the API server instead (kubernetes.volumeObjects: true); drop etcd")
	case e.SessionTTL != 0 && time.Duration(e.SessionTTL) < 2*time.Second:
		return fmt.Errorf("etcd.sessionTTL: %s is too short: at least 2s (default 10s); a leader is replaced this long after it stops renewing", time.Duration(e.SessionTTL))
	}
	for _, ep := range e.Endpoints {
		if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") {
			return fmt.Errorf("etcd.endpoints: %q: write each member as a URL, https://host:2379", ep)
		}
	}
	if e.Prefix == "" {
		e.Prefix = "/salt-volumes"
	}
	if !strings.HasPrefix(e.Prefix, "/") {
		return fmt.Errorf("etcd.prefix: %q: start it with a slash, e.g. /salt-volumes", e.Prefix)
	}
	if e.RequestTimeout == 0 {
		e.RequestTimeout = Duration(5 * time.Second)
	}
	if e.SessionTTL == 0 {
		e.SessionTTL = Duration(10 * time.Second)
	}
	if e.AdvertiseURL == "" {
		if wildcard(c.Listen) {
			return fmt.Errorf("etcd.advertiseURL: missing while listen is %s (every address): the other replicas would be sent to themselves; give the URL they reach this one at, e.g. https://master-1:8443", c.Listen)
		}
		e.AdvertiseURL = c.scheme() + "://" + c.Listen
	}
	if e.ReplicaID == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(c.Listen)
		e.ReplicaID = host + ":" + port
	}
	return nil
}

// wildcard reports a listen address on every interface (0.0.0.0, ::, or
// no host), which names no host another replica could reach.
func wildcard(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// checkTLS checks that the tls section names files that exist, in pairs
// that make sense; certs loads them.
func (c *Config) checkTLS() error {
	t := c.TLS
	if t == nil {
		return nil
	}
	switch {
	case t.CertFile == "" && t.KeyFile == "":
		return errors.New("tls: certFile and keyFile: missing: give both (PEM files), or remove the tls section")
	case t.CertFile == "":
		return errors.New("tls.certFile: missing while tls.keyFile is set: give both")
	case t.KeyFile == "":
		return errors.New("tls.keyFile: missing while tls.certFile is set: give both")
	}
	for _, f := range []struct{ name, path string }{{"tls.certFile", t.CertFile}, {"tls.keyFile", t.KeyFile}, {"tls.clientCAFile", t.ClientCAFile}, {"tls.caFile", t.CAFile}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}

// scheme is how other replicas and clients reach this one.
func (c *Config) scheme() string {
	if c.TLS != nil {
		return "https"
	}
	return "http"
}

// NonLoopback reports a listen address reachable from other hosts.
func (c *Config) NonLoopback() bool { return c.nonLoopback }

func validRole(r string) bool { return r == "viewer" || r == "operator" || r == "admin" }
