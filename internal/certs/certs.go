// Package certs gives serve its TLS: a certificate and key read from
// files and read again when either file changes, so that a renewal (cert-
// manager, an ACME client, a Salt state) takes effect at the next
// handshake without a restart.
package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// Reloader serves the key pair in two files.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu    sync.Mutex
	cert  *tls.Certificate
	stamp [2]stamp
}

// stamp tells whether a file changed: a rename over it (how renewals
// write) changes the inode, an edit in place the size or time.
type stamp struct {
	ino   uint64
	size  int64
	mtime time.Time
}

func stampOf(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	s := stamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s, nil
}

// NewReloader loads the pair once: a pair that does not load is an error
// at start, not at the first client.
func NewReloader(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: log}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Reloader) load() error {
	cs, err := stampOf(r.certFile)
	if err != nil {
		return fmt.Errorf("tls.certFile: %w", err)
	}
	ks, err := stampOf(r.keyFile)
	if err != nil {
		return fmt.Errorf("tls.keyFile: %w", err)
	}
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("tls.certFile and tls.keyFile %s, %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert, r.stamp = &pair, [2]stamp{cs, ks}
	return nil
}

// GetCertificate is tls.Config's: the pair, read again when a file
// changed. A pair that no longer loads (a renewal caught between writing
// the certificate and the key) keeps the last good one and is tried again
// at the next handshake.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, err1 := stampOf(r.certFile)
	ks, err2 := stampOf(r.keyFile)
	if err := errors.Join(err1, err2); err != nil || (cs == r.stamp[0] && ks == r.stamp[1]) {
		if err != nil {
			r.log.Warn("TLS certificate files unreadable: serving the last good pair", "error", err)
		}
		return r.cert, nil
	}
	// load replaces the pair only when the new one loads.
	if err := r.load(); err != nil {
		r.log.Warn("TLS certificate files changed but do not load: serving the last good pair", "error", err)
		return r.cert, nil
	}
	r.log.Info("TLS certificate reloaded", "certFile", r.certFile, "notAfter", notAfter(r.cert))
	return r.cert, nil
}

func notAfter(c *tls.Certificate) time.Time {
	if c.Leaf != nil {
		return c.Leaf.NotAfter
	}
	if len(c.Certificate) == 0 {
		return time.Time{}
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return time.Time{}
	}
	return leaf.NotAfter
}

// ServerConfig is serve's TLS: TLS 1.2 and later, the reloading pair,
// and, with a client CA file, a certificate from every client.
func ServerConfig(r *Reloader, clientCAFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
	if clientCAFile != "" {
		pool, err := Pool(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.clientCAFile: %w", err)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// Pool reads a PEM file of CA certificates.
func Pool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}
