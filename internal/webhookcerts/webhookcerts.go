// Package webhookcerts gives `virt-rules controller` its own serving certificates, as
// Gatekeeper does, with Gatekeeper's library (open-policy-agent/cert-controller): a self-signed
// CA and a serving certificate for a Service's DNS names are created and rotated in one Secret
// (tls.crt, tls.key, ca.crt, ca.key). Every replica runs it (as Gatekeeper does): the
// Secret's resourceVersion decides which replica's certificate is kept.
//
// Two roles. Serve (the admission webhooks): the replica serves the certificate and the CA is
// written into the caBundle of every webhook of the named webhook configurations. The webhook
// server takes its certificate from the Secret as the API server sends it (TLSOption), not
// from a mounted Secret volume, so a replica serves the current certificate as soon as it is
// written, and `--kubeconfig` outside a cluster works the same. Trust (the defaulter service):
// another server serves the certificate from the Secret mounted in its pod, and the replica,
// its client, trusts the CA read from the Secret through the API (Roots), reloaded when it
// changes, the previous CA kept beside a new one so that a server still serving the old
// certificate is trusted until its files are updated.
//
// The served certificate is also written to the certificate directory (and, in Serve, its
// key), which cert-controller checks before it calls itself ready. Ready closes once that is
// done and every existing configuration has the CA.
package webhookcerts

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
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

// Role is what a replica does with the certificate.
type Role int

const (
	// Serve: the replica serves the certificate (TLSOption) and writes the CA into the
	// webhook configurations.
	Serve Role = iota
	// Trust: another server serves it (the defaulter, from the Secret mounted in its pod); the
	// replica trusts the CA (Roots).
	Trust
)

// Configuration names one webhook configuration whose webhooks get the CA.
type Configuration struct {
	Kind Kind
	Name string
}

// Options say where the certificate lives and who trusts it.
type Options struct {
	// Name is what the certificate is for ("webhook", "defaulter"): it names the CA
	// (virt-rules-NAME-ca), the rotator (NAME-cert-rotator) and the logs.
	Name string
	// Role says whether this replica serves the certificate or trusts it.
	Role Role
	// Secret holds the CA and the serving certificate; it must exist (the install kit ships it
	// empty) and is filled in.
	Secret types.NamespacedName
	// Service is the Service the certificate is for: <name>.<namespace>.svc (and
	// .svc.cluster.local, and <name>.<namespace>), the name its clients check.
	Service types.NamespacedName
	// CertDir receives tls.crt, and in Serve tls.key (a writable directory).
	CertDir string
	// Configurations (Serve only) get the CA in every webhook's clientConfig.caBundle. A
	// configuration not installed (the defaults webhook without the defaulter) is skipped.
	Configurations []Configuration
	// CAValidity and ServerValidity: how long each certificate is valid; Lookahead: how long
	// before expiry it is renewed; CheckInterval: how often that is checked. Zero: 10 years,
	// 1 year, 90 days, 12 hours (cert-controller's defaults).
	CAValidity, ServerValidity, Lookahead, CheckInterval time.Duration
}

// Certs serves or trusts the certificate of its Secret.
type Certs struct {
	opts  Options
	cert  atomic.Pointer[tls.Certificate]
	roots atomic.Pointer[x509.CertPool]
	ready chan struct{}
	// mu guards cas: the PEM of the CAs trusted, the Secret's last and the one before it.
	mu  sync.Mutex
	cas [][]byte
}

// New checks o. In Serve, give the webhook server TLSOption; in Trust, give the client
// Roots. Then AddTo the manager, and report Ready in /readyz.
func New(o Options) (*Certs, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.CertDir, 0o700); err != nil {
		return nil, fmt.Errorf("%s certificate: create the certificate directory: %w", o.Name, err)
	}
	return &Certs{opts: o, ready: make(chan struct{})}, nil
}

// AddTo adds the rotator and the Secret watch to mgr.
func (c *Certs) AddTo(mgr manager.Manager) error {
	o := c.opts
	dns := o.DNSNames()
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
		CAName:                 "virt-rules-" + o.Name + "-ca",
		CAOrganization:         "virt-rules",
		DNSName:                dns[0],
		ExtraDNSNames:          dns[1:],
		IsReady:                c.ready,
		Webhooks:               webhooks,
		FieldOwner:             FieldOwner,
		RequireLeaderElection:  false,
		EnableReadinessCheck:   true,
		CaCertDuration:         o.CAValidity,
		ServerCertDuration:     o.ServerValidity,
		LookaheadInterval:      o.Lookahead,
		RotationCheckFrequency: o.CheckInterval,
		ControllerName:         o.Name + "-cert-rotator",
	})
	if err != nil {
		return fmt.Errorf("%s certificate: add rotator: %w", o.Name, err)
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
		return fmt.Errorf("%s certificate: watch Secret %s: %w", o.Name, o.Secret, err)
	}
	if err := mgr.Add(&secretWatch{Cache: secrets, certs: c}); err != nil {
		return fmt.Errorf("%s certificate: %w", o.Name, err)
	}
	return nil
}

