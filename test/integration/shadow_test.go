package integration_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/open-policy-agent/opa/v1/compile"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/controllers/reports"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// lockedBuffer is a bytes.Buffer a process writes to while a spec reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// kubevirtPrecedenceBundle is the shipped bundle (without tests) with upstream KubeVirt's
// MigrationPolicy precedence, built by OPA's `opa build` code with revision rev: on design
// 000's example it picks hpc-large where the shipped bundle picks tuned-bandwidth.
func kubevirtPrecedenceBundle(rev string) []byte {
	GinkgoHelper()
	dir := clustersuite.ShippedBundleDir()
	settings := filepath.Join(dir, "virtrules", "migration", "policy", "data.json")
	data, err := os.ReadFile(settings)
	Expect(err).NotTo(HaveOccurred())
	changed := strings.Replace(string(data), `"precedence": "default"`, `"precedence": "kubevirt"`, 1)
	Expect(changed).NotTo(Equal(string(data)), "the shipped settings name the default precedence")
	Expect(os.WriteFile(settings, []byte(changed), 0o644)).To(Succeed())
	var out bytes.Buffer
	Expect(compile.New().WithPaths(dir).WithAsBundle(true).WithRevision(rev).WithOutput(&out).Build(ctx)).To(Succeed())
	return out.Bytes()
}

