package webhookcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func validOptions(t *testing.T) Options {
	return Options{
		Name:           "webhook",
		Secret:         types.NamespacedName{Namespace: "virt-rules", Name: "virt-rules-webhook-tls"},
		Service:        types.NamespacedName{Namespace: "virt-rules", Name: "virt-rules-webhook"},
		CertDir:        filepath.Join(t.TempDir(), "certs"),
		Configurations: []Configuration{{Kind: Validating, Name: "v"}, {Kind: Mutating, Name: "m"}},
	}
}

func TestNewRefusesIncompleteOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*Options)
		want   string
	}{
		"secret without namespace":  {func(o *Options) { o.Secret.Namespace = "" }, "Secret"},
		"service without name":      {func(o *Options) { o.Service.Name = "" }, "Service"},
		"no certificate directory":  {func(o *Options) { o.CertDir = "" }, "no certificate directory"},
		"no name":                   {func(o *Options) { o.Name = "" }, "no name"},
		"trust with configurations": {func(o *Options) { o.Role = Trust }, "no webhook configuration"},
		"unknown kind":              {func(o *Options) { o.Configurations[0].Kind = "conversion" }, `"conversion"`},
		"configuration no name":     {func(o *Options) { o.Configurations[1].Name = "" }, "mutating/NAME"},
	} {
		t.Run(name, func(t *testing.T) {
			o := validOptions(t)
			tc.change(&o)
			if _, err := New(o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestLoadServesAndWritesTheSecretsCertificate(t *testing.T) {
	c, err := New(validOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{}
	c.TLSOption(cfg)
	if _, err := cfg.GetCertificate(nil); err == nil || !strings.Contains(err.Error(), "not issued yet") {
		t.Fatalf("before the Secret is filled in: %v, want an error", err)
	}
	if err := c.load(&corev1.Secret{}); err == nil {
		t.Fatal("an empty Secret was loaded")
	}
	if err := c.load(&corev1.Secret{Data: map[string][]byte{CertKey: []byte("junk"), KeyKey: []byte("junk")}}); err == nil {
		t.Fatal("a Secret with junk was loaded")
	}
	certPEM, keyPEM := selfSigned(t)
	if err := c.load(&corev1.Secret{Data: map[string][]byte{CertKey: certPEM, KeyKey: keyPEM}}); err != nil {
		t.Fatal(err)
	}
	served, err := cfg.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	if string(served.Certificate[0]) != string(block.Bytes) {
		t.Fatal("the served certificate is not the Secret's")
	}
	for key, want := range map[string][]byte{CertKey: certPEM, KeyKey: keyPEM} {
		got, err := os.ReadFile(filepath.Join(c.opts.CertDir, key))
		if err != nil || string(got) != string(want) {
			t.Fatalf("%s in the certificate directory: %v, want the Secret's", key, err)
		}
	}
	if err := c.Ready(); err == nil {
		t.Fatal("ready before the CA is in the webhook configurations")
	}
}

func TestTrustKeepsTheSecretsCAAndTheOneBeforeAndNeverWritesTheKey(t *testing.T) {
	o := validOptions(t)
	o.Name, o.Role, o.Configurations = "defaulter", Trust, nil
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Roots(); err == nil || !strings.Contains(err.Error(), "defaulter CA is not issued yet") {
		t.Fatalf("Roots before the Secret is filled in: %v, want an error", err)
	}
	certPEM, keyPEM := selfSigned(t)
	if err := c.load(&corev1.Secret{Data: map[string][]byte{CertKey: certPEM, KeyKey: keyPEM}}); err == nil || !strings.Contains(err.Error(), CACertKey) {
		t.Fatalf("a Secret without ca.crt: %v, want an error naming it", err)
	}
	// The self-signed certificates stand for CAs: each verifies itself.
	ca1, _ := selfSigned(t)
	ca2, _ := selfSigned(t)
	ca3, _ := selfSigned(t)
	verifies := func(caPEM []byte) bool {
		t.Helper()
		pool, err := c.Roots()
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(caPEM)
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "virt-rules-webhook.virt-rules.svc"})
		return err == nil
	}
	for i, step := range []struct {
		ca            []byte
		trust, forget [][]byte
	}{
		{ca: ca1, trust: [][]byte{ca1}, forget: [][]byte{ca2, ca3}},
		{ca: ca1, trust: [][]byte{ca1}, forget: [][]byte{ca2, ca3}},
		{ca: ca2, trust: [][]byte{ca1, ca2}, forget: [][]byte{ca3}},
		{ca: ca3, trust: [][]byte{ca2, ca3}, forget: [][]byte{ca1}},
	} {
		if err := c.load(&corev1.Secret{Data: map[string][]byte{CertKey: certPEM, KeyKey: keyPEM, CACertKey: step.ca}}); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		for _, ca := range step.trust {
			if !verifies(ca) {
				t.Fatalf("step %d: a CA of the Secret is not trusted", i)
			}
		}
		for _, ca := range step.forget {
			if verifies(ca) {
				t.Fatalf("step %d: a CA the Secret does not have (or had two CAs ago) is trusted", i)
			}
		}
	}
	if got, err := os.ReadFile(filepath.Join(o.CertDir, CertKey)); err != nil || string(got) != string(certPEM) {
		t.Fatalf("%s in the certificate directory: %v, want the Secret's", CertKey, err)
	}
	if _, err := os.Stat(filepath.Join(o.CertDir, KeyKey)); !os.IsNotExist(err) {
		t.Fatalf("the server's key was written to the client's directory: %v", err)
	}
	if err := c.Ready(); err == nil || !strings.Contains(err.Error(), "not issued and trusted yet") {
		t.Fatalf("Ready before cert-controller checked the directory: %v", err)
	}
}

func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "virt-rules-webhook.virt-rules.svc"},
		DNSNames: []string{"virt-rules-webhook.virt-rules.svc"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}
