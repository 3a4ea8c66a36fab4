// Package webhookcerts gives `virt-rules controller` its own admission webhook serving
// certificate, as Gatekeeper does, with Gatekeeper's library (open-policy-agent/cert-controller):
// a self-signed CA and a serving certificate for the webhook Service's DNS names are created
// and rotated in one Secret (tls.crt, tls.key, ca.crt, ca.key), and the CA is written into the
// caBundle of every webhook of the named webhook configurations. Every replica runs it (as
// Gatekeeper does): the Secret's resourceVersion decides which replica's certificate is kept.
//
// The webhook server takes its certificate from the Secret as the API server sends it
// (TLSOption), not from a mounted Secret volume, so a replica serves the current certificate
// as soon as it is written, and `--kubeconfig` outside a cluster works the same. The files are
// also written to the certificate directory, which cert-controller checks before it calls
// itself ready. Ready closes once the certificate is served and every existing configuration
// has the CA.
package webhookcerts

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Secret keys cert-controller writes.
const (
	CertKey   = "tls.crt"
	KeyKey    = "tls.key"
	CACertKey = "ca.crt"
)

// FieldOwner is the field manager of the caBundles written.
const FieldOwner = "virt-rules-webhook-certs"

// Kind is a webhook configuration's kind.
type Kind string

// The webhook configuration kinds.
const (
	Validating Kind = "validating"
	Mutating   Kind = "mutating"
)

// Configuration names one webhook configuration whose webhooks get the CA.
type Configuration struct {
	Kind Kind
	Name string
}

// Options say where the certificate lives and who trusts it.
type Options struct {
	// Secret holds the CA and the serving certificate; it must exist (the install kit ships it
	// empty) and is filled in.
	Secret types.NamespacedName
	// Service is the webhook Service: the certificate is for <name>.<namespace>.svc (and
	// .svc.cluster.local), the name the API server checks.
	Service types.NamespacedName
	// CertDir receives tls.crt and tls.key (a writable directory).
	CertDir string
	// Configurations get the CA in every webhook's clientConfig.caBundle. A configuration not
	// installed (the defaults webhook without the defaulter) is skipped.
	Configurations []Configuration
	// CAValidity and ServerValidity: how long each certificate is valid; Lookahead: how long
	// before expiry it is renewed; CheckInterval: how often that is checked. Zero: 10 years,
	// 1 year, 90 days, 12 hours (cert-controller's defaults).
	CAValidity, ServerValidity, Lookahead, CheckInterval time.Duration
}

// Certs serves the webhook certificate from its Secret.
type Certs struct {
	opts  Options
	cert  atomic.Pointer[tls.Certificate]
	ready chan struct{}
}

// New checks o. Give the webhook server TLSOption, then AddTo the manager, and report Ready
// in /readyz.
func New(o Options) (*Certs, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.CertDir, 0o700); err != nil {
		return nil, fmt.Errorf("webhook certificates: create the certificate directory: %w", err)
	}
	return &Certs{opts: o, ready: make(chan struct{})}, nil
}

// AddTo adds the rotator and the Secret watch to mgr.
func (c *Certs) AddTo(mgr manager.Manager) error {
	o := c.opts
	dns := o.Service.Name + "." + o.Service.Namespace + ".svc"
	webhooks := make([]rotator.WebhookInfo, 0, len(o.Configurations))
	for _, w := range o.Configurations {
		t := rotator.Validating
		if w.Kind == Mutating {
			t = rotator.Mutating
		}
		webhooks = append(webhooks, rotator.WebhookInfo{Name: w.Name, Type: t})
	}
	err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:              o.Secret,
		CertDir:                o.CertDir,
		CAName:                 "virt-rules-webhook-ca",
		CAOrganization:         "virt-rules",
		DNSName:                dns,
		ExtraDNSNames:          []string{dns + ".cluster.local", o.Service.Name + "." + o.Service.Namespace},
		IsReady:                c.ready,
		Webhooks:               webhooks,
		FieldOwner:             FieldOwner,
		RequireLeaderElection:  false,
		EnableReadinessCheck:   true,
		CaCertDuration:         o.CAValidity,
		ServerCertDuration:     o.ServerValidity,
		LookaheadInterval:      o.Lookahead,
		RotationCheckFrequency: o.CheckInterval,
		ControllerName:         "webhook-cert-rotator",
	})
	if err != nil {
		return fmt.Errorf("webhook certificates: add rotator: %w", err)
	}
	secrets, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(),
		Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {
			Namespaces: map[string]cache.Config{o.Secret.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", o.Secret.Name),
		}},
	})
	if err != nil {
		return fmt.Errorf("webhook certificates: watch Secret %s: %w", o.Secret, err)
	}
	if err := mgr.Add(&secretWatch{Cache: secrets, certs: c}); err != nil {
		return fmt.Errorf("webhook certificates: %w", err)
	}
	return nil
}

