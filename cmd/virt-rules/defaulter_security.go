package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/virt-rules/virt-rules/defaults"
)

// defaulterSecurity are the flags that say how `virt-rules defaulter` is reached: HTTPS and a
// caller the API server vouches for, or, with --insecure-http, plain HTTP to anyone.
type defaulterSecurity struct {
	certFile, keyFile string
	kubeconfig        string
	audiences         []string
	insecureHTTP      bool
}

func (s *defaulterSecurity) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&s.certFile, "tls-cert-file", "", "`FILE` with the serving certificate (PEM; reloaded when it changes)")
	f.StringVar(&s.keyFile, "tls-private-key-file", "", "`FILE` with the serving certificate's private key (PEM; reloaded when it changes)")
	f.StringVar(&s.kubeconfig, "kubeconfig", "", "kubeconfig `FILE` of the API server that reviews callers' tokens (default: in-cluster, or $KUBECONFIG)")
	f.StringSliceVar(&s.audiences, "token-audience", []string{defaults.DefaultAudience}, "`AUDIENCE`s a caller's service account token must be for (comma-separated)")
	f.BoolVar(&s.insecureHTTP, "insecure-http", false, "serve plain HTTP and answer any caller: for local use only (tests, a laptop), never in a cluster")
}

// setUp returns the service's options and the TLS configuration to serve with (nil: plain
// HTTP). The certificate watcher runs until ctx ends.
func (s *defaulterSecurity) setUp(ctx context.Context, logger *slog.Logger) ([]defaults.ServiceOption, *tls.Config, error) {
	if s.insecureHTTP {
		if s.certFile != "" || s.keyFile != "" {
			return nil, nil, errors.New("--insecure-http: leave out --tls-cert-file and --tls-private-key-file, or drop --insecure-http")
		}
		logger.WarnContext(ctx, "--insecure-http: serving plain HTTP to any caller; any client that reaches the port drives libvirt. Local use only.")
		return nil, nil, nil
	}
	if s.certFile == "" || s.keyFile == "" {
		return nil, nil, errors.New("--tls-cert-file and --tls-private-key-file are required (or --insecure-http, for local use only)")
	}
	if len(s.audiences) == 0 {
		return nil, nil, errors.New("--token-audience: name at least one audience")
	}
	cert, err := newServingCertificate(ctx, s.certFile, s.keyFile, logger)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := restConfig(s.kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("the API server that reviews callers: %w", err)
	}
	auth, err := defaults.NewAuth(cfg, s.audiences, logger)
	if err != nil {
		return nil, nil, err
	}
	return []defaults.ServiceOption{defaults.WithAuth(auth), defaults.WithReadyCheck(cert.ready)},
		&tls.Config{GetCertificate: cert.getCertificate, MinVersion: tls.VersionTLS12}, nil
}

// servingCertificate is the defaulter's certificate from its files, reloaded as they change.
// Until they hold a certificate and its key (a Secret volume, marked optional, that the
// kubelet fills in once virt-rules' controller has issued the certificate) the defaulter
// serves a throwaway self-signed certificate, which no client that checks trusts: the
// kubelet's probes get through (/healthz answers, /readyz says what is awaited), so the pod
// waits instead of being restarted.
type servingCertificate struct {
	certFile, keyFile string
	placeholder       *tls.Certificate
	watcher           atomic.Pointer[certwatcher.CertWatcher]
}

// certificateWait is how often the files are checked while they are awaited.
const certificateWait = time.Second

func newServingCertificate(ctx context.Context, certFile, keyFile string, logger *slog.Logger) (*servingCertificate, error) {
	c := &servingCertificate{certFile: certFile, keyFile: keyFile}
	_, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err == nil {
		return c, c.watch(ctx, logger)
	}
	logger.WarnContext(ctx, "no serving certificate yet: serving a placeholder, not ready, until the files hold one", "certFile", certFile, "keyFile", keyFile, "reason", err.Error())
	placeholder, err := selfSignedPlaceholder()
	if err != nil {
		return nil, fmt.Errorf("placeholder certificate: %w", err)
	}
	c.placeholder = placeholder
	go func() {
		t := time.NewTicker(certificateWait)
		defer t.Stop()
		for waited := time.Duration(0); ; waited += certificateWait {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err == nil {
				if err := c.watch(ctx, logger); err != nil {
					logger.ErrorContext(ctx, "watch the serving certificate", "error", err)
					continue
				}
				logger.InfoContext(ctx, "serving certificate found: serving it", "certFile", certFile, "waited", waited.String())
				return
			}
			if waited > 0 && waited%time.Minute == 0 {
				logger.WarnContext(ctx, "still no serving certificate", "certFile", certFile, "keyFile", keyFile, "waited", waited.String(), "reason", err.Error())
			}
		}
	}()
	return c, nil
}

// watch serves the files' certificate from now on, reloaded as they change, until ctx ends.
func (c *servingCertificate) watch(ctx context.Context, logger *slog.Logger) error {
	w, err := certwatcher.New(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert-file %s, --tls-private-key-file %s: %w", c.certFile, c.keyFile, err)
	}
	go func() {
		if err := w.Start(ctx); err != nil {
			logger.ErrorContext(ctx, "watch the serving certificate", "error", err)
		}
	}()
	c.watcher.Store(w)
	return nil
}

func (c *servingCertificate) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if w := c.watcher.Load(); w != nil {
		return w.GetCertificate(hello)
	}
	return c.placeholder, nil
}

func (c *servingCertificate) ready() error {
	if c.watcher.Load() == nil {
		return fmt.Errorf("no serving certificate yet in --tls-cert-file %s and --tls-private-key-file %s (is its Secret filled in?)", c.certFile, c.keyFile)
	}
	return nil
}

// selfSignedPlaceholder is a certificate for no name, valid for a day, of a key never kept.
func selfSignedPlaceholder() (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "virt-rules-defaulter placeholder: no serving certificate yet"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
