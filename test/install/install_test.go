package install_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

const (
	kitNamespace = "virt-rules"
	// webhookHost is where the replica the webhook Service names listens; the other replica
	// listens on webhookHost2. Both on the Service's port, 443, as in a pod.
	webhookHost  = "127.0.0.2"
	webhookHost2 = "127.0.0.3"
)

var (
	tlsSecret     = client.ObjectKey{Namespace: kitNamespace, Name: "virt-rules-webhook-tls"}
	bundleCache   = client.ObjectKey{Namespace: kitNamespace, Name: "virt-rules-bundle-cache"}
	configuration = map[string]client.Object{
		"virt-rules-validating": &admissionregistrationv1.ValidatingWebhookConfiguration{},
		"virt-rules-mutating":   &admissionregistrationv1.MutatingWebhookConfiguration{},
	}
	migrationPolicyGVK = schema.GroupVersionKind{Group: "migrations.kubevirt.io", Version: "v1alpha1", Kind: "MigrationPolicy"}
)

// replica is one `virt-rules controller` process.
type replica struct {
	name   string
	host   string
	cmd    *exec.Cmd
	log    string
	probes string
}

var _ = Describe("kubectl apply -k examples/deploy", Ordered, func() {
	var (
		kit      []*unstructured.Unstructured
		replicas []*replica
		caPEM    []byte
		// bundles is the admin's bundle server the replicas poll (--bundle-url).
		bundles *bundleServer
		served  []byte
	)

	BeforeAll(func(sctx SpecContext) { startCluster(sctx) }, NodeTimeout(30*time.Minute))
	AfterAll(func() {
		for _, r := range replicas {
			r.stop()
		}
		if bundles != nil {
			bundles.Close()
		}
	})

	It("renders, as does examples/deploy/defaults, with the webhook configurations first", func() {
		kit = render("examples/deploy")
		Expect(kinds(kit)[:2]).To(ConsistOf("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"))
		Expect(kinds(kit)[2]).To(Equal("Namespace"))
		Expect(find(kit, "Secret", "virt-rules-webhook-tls").Object).NotTo(HaveKey("data"), "the kit must never carry the controller's certificate")

		withDefaults := render("examples/deploy/defaults")
		Expect(kinds(withDefaults)[:3]).To(ConsistOf("MutatingWebhookConfiguration", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"))
		find(withDefaults, "MutatingWebhookConfiguration", "zz-virt-rules-defaults")
		find(withDefaults, "Deployment", "virt-rules-defaulter")
		args, _, _ := unstructured.NestedSlice(find(withDefaults, "Deployment", "virt-rules").Object, "spec", "template", "spec", "containers")
		Expect(fmt.Sprint(args)).To(ContainSubstring("--defaulter-url=https://virt-rules-defaulter.virt-rules.svc:8090"))

		withCertManager := render("examples/deploy/cert-manager")
		Expect(kinds(withCertManager)[:2]).To(ConsistOf("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"))
		find(withCertManager, "Certificate", "virt-rules-webhook")
		for _, o := range withCertManager {
			Expect(o.GetName()).NotTo(Equal("virt-rules-webhook-tls"), "cert-manager owns the Secret")
			if strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
				Expect(o.GetAnnotations()).To(HaveKeyWithValue("cert-manager.io/inject-ca-from", "virt-rules/virt-rules-webhook"))
			}
		}
		containers, _, _ := unstructured.NestedSlice(find(withCertManager, "Deployment", "virt-rules").Object, "spec", "template", "spec", "containers")
		Expect(fmt.Sprint(containers)).NotTo(ContainSubstring("--webhook-cert-secret"))
		Expect(fmt.Sprint(containers)).To(ContainSubstring("--webhook-cert-dir=/var/run/virt-rules/webhook-certs"))
	})

	It("applies on the test cluster", func() {
		// The test cluster has no kube-proxy, so a ClusterIP reaches nothing. kube-apiserver's
		// service resolver dials an ExternalName Service's name on the Service's port: the
		// kit's Service keeps its name, namespace and port (443), so the API server calls
		// https://virt-rules-webhook.virt-rules.svc:443 and checks the certificate for that
		// name, as in a cluster, reaching the first replica on webhookHost.
		svc := find(kit, "Service", "virt-rules-webhook")
		Expect(unstructured.SetNestedField(svc.Object, "ExternalName", "spec", "type")).To(Succeed())
		Expect(unstructured.SetNestedField(svc.Object, webhookHost, "spec", "externalName")).To(Succeed())
		unstructured.RemoveNestedField(svc.Object, "spec", "selector")
		applyAll(kit)
		for name, c := range configuration {
			Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, c)).To(Succeed())
		}
	})

	It("runs two replicas as the kit's service account: one leader, the certificate made and the CA in every webhook, both ready", func() {
		kubeconfig := serviceAccountKubeconfig("virt-rules")
		served = shippedBundle("install-1")
		bundles = startBundleServer(served)
		args := append(kitArgs(kit), "--bundle-url="+bundles.url(), "--bundle-allow-http")
		replicas = []*replica{
			startReplica("replica-1", kubeconfig, webhookHost, args),
			startReplica("replica-2", kubeconfig, webhookHost2, args),
		}
		secret := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, tlsSecret, secret)).To(Succeed())
			g.Expect(secret.Data).To(HaveKey("tls.crt"))
			g.Expect(secret.Data).To(HaveKey("ca.crt"))
		}).Should(Succeed())
		caPEM = secret.Data["ca.crt"]
		Eventually(caBundles).Should(HaveEach(Equal(string(caPEM))))
		Expect(caBundles()).To(HaveLen(7), "every webhook of both configurations: 3 validating, 4 mutating")
		for _, r := range replicas {
			Eventually(r.ready).WithTimeout(2*time.Minute).Should(Succeed(), r.name)
		}
		Eventually(leaders(replicas)).Should(HaveLen(1))
		Consistently(leaders(replicas)).WithTimeout(3 * time.Second).Should(HaveLen(1))
	})

	It("serves the certificate for the Service's name, signed by the CA in the Secret", func() {
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM(caPEM)).To(BeTrue())
		for _, host := range []string{webhookHost, webhookHost2} {
			conn, err := tls.Dial("tcp", net.JoinHostPort(host, "443"), &tls.Config{RootCAs: pool, ServerName: "virt-rules-webhook.virt-rules.svc"})
			Expect(err).NotTo(HaveOccurred(), host)
			Expect(conn.Close()).To(Succeed())
		}
	})

	It("answers admission through the Service: the API server calls the webhooks and trusts them", func() {
		Expect(k8s.Create(ctx, migrationPolicy("install-db"))).To(Succeed())
		err := k8s.Create(ctx, migrationPolicy("install-db-again"))
		Expect(err).To(HaveOccurred(), "a policy with the selectors of another is refused by the validating webhook")
		Expect(err.Error()).To(ContainSubstring(`admission webhook "migrationpolicies.validate.virt-rules.io" denied the request`))
		Expect(err.Error()).To(ContainSubstring("install-db"))
	})

	It("keeps the certificates, the caBundles and the last good bundle when a newer kit is applied while the bundle server is down", func() {
		By("the replicas keeping the server's bundle in the kit's ConfigMap")
		cache := &corev1.ConfigMap{}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, bundleCache, cache)).To(Succeed())
			g.Expect(cache.BinaryData["bundle.tar.gz"]).To(Equal(served))
		}).Should(Succeed())
		before := &corev1.Secret{}
		Expect(k8s.Get(ctx, tlsSecret, before)).To(Succeed())

		By("applying a newer kit (image tag, one argument) with the bundle server down")
		bundles.Close()
		newer := newerKit(kit)
		applyAll(newer)
		after := &corev1.Secret{}
		Expect(k8s.Get(ctx, tlsSecret, after)).To(Succeed())
		Expect(after.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/version", "newer"))
		Expect(after.Data).To(Equal(before.Data))
		Expect(k8s.Get(ctx, bundleCache, cache)).To(Succeed())
		Expect(cache.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/version", "newer"))
		Expect(cache.BinaryData["bundle.tar.gz"]).To(Equal(served), "applying the kit keeps what the controller wrote")
		Expect(caBundles()).To(HaveEach(Equal(string(caPEM))))
		Consistently(caBundles).WithTimeout(3 * time.Second).Should(HaveEach(Equal(string(caPEM))))

		By("rolling replica-2 onto the newer kit's arguments: it starts from the kept bundle")
		replicas[1].stop()
		args := append(kitArgs(newer), "--bundle-url="+bundles.url(), "--bundle-allow-http")
		Expect(args).To(ContainElement("--log-level=debug"))
		replicas[1] = startReplica("replica-2-newer", serviceAccountKubeconfig("virt-rules"), webhookHost2, args)
		Eventually(replicas[1].ready).WithTimeout(2 * time.Minute).Should(Succeed())
		Expect(string(readFile(replicas[1].log))).To(MatchRegexp(`"msg":"starting controller".*"bundleRevision":"install-1"`))
		Expect(string(readFile(replicas[1].log))).To(ContainSubstring(`"msg":"bundle activated","revision":"install-1","source":"configmap virt-rules/virt-rules-bundle-cache"`))
		Expect(k8s.Get(ctx, tlsSecret, after)).To(Succeed())
		Expect(after.Data).To(Equal(before.Data))
	})

	It("hands the Lease over when the leader stops; the other replica answers with the same certificate", func() {
		leader := leaders(replicas)()
		Expect(leader).To(HaveLen(1))
		var survivor *replica
		for _, r := range replicas {
			if r.name == leader[0] {
				r.stop()
			} else {
				survivor = r
			}
		}
		Eventually(leaders(replicas)).WithTimeout(90 * time.Second).Should(Equal([]string{survivor.name}))
		// The Service now leads to the replica left, as its endpoints would to the ready pod.
		svc := &corev1.Service{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: kitNamespace, Name: "virt-rules-webhook"}, svc)).To(Succeed())
		svc.Spec.ExternalName = survivor.host
		Expect(k8s.Update(ctx, svc)).To(Succeed())
		Eventually(func() string {
			err := k8s.Create(ctx, migrationPolicy("install-db-after-handover"), client.DryRunAll)
			if err == nil {
				return "admitted"
			}
			return err.Error()
		}).Should(ContainSubstring(`admission webhook "migrationpolicies.validate.virt-rules.io" denied the request`))
	})

	It("kubectl delete -k removes every webhook configuration before the namespace", func() {
		for _, o := range kit {
			if o.GetKind() == "Namespace" {
				for name, c := range configuration {
					err := k8s.Get(ctx, client.ObjectKey{Name: name}, c)
					Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s still there when the namespace is deleted", name)
				}
			}
			Expect(client.IgnoreNotFound(k8s.Delete(ctx, o.DeepCopy(), client.PropagationPolicy(metav1.DeletePropagationBackground)))).
				To(Succeed(), "delete %s %s", o.GetKind(), o.GetName())
		}
	})
})

