package integration_test

import (
	"crypto/tls"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/controllers/pool"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// scopedSA is the service account the scoped kit is bound to in these specs: the kit's
// bindings name virt-rules/virt-rules, which other specs bind cluster-wide in this shared
// control plane, so here they name this account instead (and their names get a suffix).
const scopedSA = "virt-rules-scoped"

// serviceAccountToken is a token the API server issues for namespace/name, for audiences (none:
// the API server's own).
func serviceAccountToken(namespace, name string, audiences ...string) string {
	GinkgoHelper()
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, sa))).To(Succeed())
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// impersonatingKubeconfig is a kubeconfig for the control plane as user.
func impersonatingKubeconfig(user string) string {
	GinkgoHelper()
	path := writeKubeconfig()
	kc, err := clientcmd.LoadFromFile(path)
	Expect(err).NotTo(HaveOccurred())
	kc.AuthInfos["admin"].Impersonate = user
	Expect(clientcmd.WriteToFile(*kc, path)).To(Succeed())
	return path
}

// getWithToken is a GET of url with a bearer token ("" for none), trusting any server certificate.
func getWithToken(url, token string) (int, string) {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	Expect(err).NotTo(HaveOccurred())
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	return clustersuite.HTTPDo(c, req)
}

// poolNamespacesComponent is examples/deploy/pool-namespaces as kustomize would apply it on
// examples/deploy's RBAC: its resources added, the objects its patches delete removed, and the
// --pool-namespaces it adds to the controller.
func poolNamespacesComponent() (objs []manifest.Object, namespaces []string) {
	GinkgoHelper()
	dir := filepath.Join(repoRoot, "examples", "deploy", "pool-namespaces")
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	Expect(err).NotTo(HaveOccurred())
	var k struct {
		Kind      string   `json:"kind"`
		Resources []string `json:"resources"`
		Patches   []struct {
			Patch string `json:"patch"`
		} `json:"patches"`
	}
	Expect(yaml.Unmarshal(raw, &k)).To(Succeed())
	Expect(k.Kind).To(Equal("Component"))
	paths := []string{filepath.Join(repoRoot, "examples", "deploy", "base", "rbac.yaml")}
	for _, r := range k.Resources {
		paths = append(paths, filepath.Join(dir, r))
	}
	all, err := manifest.Read(paths, nil)
	Expect(err).NotTo(HaveOccurred())
	deleted := map[string]bool{}
	for _, p := range k.Patches {
		var del struct {
			Patch    string `json:"$patch"`
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if yaml.Unmarshal([]byte(p.Patch), &del) == nil && del.Patch == "delete" {
			deleted[del.Kind+"/"+del.Metadata.Name] = true
		}
		if _, after, ok := strings.Cut(p.Patch, "--pool-namespaces="); ok {
			namespaces = strings.Split(strings.TrimSpace(strings.SplitN(after, "\n", 2)[0]), ",")
		}
	}
	Expect(deleted).To(HaveKey("ClusterRoleBinding/virt-rules-pool"), "the component unbinds the cluster-wide pool rules")
	Expect(namespaces).NotTo(BeEmpty(), "the component sets --pool-namespaces")
	for _, o := range all {
		if !deleted[o.GetKind()+"/"+o.GetName()] {
			objs = append(objs, o)
		}
	}
	return objs, namespaces
}

// bindTo makes the kit's bindings name the service account scopedSA (see there).
func bindTo(o manifest.Object) {
	GinkgoHelper()
	switch o.GetKind() {
	case "ClusterRoleBinding", "RoleBinding":
		o.SetName(o.GetName() + "-scoped-test")
		subjects, _ := o.Object["subjects"].([]any)
		for _, s := range subjects {
			if m, ok := s.(map[string]any); ok && m["kind"] == "ServiceAccount" && m["name"] == "virt-rules" {
				m["name"] = scopedSA
			}
		}
	case "ServiceAccount":
		o.SetName(scopedSA)
	}
}

// allowed is the API server's answer: may user verb resource (group/resource) in namespace?
func allowed(user, verb, group, resource, namespace string) bool {
	GinkgoHelper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               user,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:virt-rules", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: verb, Group: group, Resource: resource},
	}}
	Expect(k8sClient.Create(ctx, sar)).To(Succeed())
	return sar.Status.Allowed
}

