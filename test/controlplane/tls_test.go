package controlplane

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/certs"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
	"github.com/salt-volumes/salt-volumes/test/testcerts"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// TestServeOverTLS: serve speaks HTTPS itself (tls.certFile, tls.keyFile):
// the CLI creates and deletes a volume through it trusting the CA given by
// SALT_VOLUMES_CA and refuses the server without it; plain HTTP gets no
// answer but a refusal; a renewed certificate is served without a
// restart; with tls.clientCAFile a client without a certificate of that CA
// is refused even with the token; and a config that listens beyond
// loopback without TLS does not start.
func TestServeOverTLS(t *testing.T) {
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)

	dir := t.TempDir()
	ca, err := testcerts.NewCA("salt-volumes test CA")
	require.NoError(t, err)
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, ca.WriteCA(caFile))
	require.NoError(t, ca.Issue(dir, "serve", "serve", true))
	require.NoError(t, ca.Issue(dir, "alice", "alice", false))
	tlsSection := "tls:\n  certFile: " + filepath.Join(dir, "serve.crt") + "\n  keyFile: " + filepath.Join(dir, "serve.key") + "\n"

	p := newPlane(t, s)
	p.URL = strings.Replace(p.URL, "http://", "https://", 1)
	p.CAFile = caFile
	p.Start(tlsSection)
	assert.Contains(t, p.LogText(), `"tls":true`)

	_, errs, code := p.CLI("create", "over-tls", "--node", s.MinionID, "--size", "16Mi", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
	v := getJSON(t, p, "over-tls")
	uuids = append(uuids, v.Spec.UUID)
	assert.Equal(t, "Available", v.Status.Phase.String())

	// Without the CA the CLI does not trust the server, and says so.
	cmd := exec.Command(bin("salt-volumes"), "ls")
	cmd.Env = append(os.Environ(), "SALT_VOLUMES_URL="+p.URL, "SALT_VOLUMES_TOKEN="+p.Token)
	_, errs, code = testenv.Run(t, cmd)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errs, "certificate signed by unknown authority")

	// Plain HTTP to the same port: Go's TLS server answers 400 and nothing
	// of the API.
	status, body, err := fetchPlain(strings.Replace(p.URL, "https://", "http://", 1) + "/api/v1/volumes")
	require.NoError(t, err)
	assert.Equal(t, 400, status)
	assert.Contains(t, body, "HTTP request to an HTTPS server")
	assert.NotContains(t, body, "over-tls")

	// A renewal writes new files over the old ones: the next connection
	// gets the new certificate from the same process.
	first := peerSerial(t, p, caFile)
	renewed := t.TempDir()
	require.NoError(t, ca.Issue(renewed, "serve", "serve", true))
	for _, f := range []string{"serve.crt", "serve.key"} {
		require.NoError(t, os.Rename(filepath.Join(renewed, f), filepath.Join(dir, f)))
	}
	assert.NotEqual(t, first, peerSerial(t, p, caFile), "the renewed certificate, without a restart")
	assert.Contains(t, p.LogText(), "TLS certificate reloaded")
	_, errs, code = p.CLI("ls")
	require.Equal(t, 0, code, errs)

	// Client certificates: the token alone is no longer enough.
	p.Stop()
	p.CertFile, p.KeyFile = filepath.Join(dir, "alice.crt"), filepath.Join(dir, "alice.key")
	p.Start(tlsSection + "  clientCAFile: " + caFile + "\n")
	cmd = exec.Command(bin("salt-volumes"), "ls")
	cmd.Env = append(os.Environ(), "SALT_VOLUMES_URL="+p.URL, "SALT_VOLUMES_TOKEN="+p.Token, "SALT_VOLUMES_CA="+caFile)
	_, errs, code = testenv.Run(t, cmd)
	assert.NotEqual(t, 0, code, "a client without a certificate got in")
	assert.Contains(t, errs, "certificate required")
	_, errs, code = p.CLI("rm", "over-tls", "--wait", "--timeout", "2m")
	require.Equal(t, 0, code, errs)
	p.Stop()

	// Beyond loopback without TLS: refused at start, nothing listens.
	cfg := filepath.Join(dir, "open.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("listen: 0.0.0.0:8099\ntoken: 0123456789abcdef0123\nsalt:\n  url: http://127.0.0.1:8000\n  username: u\n  password: p\n"), 0o600))
	serve := exec.Command(bin("salt-volumes"), "serve", "--config", cfg)
	done := make(chan struct{})
	var got []byte
	go func() { got, _ = serve.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = serve.Process.Kill()
		t.Fatal("serve started on 0.0.0.0 without TLS")
	}
	assert.NotEqual(t, 0, serve.ProcessState.ExitCode())
	assert.Contains(t, string(got), "listen: 0.0.0.0:8099 is beyond loopback without TLS")
}

// peerSerial is the serial number of the certificate serve presents now.
func peerSerial(t *testing.T, p *serveproc.Plane, caFile string) string {
	t.Helper()
	pool, err := certs.Pool(caFile)
	require.NoError(t, err)
	c, err := tls.Dial("tcp", strings.TrimPrefix(p.URL, "https://"), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// fetchPlain GETs url over plain HTTP: the status and the body.
func fetchPlain(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
