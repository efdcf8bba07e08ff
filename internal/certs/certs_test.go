package certs

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/testcerts"
)

// serial is the serial number of the certificate a TLS server at addr
// presents, as a client trusting ca sees it.
func serial(t *testing.T, addr, ca string, clientCert ...tls.Certificate) (string, error) {
	t.Helper()
	pool, err := Pool(ca)
	require.NoError(t, err)
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, Certificates: clientCert, MinVersion: tls.VersionTLS12})
	if err != nil {
		return "", err
	}
	defer c.Close()
	// TLS 1.3 reports a refused client certificate at the first read.
	_ = c.SetReadDeadline(timeoutSoon())
	if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

func timeoutSoon() time.Time { return time.Now().Add(200 * time.Millisecond) }

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// listen serves TLS with cfg on loopback until the test ends; each
// connection is held open, saying nothing, until the client closes it.
func listen(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// serving makes a CA (its certificate in dir/ca.crt) and a server pair it
// signed (dir/serve.crt, dir/serve.key), and a Reloader of that pair.
func serving(t *testing.T) (string, *testcerts.CA, string, *Reloader) {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcerts.NewCA("test CA")
	require.NoError(t, err)
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, ca.WriteCA(caFile))
	require.NoError(t, ca.Issue(dir, "serve", "serve", true))
	r, err := NewReloader(filepath.Join(dir, "serve.crt"), filepath.Join(dir, "serve.key"), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return dir, ca, caFile, r
}

// A renewed certificate, written over the old files as renewals do (a
// rename), is what the next handshake gets; a half-written pair keeps the
// last good one; no restart.
func TestReloadsRenewedCertificate(t *testing.T) {
	dir, ca, caFile, r := serving(t)
	cfg, err := ServerConfig(r, "")
	require.NoError(t, err)
	addr := listen(t, cfg)

	first, err := serial(t, addr, caFile)
	require.NoError(t, err)
	again, err := serial(t, addr, caFile)
	require.NoError(t, err)
	assert.Equal(t, first, again)

	renewed := t.TempDir()
	require.NoError(t, ca.Issue(renewed, "serve", "serve", true))
	for _, f := range []string{"serve.crt", "serve.key"} {
		require.NoError(t, os.Rename(filepath.Join(renewed, f), filepath.Join(dir, f)))
	}
	second, err := serial(t, addr, caFile)
	require.NoError(t, err)
	assert.NotEqual(t, first, second, "the renewed certificate, without a restart")

	// A key that does not match the certificate: the last good pair stays.
	other := t.TempDir()
	require.NoError(t, ca.Issue(other, "serve", "serve", true))
	require.NoError(t, os.Rename(filepath.Join(other, "serve.crt"), filepath.Join(dir, "serve.crt")))
	kept, err := serial(t, addr, caFile)
	require.NoError(t, err)
	assert.Equal(t, second, kept, "a pair that does not load is not served")
}

func TestNewReloaderRefusesABadPair(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA("test CA")
	require.NoError(t, err)
	require.NoError(t, ca.Issue(dir, "a", "a", true))
	require.NoError(t, ca.Issue(dir, "b", "b", true))
	_, err = NewReloader(filepath.Join(dir, "a.crt"), filepath.Join(dir, "b.key"), slog.New(slog.DiscardHandler))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tls.certFile and tls.keyFile")
	_, err = NewReloader(filepath.Join(dir, "none.crt"), filepath.Join(dir, "b.key"), slog.New(slog.DiscardHandler))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tls.certFile")
}

// TLS 1.2 at the least; with a client CA, a client without a certificate
// it signed is refused.
func TestServerConfig(t *testing.T) {
	dir, ca, caFile, r := serving(t)
	require.NoError(t, ca.Issue(dir, "alice", "alice", false))

	plain, err := ServerConfig(r, "")
	require.NoError(t, err)
	addr := listen(t, plain)
	pool, err := Pool(caFile)
	require.NoError(t, err)
	_, err = tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11})
	require.Error(t, err, "TLS 1.1 accepted")

	mutual, err := ServerConfig(r, caFile)
	require.NoError(t, err)
	addr = listen(t, mutual)
	_, err = serial(t, addr, caFile)
	require.Error(t, err, "a client without a certificate was let in")
	alice, err := tls.LoadX509KeyPair(filepath.Join(dir, "alice.crt"), filepath.Join(dir, "alice.key"))
	require.NoError(t, err)
	_, err = serial(t, addr, caFile, alice)
	require.NoError(t, err)

	stranger, err := testcerts.NewCA("another CA")
	require.NoError(t, err)
	require.NoError(t, stranger.Issue(dir, "mallory", "mallory", false))
	mallory, err := tls.LoadX509KeyPair(filepath.Join(dir, "mallory.crt"), filepath.Join(dir, "mallory.key"))
	require.NoError(t, err)
	_, err = serial(t, addr, caFile, mallory)
	require.Error(t, err, "a certificate of another CA was let in")

	_, err = ServerConfig(r, filepath.Join(dir, "serve.key"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no PEM certificate")
}
