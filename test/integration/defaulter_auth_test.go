//go:build libvirt

package integration_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

var _ = Describe("virt-rules defaulter with TLS and examples/deploy/defaults' RBAC", Ordered, func() {
	var (
		webhooks        *envtest.WebhookInstallOptions
		base, caFile    string
		certDir         string
		controllerToken string
		trusting        *http.Client
	)

	post := func(token string) (int, string) {
		GinkgoHelper()
		vm, err := yaml.YAMLToJSON([]byte(defaultsVM))
		Expect(err).NotTo(HaveOccurred())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+defaults.Path+"?dryRun=true", bytes.NewReader(vm))
		Expect(err).NotTo(HaveOccurred())
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := trusting.Do(req)
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	BeforeAll(func(sctx SpecContext) {
		binary := clustersuite.BuildVirtRules(sctx, repoRoot, "")

		Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules"}}))).To(Succeed())
		objs, err := manifest.Read([]string{filepath.Join(repoRoot, "examples", "deploy", "defaults", "rbac.yaml")}, nil)
		Expect(err).NotTo(HaveOccurred())
		for _, o := range objs {
			Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, o.Unstructured.DeepCopy()))).To(Succeed(), o.Describe())
		}

		// One serving certificate for 127.0.0.1 (envtest's) serves the webhook and the defaulter.
		webhooks = &envtest.WebhookInstallOptions{Paths: []string{filepath.Join(repoRoot, "examples", "deploy", "defaults", "mutating.yaml")}}
		Expect(webhooks.Install(cfg)).To(Succeed())
		DeferCleanup(func() {
			for _, c := range webhooks.MutatingWebhooks {
				Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, c.DeepCopy()))).To(Succeed())
			}
			Expect(webhooks.Cleanup()).To(Succeed())
		})
		caFile = filepath.Join(GinkgoT().TempDir(), "ca.crt")
		Expect(os.WriteFile(caFile, webhooks.LocalServingCAData, 0o600)).To(Succeed())
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM(webhooks.LocalServingCAData)).To(BeTrue())
		trusting = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

		root, err := os.MkdirTemp("/dev/shm", "virt-rules-integration-auth-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(os.RemoveAll, root)
		address := freeAddress()
		base = "https://" + address
		serviceAccountToken("virt-rules", "virt-rules-defaulter") // the account the kit binds
		// The defaulter's own copy of the serving certificate, which the last spec rotates.
		certDir = GinkgoT().TempDir()
		for _, name := range []string{"tls.crt", "tls.key"} {
			raw, err := os.ReadFile(filepath.Join(webhooks.LocalServingCertDir, name))
			Expect(err).NotTo(HaveOccurred())
			Expect(os.WriteFile(filepath.Join(certDir, name), raw, 0o600)).To(Succeed())
		}
		cmd := exec.Command(binary, "defaulter", "--listen", address, "--libvirt-root", root,
			"--tls-cert-file", filepath.Join(certDir, "tls.crt"),
			"--tls-private-key-file", filepath.Join(certDir, "tls.key"),
			"--kubeconfig", impersonatingKubeconfig("system:serviceaccount:virt-rules:virt-rules-defaulter"))
		cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
		startUntilCleanup(cmd, 30*time.Second)
		Eventually(clustersuite.HTTPStatus(trusting, base+"/readyz")).WithTimeout(2*time.Minute).Should(Equal(http.StatusOK), "probes need no token")
		controllerToken = serviceAccountToken("virt-rules", "virt-rules", defaults.DefaultAudience)
	}, NodeTimeout(5*time.Minute))

	It("answers 401 without a valid token for it, 403 to any caller but the controller", func() {
		code, body := post("")
		Expect(code).To(Equal(http.StatusUnauthorized), body)
		code, body = post("not-a-token")
		Expect(code).To(Equal(http.StatusUnauthorized), body)
		code, body = post(serviceAccountToken("virt-rules", "virt-rules"))
		Expect(code).To(Equal(http.StatusUnauthorized), "the controller's token for the API server is not one for the defaulter: %s", body)
		code, body = post(serviceAccountToken("virt-rules", "intruder", defaults.DefaultAudience))
		Expect(code).To(Equal(http.StatusForbidden), body)
		Expect(body).To(ContainSubstring(`system:serviceaccount:virt-rules:intruder`))
		code, body = post(controllerToken)
		Expect(code).To(Equal(http.StatusOK), body)

		resp, err := http.Post("http://"+base[len("https://"):]+defaults.Path, "application/json", bytes.NewReader([]byte(`{}`)))
		if err == nil {
			resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), "plain HTTP is not served")
		}
	})

	It("defaults a VM created through the API server: the controller's webhook calls it with its CA and token", func() {
		tokenFile := filepath.Join(GinkgoT().TempDir(), "token")
		Expect(os.WriteFile(tokenFile, []byte(controllerToken), 0o600)).To(Succeed())
		stop := startDefaultsManagerWith(webhooks, base, caFile, tokenFile)
		DeferCleanup(stop)
		ns := createNamespace()
		vm := fromYAML(defaultsVM)
		vm.SetNamespace(ns)
		Expect(k8sClient.Create(ctx, vm, client.DryRunAll)).To(Succeed())
		d := typedVM(vm).Spec.Template.Spec.Domain
		Expect(d.Devices.Interfaces[0].MacAddress).To(MatchRegexp(`^02(:[0-9a-f]{2}){5}$`), "defaulted")
	})

	It("serves a rotated certificate without a restart", func() {
		served := func() string {
			conn, err := tls.Dial("tcp", base[len("https://"):], &tls.Config{InsecureSkipVerify: true}) // to read what is served
			if err != nil {
				return err.Error()
			}
			defer conn.Close()
			return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
		}
		Expect(served()).NotTo(Equal("rotated.virt-rules-defaulter"))

		// A new key and certificate, written as the kubelet updates a mounted Secret: each file
		// replaced by a rename.
		certPEM, keyPEM := clustersuite.CertificateOfAnotherCA("rotated.virt-rules-defaulter")
		for name, data := range map[string][]byte{"tls.key": keyPEM, "tls.crt": certPEM} {
			tmp := filepath.Join(certDir, "."+name+".new")
			Expect(os.WriteFile(tmp, data, 0o600)).To(Succeed())
			Expect(os.Rename(tmp, filepath.Join(certDir, name))).To(Succeed())
		}
		Eventually(served).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Equal("rotated.virt-rules-defaulter"))
	})
})
