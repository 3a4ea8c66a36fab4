package integration_test

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/open-policy-agent/opa/v1/compile"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	krand "k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/bundlestatus"
	"github.com/virt-rules/virt-rules/internal/decisionlog"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/internal/shadow"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// candidateEvent is a candidate.<decision> decision-log event, as far as the specs read it.
type candidateEvent struct {
	Result struct {
		Object    string   `json:"object"`
		Fields    []string `json:"fields"`
		Active    side     `json:"active"`
		Candidate side     `json:"candidate"`
	} `json:"result"`
}

type side struct {
	Revision string         `json:"revision"`
	Result   map[string]any `json:"result"`
}

// candidateEventOf is the last candidate.<decision> event about object in log.
func candidateEventOf(g Gomega, log *lockedBuffer, decision, object string) candidateEvent {
	var ev candidateEvent
	found := false
	for _, line := range strings.Split(log.String(), "\n") {
		if !strings.Contains(line, `"candidate.`+decision+`"`) {
			continue
		}
		var e candidateEvent
		g.Expect(json.Unmarshal([]byte(line), &e)).To(Succeed())
		if e.Result.Object == object {
			ev, found = e, true
		}
	}
	g.Expect(found).To(BeTrue(), "a candidate.%s event for %s in %s", decision, object, log.String())
	return ev
}

