package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const base = `token: 0123456789abcdef0123
salt:
  url: http://127.0.0.1:8000
  username: salt-volumes
  password: secret
`

func TestDefaults(t *testing.T) {
	c, err := Parse([]byte(base))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8080", c.Listen)
	assert.Equal(t, "bus", c.Events.Source)
	assert.Equal(t, "/var/run/salt/master/master_event_pub.ipc", c.Events.Socket)
	assert.Equal(t, "file", c.Salt.Eauth)
	assert.Equal(t, PublishMaster, c.Salt.Publish, "on the master host (bus), through its request server")
	assert.Equal(t, "tcp://127.0.0.1:4506", c.Salt.Master)
	assert.False(t, c.NonLoopback())
}

func TestErrorsNameTheField(t *testing.T) {
	cases := map[string]string{
		base + "jobTimout: 5m\n":          "field jobTimout not found",
		base + "jobTimeout: soon\n":       `"soon" is not a duration`,
		base + "events:\n  source: zmq\n": "events.source",
		"token: short\n":                  "token:",
		"token: 0123456789abcdef0123\n":   "salt.url",
		base + "salt:\n  url: x\n":        "mapping key \"salt\" already defined",
		base + "listen: 8080\n":           "listen:",
		base + "workers: -1\n":            "workers",
		base + "batchSize: -2\n":          "batchSize: must be positive",
		strings.Replace(base, "salt:\n", "salt:\n  publish: zmq\n", 1):           "salt.publish: \"zmq\": use master",
		strings.Replace(base, "salt:\n", "salt:\n  master: 127.0.0.1:4506\n", 1): "salt.master: \"127.0.0.1:4506\" is not tcp://HOST:PORT",
	}
	for text, want := range cases {
		_, err := Parse([]byte(text))
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), want, text)
	}
}

