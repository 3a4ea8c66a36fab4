package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

func TestDefaulterCertSecretIsCheckedAgainstTheOtherFlags(t *testing.T) {
	const url = "https://virt-rules-defaulter.virt-rules.svc:8090"
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		args                   []string
		certDir, defaulter, ca string
		want                   string // "" for a certificate
	}{
		"the kit's":               {args: []string{"--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls"}, certDir: dir, defaulter: url},
		"the Service's long name": {args: []string{"--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls"}, certDir: dir, defaulter: "https://virt-rules-defaulter.virt-rules.svc.cluster.local:8090"},
		"no defaulter":            {args: []string{"--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls"}, certDir: dir, want: "needs --defaulter-url"},
		"and a CA file":           {args: []string{"--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls"}, certDir: dir, defaulter: url, ca: "ca.crt", want: "give one"},
		"no webhooks":             {args: []string{"--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls"}, defaulter: url, want: "needs --webhook-cert-dir"},
		"plain http":              {args: []string{"--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls"}, certDir: dir, defaulter: "http://virt-rules-defaulter.virt-rules.svc:8090", want: "want https://HOST:PORT"},
		"another name":            {args: []string{"--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls"}, certDir: dir, defaulter: "https://127.0.0.1:8090", want: "virt-rules-defaulter.virt-rules.svc, "},
		"another Service":         {args: []string{"--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls", "--defaulter-service=vr/defaults"}, certDir: dir, defaulter: url, want: "defaults.vr.svc"},
		"no namespace":            {args: []string{"--defaulter-cert-secret=virt-rules-defaulter-tls"}, certDir: dir, defaulter: url, want: "want NAMESPACE/NAME"},
		"renewed after expiry":    {args: []string{"--defaulter-cert-secret=virt-rules/t", "--defaulter-cert-validity=1h", "--defaulter-cert-renew-before=2h"}, certDir: dir, defaulter: url, want: "want less than --defaulter-cert-validity"},
		"unset, a CA file":        {certDir: dir, defaulter: url, ca: "ca.crt"},
	} {
		t.Run(name, func(t *testing.T) {
			var d defaulterCertFlags
			cmd := &cobra.Command{}
			d.register(cmd)
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			certs, err := d.certs(tc.certDir, tc.defaulter, tc.ca)
			switch {
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("%v, want an error with %q", err, tc.want)
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want == "" && (certs != nil) != (len(tc.args) > 0):
				t.Fatalf("certificate %v with flags %q", certs, tc.args)
			}
		})
	}
}

// The defaulter's pod starts before the controller has issued its certificate: it serves a
// placeholder and is not ready, then serves the files once they appear.
func TestServingCertificateWaitsForItsFiles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	c, err := newServingCertificate(ctx, certFile, keyFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ready(); err == nil || !strings.Contains(err.Error(), "no serving certificate yet") {
		t.Fatalf("ready without the files: %v", err)
	}
	placeholder, err := c.getCertificate(nil)
	if err != nil || placeholder == nil {
		t.Fatalf("no placeholder: %v", err)
	}
	real, err := selfSignedPlaceholder() // any certificate of its own key will do
	if err != nil {
		t.Fatal(err)
	}
	writeKeyPair(t, real, certFile, keyFile)
	deadline := time.Now().Add(10 * time.Second)
	for c.ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the files were not picked up: %v", c.ready())
		}
		time.Sleep(100 * time.Millisecond)
	}
	served, err := c.getCertificate(nil)
	if err != nil || string(served.Certificate[0]) != string(real.Certificate[0]) {
		t.Fatalf("served %v (%v), want the files' certificate", served, err)
	}
}

func writeKeyPair(t *testing.T, cert *tls.Certificate, certFile, keyFile string) {
	t.Helper()
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
}
