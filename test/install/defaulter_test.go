//go:build libvirt

package install_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

const (
	// defaultsWebhookHost is where this Describe's replica serves the webhooks (the other
	// Describes' replicas use webhookHost and webhookHost2).
	defaultsWebhookHost = "127.0.0.5"
	// defaulterService is the host and port --defaulter-url names.
	defaulterService  = "virt-rules-defaulter.virt-rules.svc:8090"
	defaultsNamespace = "install-defaults"
)

var defaulterSecret = client.ObjectKey{Namespace: kitNamespace, Name: "virt-rules-defaulter-tls"}

var _ = Describe("kubectl apply -k examples/deploy/defaults: the controller issues the defaulter's certificate", Ordered, func() {
	var (
		kit       []*unstructured.Unstructured
		ctrl      *replica
		defaulter *exec.Cmd
		// defaulterAddr is where the defaulter listens; network dials it for the Service.
		defaulterAddr string
		// volume is the defaulter's Secret volume, as the kubelet keeps it.
		volume  string
		kubelet *secretVolume
		network *serviceNetwork
		caPEM   []byte
		first   []byte // the first certificate the defaulter served (DER)
	)

	BeforeAll(func(sctx SpecContext) {
		startCluster(sctx)
		// The other Describes install the kit into the same namespace and delete it at their end.
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: kitNamespace}, &corev1.Namespace{}))
		}).WithTimeout(3*time.Minute).Should(BeTrue(), "namespace %s still there", kitNamespace)
	}, NodeTimeout(30*time.Minute))
	AfterAll(func() {
		if kubelet != nil {
			kubelet.stop()
		}
		if ctrl != nil {
			ctrl.stop()
		}
		if defaulter != nil {
			clustersuite.Stop(defaulter, 30*time.Second)
		}
		if network != nil {
			network.close()
		}
	})

	It("renders the defaulter's Secret empty, mounted optional without the CA's key, and the controller told to issue it and allowed to write it", func() {
		kit = render("examples/deploy/defaults")
		Expect(find(kit, "Secret", "virt-rules-defaulter-tls").Object).NotTo(HaveKey("data"), "the kit must never carry the controller's certificate")
		args := kitArgs(kit)
		Expect(args).To(ContainElements("--defaulter-cert-secret=virt-rules/virt-rules-defaulter-tls", "--defaulter-service=virt-rules/virt-rules-defaulter",
			"--defaulter-url=https://"+defaulterService))
		Expect(strings.Join(args, " ")).NotTo(ContainSubstring("--defaulter-ca-file"))
		volumes, _, err := unstructured.NestedSlice(find(kit, "Deployment", "virt-rules-defaulter").Object, "spec", "template", "spec", "volumes")
		Expect(err).NotTo(HaveOccurred())
		Expect(volumes).To(ContainElement(HaveKeyWithValue("secret", map[string]any{
			"secretName": "virt-rules-defaulter-tls", "optional": true,
			"items": []any{map[string]any{"key": "tls.crt", "path": "tls.crt"}, map[string]any{"key": "tls.key", "path": "tls.key"}},
		})))
		rules, _, err := unstructured.NestedSlice(find(kit, "Role", "virt-rules-leader-election").Object, "rules")
		Expect(err).NotTo(HaveOccurred())
		Expect(rules).To(ContainElement(map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"},
			"resourceNames": []any{"virt-rules-webhook-tls", "virt-rules-defaulter-tls"}, "verbs": []any{"update"}}))
	})

	It("applies with no Secret made by the test; a defaulter started before its certificate exists serves a placeholder and waits, not ready", func(sctx SpecContext) {
		svc := find(kit, "Service", "virt-rules-webhook")
		Expect(unstructured.SetNestedField(svc.Object, "ExternalName", "spec", "type")).To(Succeed())
		Expect(unstructured.SetNestedField(svc.Object, defaultsWebhookHost, "spec", "externalName")).To(Succeed())
		unstructured.RemoveNestedField(svc.Object, "spec", "selector")
		applyAll(kit)
		secret := &corev1.Secret{}
		Expect(k8s.Get(ctx, defaulterSecret, secret)).To(Succeed())
		Expect(secret.Data).To(BeEmpty())

		By("building the defaulter with libvirt")
		libvirtBinary := filepath.Join(workDir, "virt-rules-libvirt")
		build := exec.CommandContext(sctx, "go", "build", "-tags", "libvirt", "-o", libvirtBinary, "./cmd/virt-rules")
		build.Dir = repoRoot
		build.Stdout, build.Stderr = GinkgoWriter, GinkgoWriter
		Expect(build.Run()).To(Succeed())

		By("starting it with the kit's arguments, its Secret volume still empty")
		volume = filepath.Join(workDir, "defaulter-tls")
		Expect(os.MkdirAll(volume, 0o755)).To(Succeed())
		root, err := os.MkdirTemp("/dev/shm", "virt-rules-install-defaulter-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(os.RemoveAll, root)
		defaulterAddr = clustersuite.FreeAddress()
		args := defaulterArgs(kit, map[string]string{
			"--listen=":               defaulterAddr,
			"--libvirt-root=":         root,
			"--tls-cert-file=":        filepath.Join(volume, "tls.crt"),
			"--tls-private-key-file=": filepath.Join(volume, "tls.key"),
		})
		defaulter = exec.Command(libvirtBinary, append(args, "--kubeconfig", serviceAccountKubeconfig("virt-rules-defaulter"))...)
		logFile, err := os.Create(filepath.Join(workDir, "defaulter.log"))
		Expect(err).NotTo(HaveOccurred())
		defaulter.Stdout, defaulter.Stderr = logFile, logFile
		Expect(defaulter.Start()).To(Succeed())

		Eventually(defaulterProbe).WithArguments(defaulterAddr, "/readyz").WithTimeout(3 * time.Minute).
			Should(HavePrefix("503 no serving certificate yet in --tls-cert-file " + filepath.Join(volume, "tls.crt")))
		Expect(defaulterProbe(defaulterAddr, "/healthz")).To(Equal("200 ok\n"))
		Consistently(func() *os.ProcessState { return defaulter.ProcessState }).WithTimeout(3*time.Second).Should(BeNil(), "the defaulter waits, it does not exit")
		Expect(string(readFile(filepath.Join(workDir, "defaulter.log")))).To(ContainSubstring("no serving certificate yet: serving a placeholder"))
	}, SpecTimeout(10*time.Minute))

	It("fills the Secret from the controller, run as the kit's service account; the defaulter serves it once the kubelet writes the files, checked with the Secret's CA", func() {
		network = startServiceNetwork(map[string]string{defaulterService: defaulterAddr})
		tokenFile := filepath.Join(workDir, "defaulter-token")
		Expect(os.WriteFile(tokenFile, []byte(audienceToken("virt-rules", "virt-rules-defaulter")), 0o600)).To(Succeed())
		var args []string
		for _, a := range kitArgs(kit) {
			if strings.HasPrefix(a, "--defaulter-token-file=") {
				a = "--defaulter-token-file=" + tokenFile
			}
			args = append(args, a)
		}
		// Renewed a minute after it is issued, so that the next spec sees a rotation.
		args = append(args, "--defaulter-cert-validity=4m", "--defaulter-cert-renew-before=3m", "--defaulter-cert-check-interval=5s")
		// The test cluster has neither cluster DNS nor kube-proxy: the controller reaches the
		// defaulter's Service name through a CONNECT proxy that plays both (TLS stays end to
		// end: the controller checks the certificate for the Service's name).
		ctrl = startReplicaWithEnv("defaults-replica", serviceAccountKubeconfig("virt-rules"), defaultsWebhookHost, args, []string{"HTTPS_PROXY=" + network.url()})

		secret := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, defaulterSecret, secret)).To(Succeed())
			g.Expect(secret.Data).To(HaveKey("tls.crt"))
			g.Expect(secret.Data).To(HaveKey("tls.key"))
			g.Expect(secret.Data).To(HaveKey("ca.crt"))
		}).Should(Succeed())
		caPEM = secret.Data["ca.crt"]
		Eventually(ctrl.ready).WithTimeout(2 * time.Minute).Should(Succeed())

		kubelet = keepSecretVolume(defaulterSecret, volume, "tls.crt", "tls.key")
		Eventually(defaulterProbe).WithArguments(defaulterAddr, "/readyz").WithTimeout(3 * time.Minute).Should(Equal("200 ok\n"))
		var err error
		first, err = servedCertificate(defaulterAddr, caPEM)
		Expect(err).NotTo(HaveOccurred(), "the defaulter's certificate checked with the CA of the Secret, for the Service's name")
	})

	It("defaults a VM created through the API server: the controller calls the defaulter through its Service, over TLS checked with the Secret's CA", func() {
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: defaultsNamespace}}))).To(Succeed())
		connects := network.connects.Load()
		Expect(createdVMMAC()).To(MatchRegexp(`^02(:[0-9a-f]{2}){5}$`), "defaulted")
		Expect(network.connects.Load()).To(BeNumerically(">", connects), "the call went to the Service's name")
	})

	It("rotates: the defaulter serves the renewed certificate from the updated files, and the controller still trusts it", func() {
		secret := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, defaulterSecret, secret)).To(Succeed())
			g.Expect(derOf(secret.Data["tls.crt"])).NotTo(Equal(first))
		}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Succeed(), "renewed by the controller")
		Expect(secret.Data["ca.crt"]).To(Equal(caPEM), "the CA is valid for years: only the serving certificate is renewed")
		Eventually(func() ([]byte, error) { return servedCertificate(defaulterAddr, caPEM) }).WithTimeout(time.Minute).
			ShouldNot(Equal(first), "the defaulter serves the renewed certificate")
		network.reset()
		connects := network.connects.Load()
		Expect(createdVMMAC()).To(MatchRegexp(`^02(:[0-9a-f]{2}){5}$`), "defaulted")
		Expect(network.connects.Load()).To(BeNumerically(">", connects), "a new connection, the renewed certificate checked")
	})

	It("refuses a defaulter that serves a certificate of another CA: the VM is admitted undefaulted (failurePolicy Ignore) and the controller logs why", func() {
		kubelet.stop()
		certPEM, keyPEM := clustersuite.CertificateOfAnotherCA("virt-rules-defaulter.virt-rules.svc", "virt-rules-defaulter.virt-rules.svc")
		writeVolume(volume, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM})
		Eventually(func() ([]byte, error) { return servedCertificate(defaulterAddr, nil) }).WithTimeout(time.Minute).Should(Equal(derOf(certPEM)))
		_, err := servedCertificate(defaulterAddr, caPEM)
		Expect(err).To(HaveOccurred())
		network.reset() // the controller's next call makes a new handshake

		Expect(createdVMMAC()).To(BeEmpty(), "admitted as sent, undefaulted")
		Eventually(func() string { return string(readFile(ctrl.log)) }).Should(
			MatchRegexp(`"msg":"defaults not given: the webhook's failure policy decides".*x509: certificate signed by unknown authority`))
	})

	It("kubectl delete -k removes it all, every webhook configuration first", func() {
		for _, o := range kit {
			Expect(client.IgnoreNotFound(k8s.Delete(ctx, o.DeepCopy(), client.PropagationPolicy(metav1.DeletePropagationBackground)))).
				To(Succeed(), "delete %s %s", o.GetKind(), o.GetName())
		}
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: defaultsNamespace}}))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: kitNamespace}, &corev1.Namespace{}))
		}).WithTimeout(3 * time.Minute).Should(BeTrue())
	})
})