// The schedule floor (a test knob): the file's, or serve's flag over it,
// within 1s to 1h.
func TestMinScheduleEvery(t *testing.T) {
	c, err := Parse([]byte(base + "snapshots:\n  minScheduleEvery: 1s\n"))
	require.NoError(t, err)
	assert.Equal(t, time.Second, time.Duration(c.Snapshots.MinScheduleEvery))
	c, err = parse([]byte(base), Overrides{MinScheduleEvery: 2 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, time.Duration(c.Snapshots.MinScheduleEvery))
	c, err = Parse([]byte(base))
	require.NoError(t, err)
	assert.Zero(t, c.Snapshots.MinScheduleEvery, "unset: the service's default, 1m")
	_, err = Parse([]byte(base + "snapshots:\n  minScheduleEvery: 500ms\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "snapshots.minScheduleEvery: 500ms: give 1s to 1h")
}

func TestValues(t *testing.T) {
	c, err := Parse([]byte(base + "jobTimeout: 90s\nlisten: 0.0.0.0:9000\ninsecure: true\nevents:\n  source: sse\n"))
	require.NoError(t, err)
	assert.Equal(t, 90*time.Second, time.Duration(c.JobTimeout))
	assert.True(t, c.NonLoopback())
	assert.Equal(t, "sse", c.Events.Source)
	assert.Equal(t, PublishSaltAPI, c.Salt.Publish, "away from the master host, through salt-api")
}

// The example operators copy (deploy/config.yaml) must load as shipped,
// once its secret files exist.
func TestShippedExample(t *testing.T) {
	b, err := os.ReadFile("../../deploy/config.yaml")
	require.NoError(t, err)
	dir := t.TempDir()
	text := strings.ReplaceAll(string(b), "/etc/salt-volumes/", dir+"/")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte("0123456789abcdef0123\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "salt-api-password"), []byte("secret\n"), 0o600))
	c, err := Parse([]byte(text))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8080", c.Listen)
	assert.Equal(t, "0123456789abcdef0123", c.Token)
	assert.Equal(t, "secret", c.Salt.Password)
	assert.Equal(t, "bus", c.Events.Source)
	assert.Equal(t, "/var/cache/salt/master/jobs", c.Salt.JobCache)
	assert.Equal(t, PublishMaster, c.Salt.Publish)
	assert.False(t, c.NonLoopback())
}

func TestKubernetes(t *testing.T) {
	c, err := Parse([]byte(base))
	require.NoError(t, err)
	assert.Nil(t, c.Kubernetes, "no section: no Kubernetes mode")

	kc := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kc, []byte("apiVersion: v1\n"), 0o600))
	c, err = Parse([]byte(base + "kubernetes:\n  kubeconfig: " + kc + "\n"))
	require.NoError(t, err)
	require.NotNil(t, c.Kubernetes)
	assert.Equal(t, "salt-volumes-static", c.Kubernetes.StorageClass, "operators' PVs in a class of their own by default (#48)")
	assert.Equal(t, "salt-volumes.io/sparse", c.Kubernetes.Provisioner)
	assert.Equal(t, Duration(time.Minute), c.Kubernetes.SyncTimeout)
	assert.Equal(t, []string{"salt-volumes"}, c.Kubernetes.Audiences, "tokens made for serve only")
	c, err = Parse([]byte(base + "kubernetes:\n  audiences: [storage.example.com, salt-volumes]\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{"storage.example.com", "salt-volumes"}, c.Kubernetes.Audiences)

	for text, want := range map[string]string{
		"kubernetes:\n  audiences: []\n":                       "kubernetes.audiences",
		"kubernetes:\n  audiences: [\"\"]\n":                   "kubernetes.audiences",
		"kubernetes:\n  kubeconfig: /nonexistent/kubeconfig\n": "kubernetes.kubeconfig",
		"kubernetes:\n  provisioner: sparse\n":                 "kubernetes.provisioner",
		"kubernetes:\n  storageclass: x\n":                     "field storageclass not found",
	} {
		_, err := Parse([]byte(base + text))
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), want)
	}
}

func TestJobCache(t *testing.T) {
	base := "token: 0123456789abcdef0123\nsalt:\n  url: http://127.0.0.1:8000\n  username: u\n  password: p\n"
	_, err := Parse([]byte(base + "  hashType: crc32\n"))
	require.ErrorContains(t, err, "salt.hashType")
	dir := t.TempDir()
	c, err := Parse([]byte(base + "  jobCache: " + dir + "\n  hashType: sha512\n"))
	require.NoError(t, err)
	assert.Equal(t, dir, c.Salt.JobCache)
}

func TestEtcd(t *testing.T) {
	base := "token: 0123456789abcdef0123\nsalt:\n  url: http://127.0.0.1:8000\n  username: u\n  password: p\nlisten: 127.0.0.1:8081\n"
	c, err := Parse([]byte(base + "etcd:\n  endpoints: [http://127.0.0.1:2379]\n"))
	require.NoError(t, err)
	assert.Empty(t, c.Store, "no bbolt file with etcd")
	assert.Equal(t, "/salt-volumes", c.Etcd.Prefix)
	assert.Equal(t, 10*time.Second, time.Duration(c.Etcd.SessionTTL))
	assert.Equal(t, 5*time.Second, time.Duration(c.Etcd.RequestTimeout))
	assert.Equal(t, "http://127.0.0.1:8081", c.Etcd.AdvertiseURL)
	assert.Contains(t, c.Etcd.ReplicaID, ":8081")
	for text, want := range map[string]string{
		"etcd: {}\n": "etcd.endpoints: missing",
		"store: /x.db\netcd:\n  endpoints: [http://a:2379]\n":                     "store and etcd: both set",
		"etcd:\n  endpoints: [a:2379]\n":                                          "etcd.endpoints: \"a:2379\"",
		"etcd:\n  endpoints: [https://a:2379]\n  certFile: /c\n":                  "etcd.certFile/etcd.keyFile",
		"etcd:\n  endpoints: [https://a:2379]\n  sessionTTL: 500ms\n":             "etcd.sessionTTL",
		"etcd:\n  endpoints: [https://a:2379]\n  prefix: sv\n":                    "etcd.prefix",
		"etcd:\n  endpoints: [https://a:2379]\nkubernetes:\n  kubeconfig: \"\"\n": "in Kubernetes mode several replicas keep the volumes as Volume objects",
	} {
		_, err := Parse([]byte(base + text))
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), want, text)
	}
}

func TestVolumeObjects(t *testing.T) {
	base := "token: 0123456789abcdef0123\nsalt:\n  url: http://127.0.0.1:8000\n  username: u\n  password: p\nlisten: 127.0.0.1:8082\n"
	c, err := Parse([]byte(base + "kubernetes:\n  volumeObjects: true\n"))
	require.NoError(t, err)
	assert.Empty(t, c.Store, "no bbolt file: the volumes are Volume objects")
	assert.Equal(t, "salt-volumes", c.Kubernetes.Namespace)
	assert.Equal(t, 15*time.Second, time.Duration(c.Kubernetes.LeaseDuration))
	assert.Equal(t, "http://127.0.0.1:8082", c.Kubernetes.AdvertiseURL)
	assert.Contains(t, c.Kubernetes.ReplicaID, ":8082")
	c, err = Parse([]byte(base + "kubernetes: {}\n"))
	require.NoError(t, err)
	assert.NotEmpty(t, c.Store, "without volumeObjects, Kubernetes mode keeps its store file")
	for text, want := range map[string]string{
		"store: /x.db\nkubernetes:\n  volumeObjects: true\n":        "store and kubernetes.volumeObjects: both set",
		"kubernetes:\n  volumeObjects: true\n  leaseDuration: 1s\n": "kubernetes.leaseDuration: 1s is too short",
	} {
		_, err := Parse([]byte(base + text))
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), want, text)
	}
}

