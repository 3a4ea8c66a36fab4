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
		"secret without namespace": {func(o *Options) { o.Secret.Namespace = "" }, "Secret"},
		"service without name":     {func(o *Options) { o.Service.Name = "" }, "Service"},
		"no certificate directory": {func(o *Options) { o.CertDir = "" }, "--webhook-cert-dir"},
		"unknown kind":             {func(o *Options) { o.Configurations[0].Kind = "conversion" }, `"conversion"`},
		"configuration no name":    {func(o *Options) { o.Configurations[1].Name = "" }, "mutating/NAME"},
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