// caBundles are the caBundle of every webhook of virt-rules' configurations.
func caBundles() []string {
	var out []string
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if k8s.Get(ctx, client.ObjectKey{Name: "virt-rules-validating"}, v) == nil {
		for _, w := range v.Webhooks {
			out = append(out, string(w.ClientConfig.CABundle))
		}
	}
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if k8s.Get(ctx, client.ObjectKey{Name: "virt-rules-mutating"}, m) == nil {
		for _, w := range m.Webhooks {
			out = append(out, string(w.ClientConfig.CABundle))
		}
	}
	return out
}

func migrationPolicy(name string) *unstructured.Unstructured {
	p := &unstructured.Unstructured{}
	p.SetGroupVersionKind(migrationPolicyGVK)
	p.SetName(name)
	p.Object["spec"] = map[string]any{"selectors": map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": "install-db"}}}
	return p
}

// serviceAccountKubeconfig is a kubeconfig authenticating as ServiceAccount virt-rules/name
// with a token from the TokenRequest API, as the kubelet gives a pod.
func serviceAccountKubeconfig(name string) string {
	GinkgoHelper()
	return serviceAccountKubeconfigIn(kitNamespace, name)
}

// serviceAccountKubeconfigIn is serviceAccountKubeconfig for ServiceAccount namespace/name.
func serviceAccountKubeconfigIn(namespace, name string) string {
	GinkgoHelper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}
	Expect(k8s.SubResource("token").Create(ctx, sa, req)).To(Succeed())
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cluster.Config.Host, CertificateAuthorityData: cluster.Config.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: req.Status.Token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name}
	kc.CurrentContext = "test"
	path := filepath.Join(workDir, "kubeconfig-"+namespace+"-"+name)
	Expect(clientcmd.WriteToFile(*kc, path)).To(Succeed())
	return path
}