// serve --listen: replicas sharing one ConfigMap each listen on their own
// address, and name and advertise themselves by it.
func TestListenOverride(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(path, []byte("token: 0123456789abcdef0123\nsalt:\n  url: http://127.0.0.1:8000\n  username: u\n  password: p\n"+
		"listen: 127.0.0.1:8082\ninsecure: true\nkubernetes:\n  volumeObjects: true\n"), 0o600))
	c, err := LoadWith(path, Overrides{Listen: "10.0.0.7:8080"})
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.7:8080", c.Listen)
	assert.Equal(t, "http://10.0.0.7:8080", c.Kubernetes.AdvertiseURL)
	assert.Contains(t, c.Kubernetes.ReplicaID, ":8080")
	_, err = LoadWith(path, Overrides{Listen: "8080"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "listen")
	c, err = Load(path)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8082", c.Listen, "no override: the file's")
}

// A replica listening on every address cannot tell the others where it is:
// "http://0.0.0.0:8080" would make each follower proxy /nodes, /usage and
// /jobs to itself. Refused unless advertiseURL says where it is reached.
func TestWildcardListenNeedsAnAdvertiseURL(t *testing.T) {
	salt := "token: 0123456789abcdef0123\nsalt:\n  url: http://127.0.0.1:8000\n  username: u\n  password: p\ninsecure: true\n"
	for _, listen := range []string{"0.0.0.0:8080", "[::]:8080", ":8080"} {
		for section, field := range map[string]string{
			"etcd:\n  endpoints: [http://127.0.0.1:2379]\n": "etcd.advertiseURL",
			"kubernetes:\n  volumeObjects: true\n":          "kubernetes.advertiseURL",
		} {
			_, err := Parse([]byte(salt + "listen: \"" + listen + "\"\n" + section))
			require.Error(t, err, listen+" "+field)
			assert.Contains(t, err.Error(), field+": missing", listen)
			assert.Contains(t, err.Error(), listen, "names the listen address")

			c, err := Parse([]byte(salt + "listen: \"" + listen + "\"\n" + section + "  advertiseURL: https://master-1:8443\n"))
			require.NoError(t, err, listen+" with "+field)
			_ = c
		}
	}
	// One replica (bbolt) needs none.
	_, err := Parse([]byte(salt + "listen: 0.0.0.0:8080\n"))
	require.NoError(t, err)
}

// Beyond loopback the API needs TLS, or insecure: true; the tls section
// names both files, which must exist; replicas with TLS advertise https.
func TestTLSAndInsecure(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(cert, []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(key, []byte("x"), 0o600))
	base := "token: 0123456789abcdef0123\nsalt:\n  url: http://127.0.0.1:8000\n  username: u\n  password: p\n"
	_, err := Parse([]byte(base + "listen: 10.1.2.3:8443\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "listen: 10.1.2.3:8443 is beyond loopback without TLS: set tls.certFile and tls.keyFile, or insecure: true")
	_, err = Parse([]byte(base + "listen: 10.1.2.3:8443\ninsecure: true\n"))
	require.NoError(t, err)
	c, err := Parse([]byte(base + "listen: 10.1.2.3:8443\ntls:\n  certFile: " + cert + "\n  keyFile: " + key + "\nkubernetes:\n  volumeObjects: true\n"))
	require.NoError(t, err)
	assert.Equal(t, "https://10.1.2.3:8443", c.Kubernetes.AdvertiseURL)
	for text, want := range map[string]string{
		"tls: {}\n":                                             "tls: certFile and keyFile: missing",
		"tls:\n  certFile: " + cert + "\n":                      "tls.keyFile: missing while tls.certFile is set",
		"tls:\n  keyFile: " + key + "\n":                        "tls.certFile: missing while tls.keyFile is set",
		"tls:\n  certFile: /nope.crt\n  keyFile: " + key + "\n": "tls.certFile: stat /nope.crt",
		"tls:\n  certFile: " + cert + "\n  keyFile: " + key + "\n  clientCAFile: /nope-ca.crt\n": "tls.clientCAFile: stat /nope-ca.crt",
	} {
		_, err := Parse([]byte(base + text))
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), want, text)
	}
}
