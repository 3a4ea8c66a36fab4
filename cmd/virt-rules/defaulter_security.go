package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"

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
	watcher, err := certwatcher.New(s.certFile, s.keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-cert-file %s, --tls-private-key-file %s: %w", s.certFile, s.keyFile, err)
	}
	go func() {
		if err := watcher.Start(ctx); err != nil {
			logger.ErrorContext(ctx, "watch the serving certificate", "error", err)
		}
	}()
	cfg, err := restConfig(s.kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("the API server that reviews callers: %w", err)
	}
	auth, err := defaults.NewAuth(cfg, s.audiences, logger)
	if err != nil {
		return nil, nil, err
	}
	return []defaults.ServiceOption{defaults.WithAuth(auth)}, &tls.Config{GetCertificate: watcher.GetCertificate, MinVersion: tls.VersionTLS12}, nil
}