var _ = Describe("virt-rules controller with examples/deploy/pool-namespaces, as its service account", Ordered, func() {
	var (
		binary, poolNS, otherNS, metricsAddr string
		namespaces                           []string
	)
	user := "system:serviceaccount:virt-rules:" + scopedSA

	BeforeAll(func(sctx SpecContext) {
		binary = clustersuite.BuildVirtRules(sctx, repoRoot, "")

		var objs []manifest.Object
		objs, namespaces = poolNamespacesComponent()
		for _, name := range append([]string{"virt-rules"}, namespaces...) {
			Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))).To(Succeed())
		}
		for _, o := range objs {
			bindTo(o)
			u := o.Unstructured.DeepCopy()
			if err := k8sClient.Create(ctx, u); apierrors.IsAlreadyExists(err) {
				// The kit's ClusterRoles, created by another spec from the same file.
				continue
			} else {
				Expect(err).NotTo(HaveOccurred(), o.Describe())
			}
			if strings.HasSuffix(u.GetName(), "-scoped-test") {
				DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, u))).To(Succeed()) })
			}
		}
		poolNS, otherNS = namespaces[0], createNamespace()

		metricsAddr = freeAddress()
		cmd := exec.Command(binary, "controller", "--kubeconfig", impersonatingKubeconfig(user), "--leader-elect=false",
			"--pool-namespaces", strings.Join(namespaces, ","),
			"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", freeAddress())
		cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
		startUntilCleanup(cmd, 20*time.Second)
	}, NodeTimeout(5*time.Minute))

	It("may write VMs, VMIs and DataVolumes only in the chosen namespaces", func() {
		for _, r := range []struct{ group, resource string }{{"kubevirt.io", "virtualmachines"}, {"kubevirt.io", "virtualmachineinstances"}, {"cdi.kubevirt.io", "datavolumes"}} {
			for _, ns := range namespaces {
				Expect(allowed(user, "delete", r.group, r.resource, ns)).To(BeTrue(), "delete %s in %s", r.resource, ns)
			}
			Expect(allowed(user, "delete", r.group, r.resource, otherNS)).To(BeFalse(), "delete %s in %s", r.resource, otherNS)
			Expect(allowed(user, "delete", r.group, r.resource, "")).To(BeFalse(), "delete %s cluster-wide", r.resource)
		}
		for _, r := range []struct{ group, resource string }{{"kubevirt.io", "virtualmachines"}, {"cdi.kubevirt.io", "datavolumes"}} {
			Expect(allowed(user, "patch", r.group, r.resource, poolNS)).To(BeTrue())
			Expect(allowed(user, "patch", r.group, r.resource, otherNS)).To(BeFalse(), "patch %s in %s", r.resource, otherNS)
		}
		// The rest of the kit still holds cluster-wide: the node labeller's and the VMI annotations.
		Expect(allowed(user, "patch", "", "nodes", "")).To(BeTrue())
		Expect(allowed(user, "patch", "kubevirt.io", "virtualmachineinstances", otherNS)).To(BeTrue())

		asSA := rest.CopyConfig(cfg)
		asSA.Impersonate = rest.ImpersonationConfig{UserName: user}
		saClient, err := client.New(asSA, client.Options{})
		Expect(err).NotTo(HaveOccurred())
		vm := newUnstructured(pool.GVKVirtualMachine)
		vm.SetNamespace(otherNS)
		vm.SetName("not-the-pools")
		vm.Object["spec"] = map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": minimalVMISpec()}}
		create(vm)
		Expect(apierrors.IsForbidden(saClient.Delete(ctx, vm.DeepCopy()))).To(BeTrue(), "the API server refuses the delete")
	})

	It("runs the pools of a chosen namespace and leaves every other namespace's alone", func() {
		simulateKubeVirt(poolNS, 0)
		create(newPool(poolNS, "scoped", 2, nil))
		Eventually(poolStatus(poolNS, "scoped")).Should(HaveKeyWithValue("readyReplicas", BeEquivalentTo(2)))
		Expect(poolVMs(poolNS, "scoped")(Default)).To(Equal(seq("scoped", 1, 2)))
		scale(poolNS, "scoped", 1)
		Eventually(poolVMs(poolNS, "scoped")).Should(HaveLen(1), "deletes in its namespace")

		simulateKubeVirt(otherNS, 0)
		create(newPool(otherNS, "elsewhere", 1, nil))
		Consistently(poolVMs(otherNS, "elsewhere")).WithTimeout(3 * time.Second).Should(BeEmpty())
	})

	It("serves /metrics over HTTPS to metrics readers only: 401 without a token or with a bad one, 403 for others", func() {
		url := "https://" + metricsAddr + "/metrics"
		Eventually(func() int { code, _ := getWithToken(url, ""); return code }).Should(Equal(http.StatusUnauthorized))
		for _, token := range []string{"not-a-token", "a.b.c", strings.Repeat("x", 4096)} {
			code, body := getWithToken(url, token)
			Expect(code).To(Equal(http.StatusUnauthorized), "token %.20q: %s", token, body)
		}

		ns := createNamespace()
		reader := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader-" + ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "virt-rules-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "prometheus"}},
		}
		create(reader)
		code, body := getWithToken(url, serviceAccountToken(ns, "prometheus"))
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(body).To(ContainSubstring("virtrules_"))

		code, body = getWithToken(url, serviceAccountToken(ns, "someone-else"))
		Expect(code).To(Equal(http.StatusForbidden), body)
		_, body = getWithToken(url, serviceAccountToken(ns, "prometheus"))
		Expect(body).To(MatchRegexp(`virtrules_metrics_denied_requests_total\{reason="unauthenticated"\} [4-9]`))
		Expect(body).To(ContainSubstring(`virtrules_metrics_denied_requests_total{reason="forbidden"} 1`))
		code, _ = getWithToken("http://"+metricsAddr+"/metrics", serviceAccountToken(ns, "prometheus"))
		Expect(code).NotTo(Equal(http.StatusOK), "no plain HTTP")
	})
})
