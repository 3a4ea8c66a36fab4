package integration_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// servedBundle is a real HTTP bundle server on loopback: one bundle at a time, with an ETag.
type servedBundle struct {
	mu         sync.Mutex
	body, etag string
}

func (s *servedBundle) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	body, etag := s.body, s.etag
	s.mu.Unlock()
	if body == "" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	io.WriteString(w, body)
}

func (s *servedBundle) serve(tarball []byte) {
	sum := sha256.Sum256(tarball)
	s.mu.Lock()
	s.body, s.etag = string(tarball), `"`+hex.EncodeToString(sum[:8])+`"`
	s.mu.Unlock()
}

// shippedBundle is the embedded bundle without its tests, built by OPA's `opa build` code
// with revision rev.
func shippedBundle(rev string) []byte { return clustersuite.ShippedBundle(ctx, rev) }

// freeAddress is a local TCP address nothing listens on now.
var freeAddress = clustersuite.FreeAddress

// startUntilCleanup starts cmd and, when the spec ends, stops it with SIGTERM, killing it
// after grace.
func startUntilCleanup(cmd *exec.Cmd, grace time.Duration) {
	GinkgoHelper()
	Expect(cmd.Start()).To(Succeed())
	DeferCleanup(func() { clustersuite.Stop(cmd, grace) })
}

// writeKubeconfig writes the admin's credentials to the control plane as a kubeconfig file.
func writeKubeconfig() string {
	GinkgoHelper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
	Expect(clientcmd.WriteToFile(*kc, path)).To(Succeed())
	return path
}

func httpGet(url string) (int, string) {
	return clustersuite.HTTPGet(http.DefaultClient, url)
}

var _ = Describe("virt-rules controller --bundle-url", Ordered, func() {
	var (
		binary, kubeconfig, cacheDir, ns string
		server                           *httptest.Server
		bundles                          servedBundle
		metricsAddr, probeAddr           string
	)

	// start runs the real binary against the control plane and stops it when the spec ends.
	start := func() {
		GinkgoHelper()
		metricsAddr, probeAddr = freeAddress(), freeAddress()
		cmd := exec.Command(binary, "controller", "--kubeconfig", kubeconfig, "--leader-elect=false",
			"--bundle-url", server.URL+"/virt-rules.tar.gz", "--bundle-allow-http", "--bundle-cache-dir", cacheDir, "--bundle-poll-interval", "1s",
			"--bundle-revert-window", "3s",
			"--metrics-bind-address", metricsAddr, "--metrics-insecure-http", "--health-probe-bind-address", probeAddr)
		cmd.Env = append(os.Environ(), "POD_NAME=virt-rules-bundle-test", "POD_NAMESPACE="+ns)
		cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
		startUntilCleanup(cmd, 20*time.Second)
		Eventually(func() int { code, _ := httpGet("http://" + probeAddr + "/healthz"); return code }).Should(Equal(http.StatusOK))
	}
	readyz := func() int { code, _ := httpGet("http://" + probeAddr + "/readyz"); return code }
	metrics := func() string { _, body := httpGet("http://" + metricsAddr + "/metrics"); return body }
	bundleEvents := func() []string {
		var events corev1.EventList
		Expect(k8sClient.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		var out []string
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "virt-rules-bundle-test" {
				out = append(out, e.Reason+": "+e.Message)
			}
		}
		return out
	}

	BeforeAll(func(sctx SpecContext) {
		binary = clustersuite.BuildVirtRules(sctx, repoRoot, "")
		kubeconfig = writeKubeconfig()
		cacheDir = filepath.Join(GinkgoT().TempDir(), "cache")
		ns = createNamespace()
		server = httptest.NewServer(&bundles)
		DeferCleanup(server.Close)
	}, NodeTimeout(5*time.Minute))

	It("is not ready until a bundle is downloaded, then swaps each new revision in with metrics and an Event", func() {
		start()
		Consistently(readyz).WithTimeout(2 * time.Second).Should(Equal(http.StatusInternalServerError))
		Eventually(metrics).Should(ContainSubstring(`virtrules_bundle_load_failures_total{reason="download"}`))

		bundles.serve(shippedBundle("integration-1"))
		Eventually(readyz).Should(Equal(http.StatusOK))
		Eventually(metrics).Should(ContainSubstring(fmt.Sprintf(`virtrules_bundle_active_revision{revision="integration-1",source="%s/virt-rules.tar.gz"} 1`, server.URL)))
		Eventually(bundleEvents).Should(ContainElement("BundleActivated: Bundle revision integration-1 from " + server.URL + "/virt-rules.tar.gz activated"))

		second := shippedBundle("integration-2")
		bundles.serve(second)
		Eventually(metrics).Should(ContainSubstring(`virtrules_bundle_active_revision{revision="integration-2"`))
		// On probation: integration-1 stays the persisted bundle until integration-2 has served a
		// revert window (3s here) within its budget; the first poll after it persists it.
		persisted := func() string { raw, _ := os.ReadFile(filepath.Join(cacheDir, "bundle.tar.gz")); return string(raw) }
		Expect(persisted()).NotTo(Equal(string(second)))
		Eventually(persisted).WithTimeout(10 * time.Second).Should(Equal(string(second)))
		Eventually(bundleEvents).Should(ContainElement(ContainSubstring("revision integration-2 from " + server.URL + "/virt-rules.tar.gz activated, replacing revision integration-1")))
		m := metrics()
		Expect(m).To(ContainSubstring("virtrules_bundle_load_successes_total 2"))
		Expect(m).NotTo(ContainSubstring(`revision="integration-1"`))
		Expect(m).To(MatchRegexp(`virtrules_bundle_seconds_since_last_activation \d`))
	})

	It("refuses a broken bundle and keeps serving the last good one", func() {
		start()
		Eventually(readyz).Should(Equal(http.StatusOK))
		bundles.serve([]byte("not a bundle"))
		Eventually(metrics).Should(ContainSubstring(`virtrules_bundle_load_failures_total{reason="read"}`))
		Eventually(bundleEvents).Should(ContainElement(HavePrefix("BundleRefused: Bundle from " + server.URL + "/virt-rules.tar.gz refused (read), revision integration-2 keeps serving")))
		Expect(readyz()).To(Equal(http.StatusOK))
		Expect(metrics()).To(ContainSubstring(`virtrules_bundle_active_revision{revision="integration-2"`))
	})

	It("starts from the persisted bundle while the server is down", func() {
		server.Close()
		start()
		Eventually(readyz).WithTimeout(5 * time.Second).Should(Equal(http.StatusOK))
		// The metrics server starts beside the probes, not necessarily before them.
		Eventually(metrics).WithTimeout(5 * time.Second).Should(ContainSubstring(fmt.Sprintf(`virtrules_bundle_active_revision{revision="integration-2",source="%s"} 1`,
			filepath.Join(cacheDir, "bundle.tar.gz"))))
	})
})