func (o Options) validate() error {
	if o.Name == "" {
		return errors.New("serving certificate: no name (webhook, defaulter)")
	}
	switch {
	case o.Role != Serve && o.Role != Trust:
		return fmt.Errorf("%s certificate: role %d: want Serve or Trust", o.Name, o.Role)
	case o.Secret.Namespace == "" || o.Secret.Name == "":
		return fmt.Errorf("%s certificate: Secret %q: want namespace/name", o.Name, o.Secret)
	case o.Service.Namespace == "" || o.Service.Name == "":
		return fmt.Errorf("%s certificate: Service %q: want namespace/name", o.Name, o.Service)
	case o.CertDir == "":
		return fmt.Errorf("%s certificate: no certificate directory", o.Name)
	case o.Role == Trust && len(o.Configurations) > 0:
		return fmt.Errorf("%s certificate: a trusted certificate's CA goes into no webhook configuration", o.Name)
	}
	for _, w := range o.Configurations {
		if (w.Kind != Validating && w.Kind != Mutating) || w.Name == "" {
			return fmt.Errorf("%s certificate: configuration %q/%q: want validating/NAME or mutating/NAME", o.Name, w.Kind, w.Name)
		}
	}
	return nil
}

// DNSNames are the names the certificate is for, the first its subject's.
func (o Options) DNSNames() []string {
	svc := o.Service.Name + "." + o.Service.Namespace + ".svc"
	return []string{svc, svc + ".cluster.local", o.Service.Name + "." + o.Service.Namespace}
}

// TLSOption makes a TLS server present the current certificate of the Secret; before the
// first one is issued, handshakes fail.
func (c *Certs) TLSOption(cfg *tls.Config) {
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		if cert := c.cert.Load(); cert != nil {
			return cert, nil
		}
		return nil, fmt.Errorf("%s serving certificate not issued yet in Secret %s", c.opts.Name, c.opts.Secret)
	}
}

// Roots are the CAs to check the server's certificate against (Trust): the Secret's, and the
// one it had before, if any; a new pool each time they change. Before the Secret has one, an
// error.
func (c *Certs) Roots() (*x509.CertPool, error) {
	if pool := c.roots.Load(); pool != nil {
		return pool, nil
	}
	return nil, fmt.Errorf("the %s CA is not issued yet in Secret %s", c.opts.Name, c.opts.Secret)
}

// Ready reports whether the certificate is issued and, in Serve, served with the CA in the
// configurations, in Trust, its CA trusted.
func (c *Certs) Ready() error {
	select {
	case <-c.ready:
		return nil
	default:
		if c.opts.Role == Trust {
			return fmt.Errorf("%s certificate of Secret %s not issued and trusted yet", c.opts.Name, c.opts.Secret)
		}
		return fmt.Errorf("%s certificate of Secret %s not issued, served and in the webhook configurations yet", c.opts.Name, c.opts.Secret)
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
		return fmt.Errorf("%s certificate: informer of Secret %s: %w", w.certs.opts.Name, w.certs.opts.Secret, err)
	}
	logger := log.FromContext(ctx).WithName(w.certs.opts.Name + "-certs")
	update := func(obj any) {
		s, ok := obj.(*corev1.Secret)
		if !ok || s.Name != w.certs.opts.Secret.Name {
			return
		}
		if err := w.certs.load(s); err != nil {
			logger.Info("certificate Secret not usable yet", "secret", w.certs.opts.Secret.String(), "reason", err.Error())
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, obj any) { update(obj) },
	}); err != nil {
		return fmt.Errorf("%s certificate: watch Secret %s: %w", w.certs.opts.Name, w.certs.opts.Secret, err)
	}
	return w.Cache.Start(ctx)
}

// load serves (Serve) or trusts (Trust) the Secret's certificate and writes it to CertDir.
func (c *Certs) load(s *corev1.Secret) error {
	certPEM, keyPEM := s.Data[CertKey], s.Data[KeyKey]
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return fmt.Errorf("no %s and %s", CertKey, KeyKey)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("parse %s and %s: %w", CertKey, KeyKey, err)
	}
	if c.opts.Role == Trust {
		return c.trust(s.Data[CACertKey], certPEM)
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

// trust adds caPEM to the CAs trusted, keeping the one before it, and writes the server's
// certificate (never its key) to CertDir.
func (c *Certs) trust(caPEM, certPEM []byte) error {
	if len(caPEM) == 0 {
		return fmt.Errorf("no %s", CACertKey)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cas) == 0 || !bytes.Equal(c.cas[len(c.cas)-1], caPEM) {
		cas := append(slices.Clone(c.cas), caPEM)
		if len(cas) > 2 {
			cas = cas[len(cas)-2:]
		}
		pool := x509.NewCertPool()
		for _, ca := range cas {
			if !pool.AppendCertsFromPEM(ca) {
				return fmt.Errorf("parse %s: no PEM certificate", CACertKey)
			}
		}
		c.cas = cas
		c.roots.Store(pool)
	}
	return writeIfChanged(filepath.Join(c.opts.CertDir, CertKey), certPEM)
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
