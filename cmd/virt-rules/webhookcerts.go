package main

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virt-rules/virt-rules/internal/webhookcerts"
)

// defaultWebhookConfigurations are the webhook configurations of examples/deploy/webhooks and
// examples/deploy/defaults.
var defaultWebhookConfigurations = []string{"validating/virt-rules-validating", "mutating/virt-rules-mutating", "mutating/zz-virt-rules-defaults"}

// certFlags are the flags of one self-managed serving certificate, --NAME-cert-secret and the
// rest.
type certFlags struct {
	name           string
	secret         string
	service        string
	serverValidity time.Duration
	lookahead      time.Duration
	checkInterval  time.Duration
}

func (c *certFlags) register(cmd *cobra.Command, name, secretUsage, service string) {
	c.name = name
	f := cmd.Flags()
	f.StringVar(&c.secret, name+"-cert-secret", "", secretUsage)
	f.StringVar(&c.service, name+"-service", service, "`NAMESPACE/NAME` of the "+name+" Service the self-managed certificate is for")
	f.DurationVar(&c.serverValidity, name+"-cert-validity", 365*24*time.Hour, "how long a self-managed "+name+" serving certificate is valid")
	f.DurationVar(&c.lookahead, name+"-cert-renew-before", 90*24*time.Hour, "how long before expiry a self-managed "+name+" certificate is renewed")
	f.DurationVar(&c.checkInterval, name+"-cert-check-interval", 12*time.Hour, "how often the self-managed "+name+" certificate's expiry is checked")
}

// options are the certificate's options, but its configurations; ok is false without
// --NAME-cert-secret.
func (c *certFlags) options(role webhookcerts.Role, certDir string) (o webhookcerts.Options, ok bool, err error) {
	if c.secret == "" {
		return o, false, nil
	}
	flag := "--" + c.name + "-cert-secret"
	if certDir == "" {
		return o, false, fmt.Errorf("%s needs --webhook-cert-dir, a writable directory the certificate is written to", flag)
	}
	secret, err := namespacedName(flag, c.secret)
	if err != nil {
		return o, false, err
	}
	service, err := namespacedName("--"+c.name+"-service", c.service)
	if err != nil {
		return o, false, err
	}
	if c.lookahead >= c.serverValidity {
		return o, false, fmt.Errorf("--%s-cert-renew-before %s: want less than --%s-cert-validity %s", c.name, c.lookahead, c.name, c.serverValidity)
	}
	return webhookcerts.Options{Name: c.name, Role: role, Secret: secret, Service: service, CertDir: certDir,
		ServerValidity: c.serverValidity, Lookahead: c.lookahead, CheckInterval: c.checkInterval}, true, nil
}

// webhookCertFlags are the flags of the self-managed webhook certificate.
type webhookCertFlags struct {
	certFlags
	configurations []string
}

func (w *webhookCertFlags) register(cmd *cobra.Command) {
	w.certFlags.register(cmd, "webhook", "`NAMESPACE/NAME` of a Secret in which the controller creates and rotates its own webhook CA and serving certificate, "+
		"serves it (written to --webhook-cert-dir too) and writes the CA into --webhook-configurations; unset: the certificate is the files in --webhook-cert-dir (e.g. from cert-manager)",
		"virt-rules/virt-rules-webhook")
	cmd.Flags().StringSliceVar(&w.configurations, "webhook-configurations", defaultWebhookConfigurations, "`KIND/NAME`s (validating or mutating) of the webhook configurations given the self-managed CA; absent ones are skipped")
}

// certs is nil without --webhook-cert-secret.
func (w *webhookCertFlags) certs(certDir string) (*webhookcerts.Certs, error) {
	o, ok, err := w.options(webhookcerts.Serve, certDir)
	if !ok || err != nil {
		return nil, err
	}
	if o.Configurations, err = parseWebhookConfigurations(w.configurations); err != nil {
		return nil, err
	}
	return webhookcerts.New(o)
}

// defaulterCertFlags are the flags of the defaulter's self-managed serving certificate.
type defaulterCertFlags struct {
	certFlags
}

func (d *defaulterCertFlags) register(cmd *cobra.Command) {
	d.certFlags.register(cmd, "defaulter", "`NAMESPACE/NAME` of a Secret in which the controller creates and rotates the defaulter's CA and serving certificate "+
		"(the defaulter serves it from the Secret mounted in its pod) and trusts that CA, read from the Secret through the API server, as --defaulter-url's; "+
		"unset: --defaulter-ca-file, or the system's CAs",
		"virt-rules/virt-rules-defaulter")
}

// certs is nil without --defaulter-cert-secret. The certificate is written under
// webhookCertDir (the defaults webhook is served only with it); defaulterURL must name the
// Service by one of the certificate's names, over https.
func (d *defaulterCertFlags) certs(webhookCertDir, defaulterURL, caFile string) (*webhookcerts.Certs, error) {
	if d.secret != "" {
		switch {
		case defaulterURL == "":
			return nil, errors.New("--defaulter-cert-secret needs --defaulter-url, the defaulter the certificate is for")
		case caFile != "":
			return nil, errors.New("--defaulter-cert-secret and --defaulter-ca-file: give one, the Secret's CA or the file's")
		}
	}
	dir := ""
	if webhookCertDir != "" {
		dir = strings.TrimSuffix(webhookCertDir, "/") + "/defaulter"
	}
	o, ok, err := d.options(webhookcerts.Trust, dir)
	if !ok || err != nil {
		return nil, err
	}
	u, err := url.Parse(defaulterURL)
	if err != nil {
		return nil, fmt.Errorf("--defaulter-url %q: %w", defaulterURL, err)
	}
	if u.Scheme != "https" || !slices.Contains(o.DNSNames(), u.Hostname()) {
		return nil, fmt.Errorf("--defaulter-url %q: with --defaulter-cert-secret, want https://HOST:PORT with HOST one of the certificate's names %s (--defaulter-service %s)",
			defaulterURL, strings.Join(o.DNSNames(), ", "), d.service)
	}
	return webhookcerts.New(o)
}

func namespacedName(flag, s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("%s %q: want NAMESPACE/NAME", flag, s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}