func (o Options) validate() error {
	switch {
	case o.Secret.Namespace == "" || o.Secret.Name == "":
		return fmt.Errorf("webhook certificates: Secret %q: want namespace/name", o.Secret)
	case o.Service.Namespace == "" || o.Service.Name == "":
		return fmt.Errorf("webhook certificates: Service %q: want namespace/name", o.Service)
	case o.CertDir == "":
		return errors.New("webhook certificates: no certificate directory (--webhook-cert-dir)")
	}
	for _, w := range o.Configurations {
		if (w.Kind != Validating && w.Kind != Mutating) || w.Name == "" {
			return fmt.Errorf("webhook certificates: configuration %q/%q: want validating/NAME or mutating/NAME", w.Kind, w.Name)
		}
	}
	return nil
}

// TLSOption makes a TLS server present the current certificate of the Secret; before the
// first one is issued, handshakes fail.
func (c *Certs) TLSOption(cfg *tls.Config) {
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		if cert := c.cert.Load(); cert != nil {
			return cert, nil
		}
		return nil, fmt.Errorf("webhook serving certificate not issued yet in Secret %s", c.opts.Secret)
	}
}

// Ready reports whether the certificate is served and the CA is in the configurations.
func (c *Certs) Ready() error {
	select {
	case <-c.ready:
		return nil
	default:
		return fmt.Errorf("webhook certificate of Secret %s not issued, served and in the webhook configurations yet", c.opts.Secret)
	}
}

// secretWatch is the Secret's cache, with a handler serving what it holds. Every replica runs
// it.
type secretWatch struct {
	cache.Cache
	certs *Certs
}

func (w *secretWatch) NeedLeaderElection() bool { return false }

func (w *secretWatch) Start(ctx context.Context) error {
	inf, err := w.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return fmt.Errorf("webhook certificates: informer of Secret %s: %w", w.certs.opts.Secret, err)
	}
	logger := log.FromContext(ctx).WithName("webhook-certs")
	update := func(obj any) {
		s, ok := obj.(*corev1.Secret)
		if !ok || s.Name != w.certs.opts.Secret.Name {
			return
		}
		if err := w.certs.load(s); err != nil {
			logger.Info("webhook certificate Secret not usable yet", "secret", w.certs.opts.Secret.String(), "reason", err.Error())
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, obj any) { update(obj) },
	}); err != nil {
		return fmt.Errorf("webhook certificates: watch Secret %s: %w", w.certs.opts.Secret, err)
	}
	return w.Cache.Start(ctx)
}

// load serves the Secret's certificate and writes it to CertDir.
func (c *Certs) load(s *corev1.Secret) error {
	certPEM, keyPEM := s.Data[CertKey], s.Data[KeyKey]
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return fmt.Errorf("no %s and %s", CertKey, KeyKey)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("parse %s and %s: %w", CertKey, KeyKey, err)
	}
	if err := writeIfChanged(filepath.Join(c.opts.CertDir, KeyKey), keyPEM); err != nil {
		return err
	}
	if err := writeIfChanged(filepath.Join(c.opts.CertDir, CertKey), certPEM); err != nil {
		return err
	}
	c.cert.Store(&cert)
	return nil
}

// writeIfChanged replaces path with data atomically (a rename), unless it already holds it.
func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
