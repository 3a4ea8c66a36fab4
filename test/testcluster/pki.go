package testcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// authority is the test cluster's own certificate authority: it signs virt-api's and
// virt-controller's serving certificates and kube-apiserver's front-proxy client certificate
// (the aggregation layer's request-header authentication, which virt-api insists on at start).
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// certFile is the CA certificate in PEM, the bundle clients trust.
	certFile string
	dir      string
}

func newAuthority(dir string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "virt-rules test cluster CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sign CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	a := &authority{cert: cert, key: key, dir: dir, certFile: filepath.Join(dir, "ca.crt")}
	if err := writePEM(a.certFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return a, nil
}

// issue writes NAME.crt and NAME.key, a certificate for cn usable as a server (for 127.0.0.1
// and localhost plus dnsNames) and as a client.
func (a *authority) issue(name, cn string, dnsNames ...string) (certFile, keyFile string, err error) {
	return a.issueFor(name, cn, nil, dnsNames...)
}

// issueFor is issue for the addresses ips besides 127.0.0.1.
func (a *authority) issueFor(name, cn string, ips []net.IP, dnsNames ...string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate %s key: %w", name, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  append([]net.IP{net.ParseIP("127.0.0.1")}, ips...),
		DNSNames:     append([]string{"localhost"}, dnsNames...),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return "", "", fmt.Errorf("sign %s certificate: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(a.dir, name+".crt"), filepath.Join(a.dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	if err := writePEM(keyFile, "EC PRIVATE KEY", keyDER); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func writePEM(path, kind string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// AnotherCA writes into dir a certificate authority of its own (ca.crt, ca's key kept in
// memory only) and a certificate it signed for cn, NAME.crt and NAME.key as issue makes them:
// a serving certificate no client of the test cluster trusts.
func AnotherCA(dir, name, cn string, dnsNames ...string) (certFile, keyFile string, err error) {
	a, err := newAuthority(dir)
	if err != nil {
		return "", "", err
	}
	return a.issue(name, cn, dnsNames...)
}
