package integration_test

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// startManager runs the controllers in this process, wired exactly as `virt-rules controller`
// wires them (controllers.Setup), until the returned function is called.
func startManager() (stop func()) {
	GinkgoHelper()
	return startManagerWith(nil)
}

// startManagerWith also serves the admission webhooks when webhooks is set, with the host,
// port and certificates envtest prepared for them.
func startManagerWith(webhooks *envtest.WebhookInstallOptions) (stop func()) {
	GinkgoHelper()
	stop, _ = startManagerOpts(cfg, webhooks, nil)
	return stop
}

// startManagerOpts starts virt-rules with leader election when election names a Lease
// namespace; elected is closed once it leads (at once without election).
func startManagerOpts(restConfig *rest.Config, webhooks *envtest.WebhookInstallOptions, election *string) (stop func(), elected <-chan struct{}) {
	GinkgoHelper()
	logger := slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctrl.SetLogger(logr.FromSlogHandler(logger.Handler()))
	eng, err := engine.New(ctx, engine.WithLogger(logger))
	Expect(err).NotTo(HaveOccurred())
	o := testcluster.VirtRulesOptions{Controllers: controllers.Options{ConcurrentSyncs: 4}, Webhooks: webhooks}
	if election != nil {
		o.LeaseNamespace = *election
	}
	vr, err := testcluster.RunVirtRules(ctx, restConfig, eng, o)
	Expect(err).NotTo(HaveOccurred())
	return func() { Expect(vr.Stop()).To(Succeed()) }, vr.Elected
}

func newUnstructured(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

func metaName(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }

func keyOf(name string) types.NamespacedName { return types.NamespacedName{Name: name} }

func vmiKey(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

// policyOf is a VMI's policy annotation, and whether it is there.
func policyOf(key types.NamespacedName) func(g Gomega) string {
	return func(g Gomega) string {
		vmi := &unstructured.Unstructured{}
		vmi.SetGroupVersionKind(migrationpolicy.GVKVirtualMachineInstance)
		g.Expect(k8sClient.Get(ctx, key, vmi)).To(Succeed())
		p, ok := vmi.GetAnnotations()[migrationpolicy.AnnotationPolicy]
		g.Expect(vmi.GetAnnotations()).To(HaveKey(migrationpolicy.AnnotationConfiguration))
		if !ok {
			return "<none>"
		}
		return p
	}
}

func configurationOf(key types.NamespacedName) map[string]any {
	GinkgoHelper()
	vmi := &unstructured.Unstructured{}
	vmi.SetGroupVersionKind(migrationpolicy.GVKVirtualMachineInstance)
	Expect(k8sClient.Get(ctx, key, vmi)).To(Succeed())
	var cfg map[string]any
	Expect(json.Unmarshal([]byte(vmi.GetAnnotations()[migrationpolicy.AnnotationConfiguration]), &cfg)).To(Succeed())
	return cfg
}

func patchLabels(obj client.Object, labels map[string]any) {
	GinkgoHelper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	Expect(err).NotTo(HaveOccurred())
	Expect(k8sClient.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
}

var _ = Describe("MigrationPolicy controller", Ordered, func() {
	var stop func()
	fedora := vmiKey("hpc", "fedora-gpu")

	BeforeAll(func() {
		// Policies are cluster-scoped: start from none.
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		// Design 000's example, from the same manifests eval reads.
		objs, err := manifest.Read([]string{filepath.Join(repoRoot, "examples", "migration-policy")}, nil)
		Expect(err).NotTo(HaveOccurred())
		for _, ns := range []string{"unlisted", "kubevirt"} {
			Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metaName(ns)})).To(Succeed())
		}
		for _, kind := range []string{"Namespace", "KubeVirt", "MigrationPolicy", "VirtualMachineInstance"} {
			for _, o := range objs {
				if o.GetKind() == kind {
					Expect(k8sClient.Create(ctx, o.Unstructured.DeepCopy())).To(Succeed(), o.Describe())
				}
			}
		}
		stop = startManager()
	})
	AfterAll(func() { stop() })

	It("annotates every VMI with the policy design 000 picks", func() {
		Eventually(policyOf(fedora)).WithTimeout(30 * time.Second).Should(Equal("tuned-bandwidth"))
		Eventually(policyOf(vmiKey("batch", "render"))).Should(Equal("gpu-anywhere"))
		Eventually(policyOf(vmiKey("batch", "web"))).Should(Equal("<none>"))
		Eventually(policyOf(vmiKey("unlisted", "legacy"))).Should(Equal("gpu-anywhere"))
		cfg := configurationOf(fedora)
		Expect(cfg).To(HaveKeyWithValue("bandwidthPerMigration", "1Gi"))                      // the policy
		Expect(cfg).To(HaveKeyWithValue("completionTimeoutPerGiB", BeNumerically("==", 800))) // the KubeVirt CR
		Expect(cfg).To(HaveKeyWithValue("progressTimeout", BeNumerically("==", 150)))         // KubeVirt's default
	})

	It("follows the VMI's labels when they change", func() {
		vmi := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
		vmi.SetNamespace(fedora.Namespace)
		vmi.SetName(fedora.Name)
		patchLabels(vmi, map[string]any{"size": nil})
		// Without size: gpu=nvidia + priority=high is the most specific left.
		Eventually(policyOf(fedora)).Should(Equal("gpu-priority"))
	})

	It("follows the namespace's labels when they change", func() {
		patchLabels(&corev1.Namespace{ObjectMeta: metaName("hpc")}, map[string]any{"priority": nil})
		Eventually(policyOf(fedora)).Should(Equal("gpu-anywhere"))
	})

	It("follows the policies when one is deleted", func() {
		p := newUnstructured(migrationpolicy.GVKMigrationPolicy)
		p.SetName("gpu-anywhere")
		Expect(k8sClient.Delete(ctx, p)).To(Succeed())
		Eventually(policyOf(fedora)).Should(Equal("<none>"))
		Eventually(policyOf(vmiKey("batch", "render"))).Should(Equal("<none>"))
	})

	It("counts the VMIs each policy governs and validates it, in its annotations", func() {
		Eventually(func(g Gomega) map[string]string {
			p := newUnstructured(migrationpolicy.GVKMigrationPolicy)
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: "tuned-bandwidth"}, p)).To(Succeed())
			return p.GetAnnotations()
		}).WithTimeout(10 * time.Second).Should(And(
			HaveKeyWithValue(migrationpolicy.AnnotationVMIs, "0"), // fedora-gpu left it when its labels changed
			HaveKeyWithValue(migrationpolicy.AnnotationValid, "true"),
			Not(HaveKey(migrationpolicy.AnnotationInvalidReason)),
		))
	})

	It("records an Event when a VMI's policy changes", func() {
		Eventually(func(g Gomega) {
			var events corev1.EventList
			g.Expect(k8sClient.List(ctx, &events, client.InNamespace("hpc"))).To(Succeed())
			reasons := []string{}
			for _, e := range events.Items {
				if e.InvolvedObject.Name == fedora.Name {
					reasons = append(reasons, e.Reason)
				}
			}
			g.Expect(reasons).To(ContainElement(migrationpolicy.ReasonPolicyChanged))
		}).Should(Succeed())
	})
})
