package clustersuite

import (
	"os"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/virt-rules/virt-rules/test/testcluster"
)

// CertificateOfAnotherCA is a serving certificate for commonName (and 127.0.0.1, localhost and
// dnsNames) signed by a CA made here (testcluster.AnotherCA), and its key, both PEM: what no
// client of the suite trusts.
func CertificateOfAnotherCA(commonName string, dnsNames ...string) (certPEM, keyPEM []byte) {
	GinkgoHelper()
	certFile, keyFile, err := testcluster.AnotherCA(GinkgoT().TempDir(), "serving", commonName, dnsNames...)
	Expect(err).NotTo(HaveOccurred())
	certPEM, err = os.ReadFile(certFile)
	Expect(err).NotTo(HaveOccurred())
	keyPEM, err = os.ReadFile(keyFile)
	Expect(err).NotTo(HaveOccurred())
	return certPEM, keyPEM
}