// defaulterArgs are the arguments of the kit's defaulter container, those starting with a key
// of replace given its value instead.
func defaulterArgs(kit []*unstructured.Unstructured, replace map[string]string) []string {
	GinkgoHelper()
	containers, _, err := unstructured.NestedSlice(find(kit, "Deployment", "virt-rules-defaulter").Object, "spec", "template", "spec", "containers")
	Expect(err).NotTo(HaveOccurred())
	var out []string
	replaced := 0
	for _, a := range toStrings(containers[0].(map[string]any)["args"]) {
		for prefix, v := range replace {
			if strings.HasPrefix(a, prefix) {
				a = prefix + v
				replaced++
			}
		}
		out = append(out, a)
	}
	Expect(replaced).To(Equal(len(replace)), "the kit's defaulter arguments: %v", out)
	return out
}

// audienceToken is a token of ServiceAccount virt-rules/name for audience, as the kubelet
// projects it.
func audienceToken(name, audience string) string {
	GinkgoHelper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: kitNamespace, Name: name}}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To(int64(3600))}}
	Expect(k8s.SubResource("token").Create(ctx, sa, req)).To(Succeed())
	return req.Status.Token
}

// defaulterProbe is the status and body of path as the kubelet probes HTTPS: without checking
// the certificate.
func defaulterProbe(addr, path string) string {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the kubelet's probe
	resp, err := c.Get("https://" + addr + path)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, body)
}

