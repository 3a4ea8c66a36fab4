package defaults

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A connection made after the roots change trusts the new ones: the client of a defaulter
// whose CA was rotated, and before the CA is issued, no call at all.
func TestNewHTTPClientTrustsTheRootsOfTheMoment(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	pools := map[string]*x509.CertPool{}
	servers := map[string]*httptest.Server{}
	for _, name := range []string{"first", "second"} {
		cert, leaf := selfSignedFor127(t)
		srv := httptest.NewUnstartedServer(ok)
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		srv.StartTLS()
		defer srv.Close()
		pool := x509.NewCertPool()
		pool.AddCert(leaf)
		pools[name], servers[name] = pool, srv
	}
	first, second := servers["first"], servers["second"]
	var current atomic.Pointer[x509.CertPool]
	notYet := errors.New("not issued yet")
	roots := func() (*x509.CertPool, error) {
		if p := current.Load(); p != nil {
			return p, nil
		}
		return nil, notYet
	}
	hc, err := NewHTTPClient(first.URL, roots, "")
	if err != nil {
		t.Fatal(err)
	}
	get := func(url string) error {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(first.URL); !errors.Is(err, notYet) {
		t.Fatalf("before a CA: %v, want %v", err, notYet)
	}
	current.Store(pools["first"])
	if err := get(first.URL); err != nil {
		t.Fatalf("the first CA: %v", err)
	}
	if err := get(second.URL); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a server of another CA: %v, want a certificate error", err)
	}
	current.Store(pools["second"])
	if err := get(second.URL); err != nil {
		t.Fatalf("after the roots changed: %v", err)
	}
	if err := get(first.URL); err == nil {
		t.Fatal("a CA no longer among the roots is still trusted")
	}
}

// selfSignedFor127 is a certificate of its own for 127.0.0.1, its own CA.
func selfSignedFor127(t *testing.T) (tls.Certificate, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "defaulter"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, leaf
}
