package defaults

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"

	"k8s.io/client-go/transport"
)

// NewHTTPClient is the client the webhook calls the defaulter service at serviceURL with: it
// trusts the CA certificates in caFile ("" for the system's) and sends the service account
// token in tokenFile ("" for none) as a bearer token, re-read as the kubelet rotates it. A
// token is never sent over plain HTTP.
func NewHTTPClient(serviceURL, caFile, tokenFile string) (*http.Client, error) {
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
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read the defaulter's CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("read the defaulter's CA %s: no PEM certificate in it", caFile)
		}
		t.TLSClientConfig.RootCAs = pool
	}
	var rt http.RoundTripper = t
	if tokenFile != "" {
		if _, err := os.Stat(tokenFile); err != nil {
			return nil, fmt.Errorf("the defaulter token: %w", err)
		}
		if rt, err = transport.NewBearerAuthWithRefreshRoundTripper("", tokenFile, t); err != nil {
			return nil, fmt.Errorf("the defaulter token %s: %w", tokenFile, err)
		}
	}
	return &http.Client{Transport: rt}, nil
}

// errRefused is the service refusing the webhook itself (401, 403): a misconfigured token or
// RBAC, which must not read as the object being invalid.
var errRefused = errors.New("the defaulter refused virt-rules' credentials (check --defaulter-token-file, --token-audience and the RBAC of the virt-rules service account)")