var _ = Describe("shadow rollout of the webhooks' answers (in process, real API server calling the webhooks)", Ordered, func() {
	var (
		reg         *prometheus.Registry
		decisionLog lockedBuffer
		prefix      string
		candidate   *engine.Engine
	)
	differences := func(decision string) func() float64 {
		return func() float64 {
			return metric(reg, "virtrules_candidate_decision_differences_total", map[string]string{"decision": decision})
		}
	}
	// affinityDiffers waits until the bundles' answers for decision on object differed, in
	// nodeAffinity alone, and the logged answers, printed, match active and candidate.
	affinityDiffers := func(decision, object string, active, candidate OmegaMatcher) {
		GinkgoHelper()
		Eventually(differences(decision)).Should(BeNumerically(">=", 1))
		Eventually(func(g Gomega) {
			ev := candidateEventOf(g, &decisionLog, decision, object)
			g.Expect(ev.Result.Fields).To(Equal([]string{"nodeAffinity"}))
			g.Expect(fmt.Sprint(ev.Result.Active.Result)).To(active)
			g.Expect(fmt.Sprint(ev.Result.Candidate.Result)).To(candidate)
		}).Should(Succeed())
	}

	BeforeAll(func(sctx SpecContext) {
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		DeferCleanup(func() {
			Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		})
		prefix = "shadow-wh-" + krand.String(5) + "-"
		tarball := filepath.Join(GinkgoT().TempDir(), "candidate.tar.gz")
		Expect(os.WriteFile(tarball, webhooksCandidateBundle("candidate-webhooks"), 0o644)).To(Succeed())
		active, err := engine.New(sctx)
		Expect(err).NotTo(HaveOccurred())
		candidate, err = engine.New(sctx, engine.WithBundlePath(tarball))
		Expect(err).NotTo(HaveOccurred())
		reg = prometheus.NewRegistry()
		s, err := shadow.New(active, candidate, shadow.Options{Registerer: reg, DecisionLog: decisionlog.NewWriter(&decisionLog, nil),
			Log: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
		Expect(err).NotTo(HaveOccurred())

		// Nodes for the migration (before the node labeller runs: node writes them twice).
		labels := map[string]string{"kubevirt.io/schedulable": "true", "host-model-cpu.node.kubevirt.io/Skylake": "true",
			"cpu-model-migration.node.kubevirt.io/Skylake": "true"}
		node(prefix+"node-1", labels)
		node(prefix+"node-2", labels)

		webhooks := &envtest.WebhookInstallOptions{Paths: []string{filepath.Join(repoRoot, "examples", "deploy", "webhooks")}}
		Expect(webhooks.Install(cfg)).To(Succeed())
		vr, err := testcluster.RunVirtRules(ctx, cfg, active, testcluster.VirtRulesOptions{
			Controllers: controllers.Options{ConcurrentSyncs: 2, Shadow: s}, Webhooks: webhooks,
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			Expect(vr.Stop()).To(Succeed())
			for _, c := range webhooks.ValidatingWebhooks {
				Expect(k8sClient.Delete(ctx, c.DeepCopy())).To(Succeed())
			}
			for _, c := range webhooks.MutatingWebhooks {
				Expect(k8sClient.Delete(ctx, c.DeepCopy())).To(Succeed())
			}
			Expect(webhooks.Cleanup()).To(Succeed())
		})
	}, NodeTimeout(3*time.Minute))

	It("compares a MigrationPolicy admission: the active bundle's refusal stands, the candidate's admission is counted and logged", func() {
		first := prefix + "db"
		Expect(k8sClient.Create(ctx, policyObject(first, map[string]any{"app": prefix + "db"}, nil))).To(Succeed())
		DeferCleanup(func() {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, policyObject(first, nil, nil)))).To(Succeed())
		})

		// The shipped bundle refuses a second policy with the same selectors; KubeVirt's
		// precedence, the candidate's, admits it as KubeVirt does.
		second := prefix + "db-again"
		err := k8sClient.Create(ctx, policyObject(second, map[string]any{"app": prefix + "db"}, nil))
		Expect(err).To(MatchError(ContainSubstring(`same selectors as MigrationPolicy "` + first + `"`)))

		decision := shadow.DecisionMigrationPolicyValidation
		Eventually(differences(decision)).Should(BeNumerically(">=", 1))
		Eventually(func(g Gomega) {
			ev := candidateEventOf(g, &decisionLog, decision, second)
			g.Expect(ev.Result.Fields).To(ConsistOf("allowed", "violations"))
			g.Expect(ev.Result.Active.Result).To(HaveKeyWithValue("allowed", false))
			g.Expect(ev.Result.Candidate.Result).To(HaveKeyWithValue("allowed", true))
			g.Expect(ev.Result.Candidate.Revision).To(Equal("candidate-webhooks"))
		}).Should(Succeed())
		// Never acted on: the policy the candidate admits does not exist.
		Consistently(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, keyOf(second), newUnstructured(migrationpolicy.GVKMigrationPolicy)))
		}).WithTimeout(2 * time.Second).Should(BeTrue())
	})

	It("compares the migration state a VMI's migration gets: the active bundle's policy is written, the candidate's logged", func() {
		// Design 000's policies and fedora-gpu: the shipped bundle picks tuned-bandwidth,
		// KubeVirt's precedence hpc-large.
		hpc := prefix + "hpc"
		designPolicies(prefix)
		vmi := fromYAML(fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: fedora-gpu, namespace: %s, labels: {size: small, os: fedora, gpu: nvidia}}
spec: {domain: {devices: {}}}
`, hpc))
		create(vmi)
		// What KubeVirt's migration controller writes when a migration starts.
		Expect(k8sClient.Patch(ctx, vmi, client.RawPatch(types.MergePatchType,
			[]byte(`{"status":{"migrationState":{"sourceNode":"node-1","targetNode":"node-2"}}}`)))).To(Succeed())
		got := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
		Expect(k8sClient.Get(ctx, vmiKey(hpc, "fedora-gpu"), got)).To(Succeed())
		state, _, _ := unstructured.NestedMap(got.Object, "status", "migrationState")
		Expect(state).To(HaveKeyWithValue("migrationPolicyName", prefix+"tuned-bandwidth"))

		decision := shadow.DecisionMigrationState
		Eventually(differences(decision)).Should(BeNumerically(">=", 1))
		Eventually(func(g Gomega) {
			ev := candidateEventOf(g, &decisionLog, decision, hpc+"/fedora-gpu")
			g.Expect(ev.Result.Fields).To(ContainElement("policy"))
			g.Expect(ev.Result.Active.Result).To(HaveKeyWithValue("policy", prefix+"tuned-bandwidth"))
			g.Expect(ev.Result.Candidate.Result).To(HaveKeyWithValue("policy", prefix+"hpc-large"))
		}).Should(Succeed())
		Consistently(func(g Gomega) any {
			g.Expect(k8sClient.Get(ctx, vmiKey(hpc, "fedora-gpu"), got)).To(Succeed())
			name, _, _ := unstructured.NestedString(got.Object, "status", "migrationState", "migrationPolicyName")
			return name
		}).WithTimeout(2 * time.Second).Should(Equal(prefix + "tuned-bandwidth"))
	})

	It("compares a migration target pod's affinity: the active bundle's is written, the candidate's logged", func() {
		ns := createNamespace()
		vmi := fromYAML(fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: moving, namespace: %s}
spec: {domain: {resources: {requests: {cpu: '1', memory: 2Gi}}, devices: {}}}
status: {nodeName: %snode-1}
`, ns, prefix))
		create(vmi)
		m := migration(ns, "to-node-2", "moving", toNode(prefix+"node-2"))
		pod := launcherPod(ns, "virt-launcher-moving-target", vmi, m.GetUID())
		zone := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{zone}},
		}}
		create(pod)
		// The active bundle's: the added term ANDed into the pod's own.
		terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		Expect(terms).To(HaveLen(1))
		Expect(terms[0].MatchExpressions).To(Equal(zone.MatchExpressions))
		Expect(terms[0].MatchFields).To(Equal(toNodeRequirement(prefix + "node-2")))

		affinityDiffers(shadow.DecisionMigrationTargetPodAffinity, ns+"/to-node-2",
			ContainSubstring("zone"), And(Not(ContainSubstring("zone")), ContainSubstring(prefix+"node-2")))
		// The migration's own admission is decided alike by both.
		Eventually(func() float64 {
			return metric(reg, "virtrules_candidate_decision_comparisons_total",
				map[string]string{"decision": shadow.DecisionMigrationValidation, "result": shadow.ResultSame})
		}).Should(BeNumerically(">=", 1), func() string { return decisionLog.String() })
		Expect(differences(shadow.DecisionMigrationValidation)()).To(BeZero())
	})

	It("compares a first scheduling's migratability affinity: the active bundle's is written, the candidate's logged", func() {
		// A cluster has one KubeVirt CR: this one requires level 50 for a first scheduling.
		deleteKubeVirts()
		ns := createNamespace()
		kv := fromYAML(`apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata:
  name: kubevirt
  namespace: ` + ns + `
  annotations: {migrations.virt-rules.io/require-host-model-migratability-level: "50"}
spec: {}
`)
		create(kv)
		vmi := fromYAML(fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: starting, namespace: %s}
spec: {domain: {cpu: {model: host-model}, devices: {}}}
`, ns))
		create(vmi)
		// The active bundle's: a level above 49. The webhook reads the KubeVirt CR from its
		// cache, so a pod created before the cache holds it starts without the affinity.
		var pod *corev1.Pod
		Eventually(func(g Gomega) *corev1.Affinity {
			pod = launcherPod(ns, "", vmi, "")
			pod.GenerateName = "virt-launcher-starting-"
			g.Expect(tryCreate(pod)).To(Succeed())
			return pod.Spec.Affinity
		}).ShouldNot(BeNil())
		Expect(pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms).To(Equal([]corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: nodelabeller.LabelLevel, Operator: corev1.NodeSelectorOpGt, Values: []string{"49"}}},
		}}))

		affinityDiffers(shadow.DecisionSchedulingAffinity, ns+"/starting",
			ContainSubstring("49"), And(ContainSubstring("50"), Not(ContainSubstring("49"))))
	})
})

// webhooksCandidateBundle is the shipped bundle (without tests) with upstream KubeVirt's
// MigrationPolicy precedence (it admits two policies with the same selectors, and picks
// hpc-large for design 000's VMI) whose target pod affinity drops the pod's own required terms
// (the added term alone) and whose first-scheduling affinity is off by one, built by OPA's `opa build` code with revision rev.
func webhooksCandidateBundle(rev string) []byte {
	GinkgoHelper()
	dir := clustersuite.ShippedBundleDir()
	edit := func(path, old, new string) {
		GinkgoHelper()
		file := filepath.Join(append([]string{dir}, strings.Split(path, "/")...)...)
		data, err := os.ReadFile(file)
		Expect(err).NotTo(HaveOccurred())
		changed := strings.Replace(string(data), old, new, 1)
		Expect(changed).NotTo(Equal(string(data)), "%s has %s", path, old)
		Expect(os.WriteFile(file, []byte(changed), 0o644)).To(Succeed())
	}
	edit("virtrules/migration/policy/data.json", `"precedence": "default"`, `"precedence": "kubevirt"`)
	edit("virtrules/migration/target/target.rego", "affinity.with_required_term(_pod_node_affinity, added_term)",
		"affinity.with_required_term(null, added_term)")
	// A first scheduling requires a level at or above the KubeVirt CR's, not above it.
	edit("virtrules/node/migratability/migratability.rego", "format_int(level - 1, 10)", "format_int(level, 10)")
	var out bytes.Buffer
	Expect(compile.New().WithPaths(dir).WithAsBundle(true).WithRevision(rev).WithOutput(&out).Build(ctx)).To(Succeed())
	return out.Bytes()
}

var _ = Describe("virt-rules controller with an unsigned candidate bundle", Ordered, func() {
	It("counts the refusal as the candidate's, records an Event on its Pod, and decides with the active bundle", func(sctx SpecContext) {
		binary := clustersuite.BuildVirtRules(sctx, repoRoot, "")

		key, err := rsa.GenerateKey(rand.Reader, 2048)
		Expect(err).NotTo(HaveOccurred())
		der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
		Expect(err).NotTo(HaveOccurred())
		keyFile := filepath.Join(GinkgoT().TempDir(), "key.pem")
		Expect(os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)).To(Succeed())
		var bundles servedBundle
		bundles.serve(shippedBundle("unsigned-1")) // no .signatures.json
		server := httptest.NewServer(&bundles)
		DeferCleanup(server.Close)

		podNamespace := createNamespace()
		podName := "virt-rules-" + krand.String(5)
		metricsAddr := freeAddress()
		cmd := exec.Command(binary, "controller", "--kubeconfig", writeKubeconfig(), "--leader-elect=false",
			"--candidate-bundle-url", server.URL+"/candidate.tar.gz", "--bundle-allow-http", "--bundle-poll-interval", "1s",
			"--candidate-bundle-verification-key", keyFile,
			"--metrics-bind-address", metricsAddr, "--metrics-insecure-http", "--health-probe-bind-address", freeAddress())
		cmd.Env = append(os.Environ(), "POD_NAME="+podName, "POD_NAMESPACE="+podNamespace)
		cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
		startUntilCleanup(cmd, 20*time.Second)

		metrics := func() string { _, body := getWithToken("http://"+metricsAddr+"/metrics", ""); return body }
		Eventually(metrics).WithTimeout(time.Minute).Should(MatchRegexp(`virtrules_candidate_bundle_load_failures_total\{reason="signature"\} [1-9]`))
		Expect(metrics()).NotTo(ContainSubstring("virtrules_bundle_load_failures_total{"), "the active bundle refused nothing")
		Expect(metrics()).To(MatchRegexp(`virtrules_bundle_active_revision\{revision="[^"]+",source="embedded"\} 1`))

		Eventually(func(g Gomega) {
			var events corev1.EventList
			g.Expect(k8sClient.List(ctx, &events, client.InNamespace(podNamespace))).To(Succeed())
			var reasons []string
			for _, e := range events.Items {
				if e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == podName {
					reasons = append(reasons, e.Reason+": "+e.Message)
				}
			}
			g.Expect(reasons).To(ContainElement(And(HavePrefix(bundlestatus.ReasonCandidateRefused+": Candidate bundle from "+server.URL),
				ContainSubstring("(signature)"))))
			g.Expect(reasons).NotTo(ContainElement(HavePrefix(bundlestatus.ReasonRefused + ":")))
		}).WithTimeout(time.Minute).Should(Succeed())

		// The active bundle decides as ever: a VMI gets the policy that matches it.
		name := "refused-" + krand.String(5)
		Expect(k8sClient.Create(ctx, policyObject(name, map[string]any{"app": name}, nil))).To(Succeed())
		DeferCleanup(func() {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, policyObject(name, nil, nil)))).To(Succeed())
		})
		ns := createNamespace()
		create(fromYAML(fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vm, namespace: %s, labels: {app: %s}}
spec: {domain: {devices: {}}}
`, ns, name)))
		Eventually(policyOf(vmiKey(ns, "vm"))).WithTimeout(time.Minute).Should(Equal(name))
	}, NodeTimeout(5*time.Minute))
})

// metric is the value of one series of a counter registered on reg; 0 when it has none yet.
func metric(reg *prometheus.Registry, name string, labels map[string]string) float64 {
	GinkgoHelper()
	families, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := len(m.GetLabel()) == len(labels)
			for _, l := range m.GetLabel() {
				match = match && labels[l.GetName()] == l.GetValue()
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// designPolicies creates design 000's namespaces and MigrationPolicies, each named with prefix
// (create: deleted when the calling node ends).
func designPolicies(prefix string) {
	GinkgoHelper()
	objs, err := manifest.Read([]string{
		filepath.Join(repoRoot, "examples", "migration-policy", "namespaces.yaml"),
		filepath.Join(repoRoot, "examples", "migration-policy", "policies.yaml"),
	}, nil)
	Expect(err).NotTo(HaveOccurred())
	for _, o := range objs {
		u := o.Unstructured.DeepCopy()
		u.SetName(prefix + u.GetName())
		create(u)
	}
}
