package engine

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/keys"
)

// verificationKeyID names the one key bundles are verified with. It takes precedence over a
// key id in the signature, so a bundle signed with `opa build --signing-key` alone verifies.
const verificationKeyID = "virt-rules"

// verificationConfig reads a PEM public key (or certificate) and returns OPA's bundle
// verification configuration for it. The signing algorithm follows from the key: RS256 for
// RSA (`opa build`'s default), ES256/ES384/ES512 for ECDSA P-256/P-384/P-521.
func verificationConfig(file string) (*bundle.VerificationConfig, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("bundle verification key: %w", err)
	}
	alg, err := keyAlgorithm(raw)
	if err != nil {
		return nil, fmt.Errorf("bundle verification key %s: %w", file, err)
	}
	kc := &keys.Config{Key: string(raw), Algorithm: alg}
	return bundle.NewVerificationConfig(map[string]*bundle.KeyConfig{verificationKeyID: kc}, verificationKeyID, "", nil), nil
}

func keyAlgorithm(raw []byte) (string, error) {
	block, _ := pem.Decode(raw)
	if block == nil {
		return "", fmt.Errorf("not PEM: want a public key as written by openssl (-----BEGIN PUBLIC KEY-----)")
	}
	var pub any
	var err error
	switch block.Type {
	case "PUBLIC KEY":
		pub, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
			pub = cert.PublicKey
		}
	default:
		return "", fmt.Errorf("PEM block %q: want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE (never the private key)", block.Type)
	}
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", block.Type, err)
	}
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return "RS256", nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return "ES256", nil
		case elliptic.P384():
			return "ES384", nil
		case elliptic.P521():
			return "ES512", nil
		}
		return "", fmt.Errorf("ECDSA curve %s: want P-256, P-384 or P-521", k.Curve.Params().Name)
	default:
		return "", fmt.Errorf("%T keys are not supported: want RSA or ECDSA", pub)
	}
}

// isSignatureError tells a verification failure from other unreadable bundles; OPA's bundle
// reader reports both as plain errors.
func isSignatureError(err error) bool {
	msg := err.Error()
	for _, s := range []string{"signature", "digest mismatch", "verification key", "scope mismatch"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
