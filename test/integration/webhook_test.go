package integration_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

func policyObject(name string, vmiSelector map[string]any, spec map[string]any) *unstructured.Unstructured {
	p := newUnstructured(migrationpolicy.GVKMigrationPolicy)
	p.SetName(name)
	s := map[string]any{"selectors": map[string]any{"virtualMachineInstanceSelector": vmiSelector}}
	for k, v := range spec {
		s[k] = v
	}
	p.Object["spec"] = s
	return p
}

// serveWebhooks installs the webhook configurations of examples/deploy/webhooks, pointed by
// envtest at this process, and starts a manager serving them. stop stops the manager and
// removes the configurations.
func serveWebhooks() (stop func()) {
	GinkgoHelper()
	webhooks := &envtest.WebhookInstallOptions{Paths: []string{filepath.Join(repoRoot, "examples", "deploy", "webhooks")}}
	Expect(webhooks.Install(cfg)).To(Succeed())
	stopManager := startManagerWith(webhooks)
	addr := net.JoinHostPort(webhooks.LocalServingHost, fmt.Sprint(webhooks.LocalServingPort))
	Eventually(func() error {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			conn.Close()
		}
		return err
	}).WithTimeout(20 * time.Second).Should(Succeed())
	return func() {
		stopManager()
		for _, c := range webhooks.ValidatingWebhooks {
			Expect(k8sClient.Delete(ctx, c.DeepCopy())).To(Succeed())
		}
		for _, c := range webhooks.MutatingWebhooks {
			Expect(k8sClient.Delete(ctx, c.DeepCopy())).To(Succeed())
		}
		Expect(webhooks.Cleanup()).To(Succeed())
	}
}