// startReplica runs `virt-rules controller` with kitArgs (the kit's container arguments, and
// the admin's), its webhook server on host:443 and its certificate files in a directory of
// its own.
func startReplica(name, kubeconfig, host string, kitArgs []string) *replica {
	GinkgoHelper()
	return startReplicaWithEnv(name, kubeconfig, host, kitArgs, nil)
}

// startReplicaWithEnv is startReplica with env added to the process' environment.
func startReplicaWithEnv(name, kubeconfig, host string, kitArgs, env []string) *replica {
	GinkgoHelper()
	dir := filepath.Join(workDir, name)
	Expect(os.MkdirAll(dir, 0o700)).To(Succeed())
	r := &replica{name: name, host: host, log: filepath.Join(dir, "log"), probes: clustersuite.FreeAddress()}
	logFile, err := os.Create(r.log)
	Expect(err).NotTo(HaveOccurred())
	var args []string
	for _, a := range kitArgs {
		if !strings.HasPrefix(a, "--webhook-cert-dir=") {
			args = append(args, a)
		}
	}
	Expect(args).To(ContainElements("controller", "--webhook-cert-secret=virt-rules/virt-rules-webhook-tls", "--bundle-cache-configmap=virt-rules/virt-rules-bundle-cache"))
	args = append(args, "--kubeconfig", kubeconfig,
		"--webhook-cert-dir", filepath.Join(dir, "webhook-certs"),
		"--webhook-host", host, "--webhook-port=443",
		"--metrics-bind-address=0", "--health-probe-bind-address", r.probes)
	r.cmd = exec.Command(binary, args...)
	r.cmd.Env = append(os.Environ(), env...)
	r.cmd.Stdout, r.cmd.Stderr = logFile, logFile
	Expect(r.cmd.Start()).To(Succeed())
	return r
}

func (r *replica) ready() error {
	resp, err := http.Get("http://" + r.probes + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /readyz: %s; log:\n%s", r.name, resp.Status, tail(r.log))
	}
	return nil
}

func (r *replica) stop() { clustersuite.Stop(r.cmd, 30*time.Second) }

// leaders names the running replicas that acquired the Lease.
func leaders(replicas []*replica) func() []string {
	return func() []string {
		var names []string
		for _, r := range replicas {
			if r.cmd.ProcessState == nil && bytes.Contains(readFile(r.log), []byte("uccessfully acquired lease")) {
				names = append(names, r.name)
			}
		}
		return names
	}
}

func tail(path string) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}