var _ = Describe("virt-rules controller --candidate-bundle-url (shadow rollout) and the candidates endpoint", Ordered, func() {
	var (
		binary, kubeconfig, prefix, hpc, metricsAddr string
		server                                       *httptest.Server
		bundles                                      servedBundle
		decisionLog                                  lockedBuffer
		metricsToken                                 string
	)
	fedoraGPU := func() string { return prefix + "fedora-gpu" }

	BeforeAll(func(sctx SpecContext) {
		binary = clustersuite.BuildVirtRules(sctx, repoRoot, "")
		kubeconfig = writeKubeconfig()

		// The reports spec needs the OpenReports CRDs absent when it starts: install them for
		// this container only.
		served, err := openReportsServed()
		Expect(err).NotTo(HaveOccurred())
		if !served {
			_, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: openReportsCRDs(), ErrorIfPathMissing: true})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() {
				uninstallOpenReportsCRDs()
			})
		}

		// Design 000's example, renamed with a prefix of this run (policies are cluster-scoped,
		// and judged together: other specs' copies of the same policies would tie with these,
		// so start from none).
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(schema.GroupVersionKind{Group: "migrations.kubevirt.io", Version: "v1alpha1", Kind: "MigrationPolicy"}))).To(Succeed())
		prefix = "shadow-" + rand.String(5) + "-"
		designPolicies(prefix)
		hpc = prefix + "hpc"
		node(prefix+"node-1", nil)
		node(prefix+"node-2", nil)
		// fedora-gpu as design 000 has it, running on node-1.
		create(fromYAML(fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: %s, namespace: %s, labels: {size: small, os: fedora, gpu: nvidia}}
spec: {domain: {resources: {requests: {cpu: '1', memory: 2Gi}}, devices: {}}}
status: {nodeName: %snode-1}
`, fedoraGPU(), hpc, prefix)))

		candidate := kubevirtPrecedenceBundle("candidate-1")
		bundles.serve(candidate)
		server = httptest.NewServer(&bundles)
		DeferCleanup(server.Close)

		// A metrics reader's token: /metrics is served over HTTPS to callers the API server
		// vouches for.
		reader := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: prefix + "metrics"},
			Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, NonResourceURLs: []string{"/metrics"}}},
		}
		create(reader)
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: prefix + "metrics"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: reader.Name},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: hpc, Name: "prometheus"}},
		}
		create(binding)
		DeferCleanup(func() {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, binding))).To(Succeed())
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, reader))).To(Succeed())
		})
		metricsToken = serviceAccountToken(hpc, "prometheus")

		metricsAddr = freeAddress()
		cmd := exec.Command(binary, "controller", "--kubeconfig", kubeconfig, "--leader-elect=false",
			"--candidate-bundle-url", server.URL+"/candidate.tar.gz", "--bundle-allow-http", "--bundle-poll-interval", "1s",
			"--decision-log", "stdout",
			"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", freeAddress())
		cmd.Stdout, cmd.Stderr = &decisionLog, GinkgoWriter
		startUntilCleanup(cmd, 20*time.Second)
	}, NodeTimeout(5*time.Minute))

	It("acts on the active bundle only, and counts, logs and reports where the candidate decides otherwise", func() {
		key := vmiKey(hpc, fedoraGPU())
		Eventually(policyOf(key)).WithTimeout(time.Minute).Should(Equal(prefix + "tuned-bandwidth"))

		metrics := func() string { _, body := getWithToken("https://"+metricsAddr+"/metrics", metricsToken); return body }
		Eventually(metrics).Should(MatchRegexp(`virtrules_candidate_decision_differences_total\{decision="migrationPolicies"\} [1-9]`))
		Expect(metrics()).To(MatchRegexp(`virtrules_candidate_decision_comparisons_total\{decision="migrationPolicies",result="different"\} [1-9]`))

		// The decision log has the difference, with both sides and both revisions.
		var event struct {
			Result struct {
				Object string `json:"object"`
				Active struct {
					Result struct {
						Policy string `json:"policy"`
					} `json:"result"`
				} `json:"active"`
				Candidate struct {
					Revision string `json:"revision"`
					Result   struct {
						Policy string `json:"policy"`
					} `json:"result"`
				} `json:"candidate"`
			} `json:"result"`
		}
		Eventually(func(g Gomega) {
			found := false
			for _, line := range strings.Split(decisionLog.String(), "\n") {
				if strings.Contains(line, `"decision":"candidate.migrationPolicies"`) && strings.Contains(line, fedoraGPU()) {
					g.Expect(json.Unmarshal([]byte(line), &event)).To(Succeed())
					found = true
				}
			}
			g.Expect(found).To(BeTrue(), "a candidate.migrationPolicies event for %s", fedoraGPU())
		}).Should(Succeed())
		Expect(event.Result.Object).To(Equal(hpc + "/" + fedoraGPU()))
		Expect(event.Result.Active.Result.Policy).To(Equal(prefix + "tuned-bandwidth"))
		Expect(event.Result.Candidate.Result.Policy).To(Equal(prefix + "hpc-large"))
		Expect(event.Result.Candidate.Revision).To(Equal("candidate-1"))

		// The namespace's Report has a warning naming the VMI and both revisions.
		Eventually(func(g Gomega) {
			r, _ := storedReport(g, hpc, false)
			var found bool
			for _, res := range r.Results {
				if res.Policy == reports.PolicyCandidateBundle && res.Rule == "migrationPolicies" {
					g.Expect(string(res.Result)).To(Equal("warn"))
					g.Expect(res.Subjects).To(HaveLen(1))
					g.Expect(res.Subjects[0].Name).To(Equal(fedoraGPU()))
					g.Expect(res.Properties).To(HaveKeyWithValue("candidateRevision", "candidate-1"))
					g.Expect(res.Properties).To(HaveKeyWithValue("fields", ContainSubstring("policy")))
					g.Expect(res.Description).To(ContainSubstring(prefix + "hpc-large"))
					found = true
				}
			}
			g.Expect(found).To(BeTrue(), "a candidate-bundle result in %v", r.Results)
		}).WithTimeout(time.Minute).Should(Succeed())

		// Never acted on: the VMI keeps the active bundle's policy.
		Consistently(policyOf(key)).WithTimeout(3 * time.Second).Should(Equal(prefix + "tuned-bandwidth"))
	})

	It("serves where a VMI could migrate, as eval --candidates decides it, to callers allowed to get the VMI", func() {
		url := func(ns, name string) string {
			return fmt.Sprintf("https://%s/apis/virt-rules.io/v1alpha1/namespaces/%s/virtualmachineinstances/%s/candidates", metricsAddr, ns, name)
		}
		Eventually(func() int { code, _ := getWithToken(url(hpc, fedoraGPU()), ""); return code }).Should(Equal(http.StatusUnauthorized))
		viewer := serviceAccountToken(hpc, "viewer")
		code, body := getWithToken(url(hpc, fedoraGPU()), viewer)
		Expect(code).To(Equal(http.StatusForbidden), body)
		Expect(body).To(ContainSubstring("virtualmachineinstances.kubevirt.io " + fedoraGPU() + " in namespace " + hpc))

		role := &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: hpc, Name: "vmi-viewer"},
			Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachineinstances"}}},
		}
		create(role)
		create(&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: hpc, Name: "vmi-viewer"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: hpc, Name: "viewer"}},
		})
		// Denials are cached for 30 s; a new account's token is a new caller.
		viewer = serviceAccountToken(hpc, "viewer")
		var got string
		Eventually(func(g Gomega) {
			code, body := getWithToken(url(hpc, fedoraGPU()), viewer)
			g.Expect(code).To(Equal(http.StatusOK), body)
			got = body
		}).WithTimeout(45 * time.Second).Should(Succeed())

		cmd := exec.CommandContext(ctx, binary, "eval", "--kubeconfig", kubeconfig, "--candidates")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		// Exit 1 means some other object of the shared cluster is in error (a
		// spec's deliberately broken policy, a migration of a VMI another spec
		// deleted); the report is still complete for the rest.
		if err := cmd.Run(); err != nil {
			var exit *exec.ExitError
			Expect(errors.As(err, &exit) && exit.ExitCode() == 1).To(BeTrue(), "eval --kubeconfig: %v\n%s", err, stderr.String())
		}
		var report struct {
			MigrationCandidates []json.RawMessage `json:"migrationCandidates"`
			Errors              []struct {
				Kind, Namespace, Name, Message string
			} `json:"errors"`
		}
		Expect(json.Unmarshal(stdout.Bytes(), &report)).To(Succeed())
		for _, e := range report.Errors {
			AddReportEntry("eval --kubeconfig error on another object", fmt.Sprintf("%s %s/%s: %s", e.Kind, e.Namespace, e.Name, e.Message))
			Expect(e.Namespace+"/"+e.Name).NotTo(Equal(hpc+"/"+fedoraGPU()), "the VMI asked about is decided")
		}
		var want json.RawMessage
		for _, c := range report.MigrationCandidates {
			var entry struct{ VMI string }
			Expect(json.Unmarshal(c, &entry)).To(Succeed())
			if entry.VMI == hpc+"/"+fedoraGPU() {
				want = c
			}
		}
		Expect(want).NotTo(BeNil(), "eval --candidates decides %s/%s", hpc, fedoraGPU())
		Expect(got).To(MatchJSON(want))
		Expect(got).To(ContainSubstring(`"` + prefix + `node-2"`))

		code, body = getWithToken(url(hpc, "gone"), viewer)
		Expect(code).To(Equal(http.StatusNotFound), body)
		Expect(body).To(ContainSubstring(hpc + "/gone"))

		m := &unstructured.Unstructured{}
		m.SetGroupVersionKind(schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachineInstanceMigration"})
		m.SetNamespace(hpc)
		m.SetName("moving")
		Expect(unstructured.SetNestedField(m.Object, fedoraGPU(), "spec", "vmiName")).To(Succeed())
		create(m)
		Eventually(func(g Gomega) {
			code, body := getWithToken(url(hpc, fedoraGPU()), viewer)
			g.Expect(code).To(Equal(http.StatusConflict), body)
			g.Expect(body).To(ContainSubstring("VirtualMachineInstanceMigration " + hpc + "/moving"))
		}).Should(Succeed())
	})
})
