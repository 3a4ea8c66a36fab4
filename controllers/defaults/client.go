package defaults

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sync"

	"k8s.io/client-go/transport"
)

// Roots returns the CAs the defaulter's serving certificate is checked against: the same pool
// until they change (nil: the system's). An error fails the call.
type Roots func() (*x509.CertPool, error)

// FileRoots are the CA certificates in caFile, read once.
func FileRoots(caFile string) (Roots, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read the defaulter's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("read the defaulter's CA %s: no PEM certificate in it", caFile)
	}
	return func() (*x509.CertPool, error) { return pool, nil }, nil
}

// NewHTTPClient is the client the webhook calls the defaulter service at serviceURL with: it
// trusts the CAs roots gives (nil: the system's), a connection made after they change trusting
// the new ones, and sends the service account token in tokenFile ("" for none) as a bearer
// token, re-read as the kubelet rotates it. A token is never sent over plain HTTP.
func NewHTTPClient(serviceURL string, roots Roots, tokenFile string) (*http.Client, error) {
	u, err := url.Parse(serviceURL)
	if err != nil {
		return nil, fmt.Errorf("defaulter URL %q: %w", serviceURL, err)
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return nil, fmt.Errorf("defaulter URL %q: want an http or https URL", serviceURL)
	}
	if u.Scheme == "http" && tokenFile != "" {
		return nil, fmt.Errorf("defaulter URL %q: a token is sent only over https", serviceURL)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	var rt http.RoundTripper = t
	if roots != nil {
		rt = &rootsTransport{roots: roots, base: t}
	}
	if tokenFile != "" {
		if _, err := os.Stat(tokenFile); err != nil {
			return nil, fmt.Errorf("the defaulter token: %w", err)
		}
		if rt, err = transport.NewBearerAuthWithRefreshRoundTripper("", tokenFile, rt); err != nil {
			return nil, fmt.Errorf("the defaulter token %s: %w", tokenFile, err)
		}
	}
	return &http.Client{Transport: rt}, nil
}

// rootsTransport is base trusting the current roots: a transport of its own per pool, the
// previous one's idle connections closed when the pool changes. (tls.Config's RootCAs is
// fixed once a transport dials; the other way, VerifyConnection with InsecureSkipVerify,
// would leave verification to hand-written code.)
type rootsTransport struct {
	roots Roots
	base  *http.Transport

	mu   sync.Mutex
	pool *x509.CertPool
	t    *http.Transport
}

func (r *rootsTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	pool, err := r.roots()
	if err != nil {
		return nil, fmt.Errorf("the defaulter's CA: %w", err)
	}
	r.mu.Lock()
	if r.t == nil || pool != r.pool {
		old := r.t
		r.t = r.base.Clone()
		r.t.TLSClientConfig.RootCAs = pool
		r.pool = pool
		if old != nil {
			old.CloseIdleConnections()
		}
	}
	t := r.t
	r.mu.Unlock()
	return t.RoundTrip(req)
}

// errRefused is the service refusing the webhook itself (401, 403): a misconfigured token or
// RBAC, which must not read as the object being invalid.
var errRefused = errors.New("the defaulter refused virt-rules' credentials (check --defaulter-token-file, --token-audience and the RBAC of the virt-rules service account)")