var _ = Describe("MigrationPolicy webhooks", Ordered, func() {
	var stop func()

	BeforeAll(func() {
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		stop = serveWebhooks()
	})

	AfterAll(func() {
		if stop != nil {
			stop()
		}
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
	})

	It("admits a valid policy", func() {
		Expect(k8sClient.Create(ctx, policyObject("db", map[string]any{"app": "db"}, map[string]any{"bandwidthPerMigration": "1Gi"}))).To(Succeed())
	})

	It("rejects a second policy with the same selectors, naming the first", func() {
		err := k8sClient.Create(ctx, policyObject("db-again", map[string]any{"app": "db"}, nil))
		Expect(err).To(MatchError(ContainSubstring(`spec.selectors: same selectors as MigrationPolicy "db"`)))
	})

	It("admits one of several policies with the same selectors created at once, and every policy of distinct selectors", func() {
		// Admissions run side by side unless they can conflict: eight creates of the same
		// selectors race for one lock, eight of distinct selectors do not; the cache shows none
		// of them yet when the others are validated.
		const n = 8
		errs := make([]error, 2*n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				errs[i] = k8sClient.Create(ctx, policyObject(fmt.Sprintf("race-%d", i), map[string]any{"app": "race"}, nil))
			})
			wg.Go(func() {
				errs[n+i] = k8sClient.Create(ctx, policyObject(fmt.Sprintf("apart-%d", i), map[string]any{"app": fmt.Sprintf("apart-%d", i)}, nil))
			})
		}
		wg.Wait()
		admitted := 0
		for i, err := range errs[:n] {
			if err == nil {
				admitted++
				continue
			}
			Expect(err).To(MatchError(ContainSubstring(`spec.selectors: same selectors as MigrationPolicy "race-`)), "race-%d", i)
		}
		Expect(admitted).To(Equal(1), "policies of the same selectors admitted")
		for i, err := range errs[n:] {
			Expect(err).NotTo(HaveOccurred(), "apart-%d", i)
		}
	})

	It("rejects invalid values with the field they are in", func() {
		err := k8sClient.Create(ctx, policyObject("bad", map[string]any{"app": "web", "bad key": "x"},
			map[string]any{"bandwidthPerMigration": "-1Mi"}))
		Expect(err).To(MatchError(And(
			ContainSubstring("spec.bandwidthPerMigration"),
			ContainSubstring("spec.selectors.virtualMachineInstanceSelector"),
		)))
	})

	It("rejects an update that makes a policy invalid", func() {
		// A merge patch, as kubectl patch sends: the status controller annotates the policy
		// (its VMI count, a second after VMIs join it), so an update of a version read
		// before may conflict instead of reaching the webhook.
		p := newUnstructured(migrationpolicy.GVKMigrationPolicy)
		p.SetName("db")
		Expect(k8sClient.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"completionTimeoutPerGiB":-5}}`)))).
			To(MatchError(ContainSubstring("spec.completionTimeoutPerGiB")))
	})

	It("writes the decision into a VMI's migration state whenever one is written", func() {
		ns := createNamespace()
		vmi := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
		vmi.SetNamespace(ns)
		vmi.SetName("db-1")
		vmi.SetLabels(map[string]string{"app": "db"})
		vmi.Object["spec"] = map[string]any{"domain": map[string]any{"devices": map[string]any{}}}
		const webhookName = "migrationstate.vmi.mutate.virt-rules.io"
		calls, excluded := webhookCalls(webhookName), matchExclusions(webhookName)
		Expect(k8sClient.Create(ctx, vmi)).To(Succeed())
		Expect(vmi.Object).NotTo(HaveKey("status"), "no migration state, nothing to write")
		// The webhook's matchConditions keep a write without a migration state from reaching
		// virt-rules at all: kube-apiserver counts it as excluded, and calls nothing.
		Expect(matchExclusions(webhookName)).To(BeNumerically(">", excluded), "kube-apiserver excluded the create by the webhook's matchConditions")
		Expect(webhookCalls(webhookName)).To(Equal(calls), "no call to virt-rules for a VMI write without a migration state")

		// What KubeVirt's migration controller writes when a migration starts (a patch: the
		// migrationpolicy controller annotates the VMI meanwhile).
		Expect(k8sClient.Patch(ctx, vmi, client.RawPatch(types.MergePatchType,
			[]byte(`{"status":{"migrationState":{"sourceNode":"node-1","targetNode":"node-2","migrationPolicyName":"upstream-choice"}}}`)))).To(Succeed())

		got := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
		Expect(k8sClient.Get(ctx, vmiKey(ns, "db-1"), got)).To(Succeed())
		state, _, _ := unstructured.NestedMap(got.Object, "status", "migrationState")
		Expect(state).To(HaveKeyWithValue("migrationPolicyName", "db"))
		Expect(state).To(HaveKeyWithValue("sourceNode", "node-1"))
		Expect(state["migrationConfiguration"]).To(HaveKeyWithValue("bandwidthPerMigration", "1Gi"))
		Expect(webhookCalls(webhookName)).To(BeNumerically(">", calls), "the write with a migration state was sent to virt-rules")
	})

	It("rejects a migration whose added term is malformed, and admits a valid one", func() {
		ns := createNamespace()
		vmim := func(name string, term map[string]any) *unstructured.Unstructured {
			m := fromYAML("apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstanceMigration\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec: {vmiName: db}\n")
			withTerm(m, term)
			return m
		}
		err := k8sClient.Create(ctx, vmim("bad", map[string]any{
			"matchFields": []any{map[string]any{"key": "metadata.labels", "operator": "In", "values": []any{"node-2"}}},
		}))
		Expect(err).To(MatchError(And(ContainSubstring("InvalidTerm"), ContainSubstring("metadata.annotations[migrations.virt-rules.io/added-node-selector-term].matchFields[0].key"))))
		Expect(k8sClient.Create(ctx, vmim("good", map[string]any{
			"matchFields": []any{map[string]any{"key": "metadata.name", "operator": "In", "values": []any{"node-2"}}},
		}))).To(Succeed())
	})

	It("is configured with explicit timeouts and failure policies", func() {
		// A configuration with a webhook (HaveField reads the same fields of both kinds').
		withWebhook := func(webhook OmegaMatcher) OmegaMatcher {
			return ContainElement(HaveField("Webhooks", ContainElement(webhook)))
		}
		timeout := HaveField("TimeoutSeconds", HaveValue(BeEquivalentTo(5)))
		var cfgs admissionregistrationv1.ValidatingWebhookConfigurationList
		Expect(k8sClient.List(ctx, &cfgs)).To(Succeed())
		Expect(cfgs.Items).To(withWebhook(And(timeout,
			HaveField("FailurePolicy", HaveValue(Equal(admissionregistrationv1.Fail))),
		)))
		var mutating admissionregistrationv1.MutatingWebhookConfigurationList
		Expect(k8sClient.List(ctx, &mutating)).To(Succeed())
		Expect(mutating.Items).To(withWebhook(And(timeout,
			HaveField("FailurePolicy", HaveValue(Equal(admissionregistrationv1.Ignore))),
			HaveField("NamespaceSelector", Not(BeNil())),
		)))
	})

	It("times every answer in virtrules_webhook_duration_seconds", func() {
		// Every create and update of a policy above passed the validating webhook: 20 at least.
		families, err := metrics.Registry.Gather()
		Expect(err).NotTo(HaveOccurred())
		var answers uint64
		for _, f := range families {
			if f.GetName() != "virtrules_webhook_duration_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "webhook" && l.GetValue() == migrationpolicy.ValidatingWebhookPath {
						answers += m.GetHistogram().GetSampleCount()
					}
				}
			}
		}
		Expect(answers).To(BeNumerically(">=", 20))
	})
})

// webhookCalls is how many times kube-apiserver called the admission webhook name (its
// apiserver_admission_webhook_request_total, every code).
func webhookCalls(name string) float64 {
	GinkgoHelper()
	return apiServerCounter("apiserver_admission_webhook_request_total", name)
}

// matchExclusions is how many requests kube-apiserver did not send to the admission webhook
// name because its matchConditions were false.
func matchExclusions(name string) float64 {
	GinkgoHelper()
	return apiServerCounter("apiserver_admission_match_condition_exclusions_total", name)
}

// apiServerCounter sums the counter metric of kube-apiserver's /metrics over the series whose
// label name is name.
func apiServerCounter(metric, name string) float64 {
	GinkgoHelper()
	return clustersuite.Counter(clustersuite.APIServerMetrics(ctx, cfg), metric, map[string]string{"name": name})
}
