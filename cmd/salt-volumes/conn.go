package main

import (
	"net/url"
	"os"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/client"
)

// headerTimeout is how long a request but a watch waits for its answer
// to begin (a variable for the tests).
var headerTimeout = client.DefaultHeaderTimeout

// conn is where the API is and how to prove who we are: the root's
// persistent flags, filled from the environment by applyEnv.
type conn struct {
	url, token, tokenFile     string
	caFile, certFile, keyFile string
}

// client opens the API client the flags and environment describe; with
// no token, the saved login, for the server it was made with only.
func (c *cli) client() (*client.Client, error) {
	k := c.conn
	// Where the token comes from, for a message about it.
	from := "--token (or SALT_VOLUMES_TOKEN)"
	if k.token == "" && k.tokenFile != "" {
		b, err := os.ReadFile(k.tokenFile)
		if err != nil {
			return nil, failf(exitUsage, "--token-file: %v", err)
		}
		k.token = strings.TrimSpace(string(b))
		if k.token == "" {
			return nil, failf(exitUsage, "--token-file %s: the file is empty", k.tokenFile)
		}
		from = "--token-file (or SALT_VOLUMES_TOKEN_FILE) " + k.tokenFile
	}
	if s := loadSession(); k.token == "" && s != nil && (k.url == "" || sameURL(k.url, s.URL)) {
		k.url, k.token = s.URL, s.Token
		if k.caFile == "" && k.certFile == "" {
			// The TLS files login was given, unless others are now.
			k.caFile, k.certFile, k.keyFile = s.CAFile, s.CertFile, s.KeyFile
		}
		p, _ := sessionPath()
		from = "the session of salt-volumes login (" + p + "; log in again)"
	}
	switch {
	case k.url == "":
		return nil, failf(exitUsage, "no server: set SALT_VOLUMES_URL (e.g. http://127.0.0.1:8080) or pass --url")
	case k.token == "":
		return nil, failf(exitUsage, "no token: salt-volumes login, or set SALT_VOLUMES_TOKEN or SALT_VOLUMES_TOKEN_FILE, or pass --token-file")
	}
	if err := client.CheckToken(k.token); err != nil {
		return nil, failf(exitUsage, "the token of %s: %v: not sent (a token is one line of printable characters)", from, err)
	}
	return c.httpClient(k.url, k.token, k)
}

// checkURL refuses an address that is not an http or https URL with a
// host before anything is sent (a scheme missing, ftp://...).
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return failf(exitUsage, "--url (or SALT_VOLUMES_URL) %q: %v: write http://HOST:PORT or https://HOST:PORT", client.Redact(raw), err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return failf(exitUsage, "--url (or SALT_VOLUMES_URL) %q: not an http or https address: write http://HOST:PORT or https://HOST:PORT", client.Redact(raw))
	}
	return nil
}

// httpClient is the client of url with token, over the TLS files of k.
func (c *cli) httpClient(url, token string, k conn) (*client.Client, error) {
	if err := checkURL(url); err != nil {
		return nil, err
	}
	if (k.certFile == "") != (k.keyFile == "") {
		return nil, failf(exitUsage, "--cert-file and --key-file (SALT_VOLUMES_CERT, SALT_VOLUMES_KEY): give both or neither")
	}
	cl := &client.Client{URL: url, Token: token, HeaderTimeout: headerTimeout}
	if k.caFile != "" || k.certFile != "" {
		hc, err := client.HTTPS(k.caFile, k.certFile, k.keyFile)
		if err != nil {
			return nil, failf(exitUsage, "%v", err)
		}
		cl.HTTP = hc
	}
	return cl, nil
}

// sameURL: two ways of writing one server's address.
func sameURL(a, b string) bool {
	return strings.TrimRight(a, "/") == strings.TrimRight(b, "/")
}