// servedCertificate is the certificate the server at addr presents (DER), checked for the
// defaulter Service's name against caPEM, or not checked when caPEM is nil.
func servedCertificate(addr string, caPEM []byte) ([]byte, error) {
	cfg := &tls.Config{ServerName: strings.Split(defaulterService, ":")[0]}
	if caPEM == nil {
		cfg.InsecureSkipVerify = true //nolint:gosec // to read what is served
	} else {
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("no CA in %q", caPEM)
		}
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Raw, nil
}

func derOf(certPEM []byte) []byte {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return nil
	}
	return block.Bytes
}

// createdVMMAC creates examples/defaults/vm.yaml in defaultsNamespace (a dry run: the mutating
// webhooks run, nothing is stored) and returns its first interface's MAC address as admitted.
func createdVMMAC() string {
	GinkgoHelper()
	vm := clustersuite.FromYAML(string(readFile(filepath.Join(repoRoot, "examples", "defaults", "vm.yaml"))))
	vm.SetNamespace(defaultsNamespace)
	Expect(k8s.Create(ctx, vm, client.DryRunAll)).To(Succeed())
	interfaces, _, err := unstructured.NestedSlice(vm.Object, "spec", "template", "spec", "domain", "devices", "interfaces")
	Expect(err).NotTo(HaveOccurred())
	Expect(interfaces).NotTo(BeEmpty())
	mac, _, _ := unstructured.NestedString(interfaces[0].(map[string]any), "macAddress")
	return mac
}

