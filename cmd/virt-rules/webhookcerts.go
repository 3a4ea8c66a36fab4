package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virt-rules/virt-rules/internal/webhookcerts"
)

// defaultWebhookConfigurations are the webhook configurations of examples/deploy/webhooks and
// examples/deploy/defaults.
var defaultWebhookConfigurations = []string{"validating/virt-rules-validating", "mutating/virt-rules-mutating", "mutating/zz-virt-rules-defaults"}

// webhookCertFlags are the flags of the self-managed webhook certificate.
type webhookCertFlags struct {
	secret         string
	service        string
	configurations []string
	serverValidity time.Duration
	lookahead      time.Duration
	checkInterval  time.Duration
}

func (w *webhookCertFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&w.secret, "webhook-cert-secret", "", "`NAMESPACE/NAME` of a Secret in which the controller creates and rotates its own webhook CA and serving certificate, "+
		"serves it (written to --webhook-cert-dir too) and writes the CA into --webhook-configurations; unset: the certificate is the files in --webhook-cert-dir (e.g. from cert-manager)")
	f.StringVar(&w.service, "webhook-service", "virt-rules/virt-rules-webhook", "`NAMESPACE/NAME` of the webhook Service the self-managed certificate is for")
	f.StringSliceVar(&w.configurations, "webhook-configurations", defaultWebhookConfigurations, "`KIND/NAME`s (validating or mutating) of the webhook configurations given the self-managed CA; absent ones are skipped")
	f.DurationVar(&w.serverValidity, "webhook-cert-validity", 365*24*time.Hour, "how long a self-managed serving certificate is valid")
	f.DurationVar(&w.lookahead, "webhook-cert-renew-before", 90*24*time.Hour, "how long before expiry a self-managed certificate is renewed")
	f.DurationVar(&w.checkInterval, "webhook-cert-check-interval", 12*time.Hour, "how often the self-managed certificate's expiry is checked")
}

// certs is nil without --webhook-cert-secret.
func (w *webhookCertFlags) certs(certDir string) (*webhookcerts.Certs, error) {
	if w.secret == "" {
		return nil, nil
	}
	if certDir == "" {
		return nil, errors.New("--webhook-cert-secret needs --webhook-cert-dir, a writable directory the certificate is written to")
	}
	secret, err := namespacedName("--webhook-cert-secret", w.secret)
	if err != nil {
		return nil, err
	}
	service, err := namespacedName("--webhook-service", w.service)
	if err != nil {
		return nil, err
	}
	o := webhookcerts.Options{Secret: secret, Service: service, CertDir: certDir,
		ServerValidity: w.serverValidity, Lookahead: w.lookahead, CheckInterval: w.checkInterval}
	if w.lookahead >= w.serverValidity {
		return nil, fmt.Errorf("--webhook-cert-renew-before %s: want less than --webhook-cert-validity %s", w.lookahead, w.serverValidity)
	}
	if o.Configurations, err = parseWebhookConfigurations(w.configurations); err != nil {
		return nil, err
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