// secretVolume plays the kubelet for a Secret volume with items: it keeps dir holding the
// Secret's keys, updated as the Secret changes, the way the kubelet writes them (all files
// replaced at once by swapping the ..data link).
type secretVolume struct {
	done chan struct{}
	wg   sync.WaitGroup
}

func keepSecretVolume(key client.ObjectKey, dir string, items ...string) *secretVolume {
	v := &secretVolume{done: make(chan struct{})}
	v.wg.Add(1)
	go func() {
		defer GinkgoRecover()
		defer v.wg.Done()
		var last map[string][]byte
		for {
			s := &corev1.Secret{}
			if err := k8s.Get(ctx, key, s); err == nil {
				files := map[string][]byte{}
				for _, item := range items {
					if data, ok := s.Data[item]; ok {
						files[item] = data
					}
				}
				if len(files) > 0 && fmt.Sprint(files) != fmt.Sprint(last) {
					writeVolume(dir, files)
					last = files
				}
			}
			select {
			case <-v.done:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return v
}

func (v *secretVolume) stop() {
	select {
	case <-v.done:
	default:
		close(v.done)
	}
	v.wg.Wait()
}

// writeVolume writes files into dir as the kubelet's atomic writer does: a new timestamped
// directory, the ..data link swapped to it by a rename, each file a link through ..data.
func writeVolume(dir string, files map[string][]byte) {
	GinkgoHelper()
	ts, err := os.MkdirTemp(dir, "..ts-")
	Expect(err).NotTo(HaveOccurred())
	for name, data := range files {
		Expect(os.WriteFile(filepath.Join(ts, name), data, 0o600)).To(Succeed())
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	Expect(os.Symlink(filepath.Base(ts), tmp)).To(Succeed())
	Expect(os.Rename(tmp, filepath.Join(dir, "..data"))).To(Succeed())
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			Expect(os.Symlink(filepath.Join("..data", name), link)).To(Succeed())
		}
	}
	if old != "" {
		Expect(os.RemoveAll(filepath.Join(dir, old))).To(Succeed())
	}
}

// serviceNetwork is an HTTP CONNECT proxy that plays cluster DNS and kube-proxy: a CONNECT to
// a Service's host:port is tunnelled to the address serving it; any other is refused.
type serviceNetwork struct {
	ln       net.Listener
	services map[string]string
	connects atomic.Int64
	mu       sync.Mutex
	open     map[net.Conn]struct{}
}

func startServiceNetwork(services map[string]string) *serviceNetwork {
	GinkgoHelper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	n := &serviceNetwork{ln: ln, services: services, open: map[net.Conn]struct{}{}}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go n.tunnel(conn)
		}
	}()
	return n
}

func (n *serviceNetwork) url() string { return "http://" + n.ln.Addr().String() }

func (n *serviceNetwork) close() {
	_ = n.ln.Close()
	n.reset()
}

// reset drops every tunnel, as a connection through a Service is when its pod goes: the next
// call makes a new TLS handshake.
func (n *serviceNetwork) reset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for c := range n.open {
		_ = c.Close()
	}
}

func (n *serviceNetwork) track(c net.Conn, open bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if open {
		n.open[c] = struct{}{}
	} else {
		delete(n.open, c)
	}
}

func (n *serviceNetwork) tunnel(conn net.Conn) {
	n.track(conn, true)
	defer n.track(conn, false)
	defer conn.Close()
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	target, ok := n.services[req.Host]
	if req.Method != http.MethodConnect || !ok {
		_, _ = io.WriteString(conn, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
		return
	}
	backend, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		_, _ = io.WriteString(conn, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer backend.Close()
	n.connects.Add(1)
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Whatever the client sent after the request is in br's buffer.
	if buffered := br.Buffered(); buffered > 0 {
		head, _ := br.Peek(buffered)
		if _, err := backend.Write(bytes.Clone(head)); err != nil {
			return
		}
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(backend, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, backend); done <- struct{}{} }()
	<-done
}
