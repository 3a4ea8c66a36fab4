package kubevirt_test

import (
	"encoding/json"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// designNamespaceLabels are the labels of design 000's namespace.
var designNamespaceLabels = map[string]string{"priority": "high", "bandwidth": "medium", "hpc-workload": "true"}

// examplePolicies are the MigrationPolicies of examples/migration-policy, as a user applies them.
func examplePolicies() []*unstructured.Unstructured {
	GinkgoHelper()
	return readExample("migration-policy", "policies.yaml")
}

// readExample is the objects of one file of examples/, read as eval and kubectl read them.
func readExample(path ...string) []*unstructured.Unstructured {
	GinkgoHelper()
	objs, err := manifest.Read([]string{filepath.Join(append([]string{repoRoot, "examples"}, path...)...)}, nil)
	Expect(err).NotTo(HaveOccurred())
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.Unstructured)
	}
	return out
}

// migratedState is the migrationState KubeVirt copied into the migration when it completed.
func migratedState(ns, name string) func(g Gomega) map[string]any {
	return func(g Gomega) map[string]any {
		m := get(migrationKind, ns, name)(g)
		g.Expect(field(m, "status", "phase")).To(Equal("Succeeded"))
		state, _ := field(m, "status", "migrationState").(map[string]any)
		return state
	}
}

var _ = Describe("MigrationPolicy beside KubeVirt (design 000)", Ordered, func() {
	var ns string

	BeforeAll(func() {
		for _, p := range examplePolicies() {
			Expect(k8s.Create(ctx, p)).To(Succeed(), "KubeVirt admits example policy %s", p.GetName())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, p))).To(Succeed()) })
		}
		ns = namespace(designNamespaceLabels)
	})

	It("refuses the design's matchLabels selector shape: KubeVirt's schema takes plain label maps", func() {
		p := fromYAML(`apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: match-labels}
spec:
  selectors:
    virtualMachineInstanceSelector:
      matchLabels: {size: small}
`)
		err := k8s.Create(ctx, p)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("matchLabels"))
	})

	It("leaves KubeVirt's own precedence where virt-rules does not act: hpc-large", func() {
		// virt-rules' webhooks leave virt-rules' own namespace alone.
		own := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules", Labels: designNamespaceLabels}}
		Expect(k8s.Create(ctx, own)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, own))).To(Succeed()) })
		runningDesignVM(own.Name, "fedora-gpu")
		migrate(own.Name, "kubevirt-choice", "fedora-gpu", nil, nil)
		Eventually(migratedState(own.Name, "kubevirt-choice")).Should(HaveKeyWithValue("migrationPolicyName", "hpc-large"))
	})

	It("makes virt-rules' decision what virt-controller stores: tuned-bandwidth, the design's precedence", func() {
		runningDesignVM(ns, "fedora-gpu")
		migrate(ns, "virt-rules-choice", "fedora-gpu", nil, nil)
		var state map[string]any
		Eventually(func(g Gomega) map[string]any {
			state = migratedState(ns, "virt-rules-choice")(g)
			return state
		}).Should(HaveKeyWithValue("migrationPolicyName", "tuned-bandwidth"))
		config := state["migrationConfiguration"].(map[string]any)
		Expect(config).To(And(HaveKeyWithValue("bandwidthPerMigration", "1Gi"), HaveKeyWithValue("allowAutoConverge", true)))

		// The VMI's annotations say the same, field for field: the decision holds only the
		// fields this KubeVirt stores (no maxDowntimeMs before v1.9).
		vmi := get(vmiKind, ns, "fedora-gpu")(Default)
		Expect(vmi.GetAnnotations()).To(HaveKeyWithValue(migrationpolicy.AnnotationPolicy, "tuned-bandwidth"))
		var annotated map[string]any
		Expect(json.Unmarshal([]byte(vmi.GetAnnotations()[migrationpolicy.AnnotationConfiguration]), &annotated)).To(Succeed())
		Expect(normalize(annotated)).To(Equal(normalize(config)))
		Expect(field(vmi, "status", "migrationState", "migrationPolicyName")).To(Equal("tuned-bandwidth"))
	})
})

var _ = Describe("MigrationPolicy validity beside KubeVirt", Ordered, func() {
	It("flags a stored invalid policy where a kubectl user sees it: annotations and a Warning Event", func() {
		first := fromYAML(`apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: db}
spec: {selectors: {virtualMachineInstanceSelector: {app: db}}}
`)
		Expect(k8s.Create(ctx, first)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, first))).To(Succeed()) })
		Eventually(annotationsOf("db")).Should(HaveKeyWithValue(migrationpolicy.AnnotationValid, "true"))

		// A duplicate the validating webhook would refuse, stored while it was not installed
		// (as policies made before virt-rules was).
		validating := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: "virt-rules-validating"}, validating)).To(Succeed())
		Expect(k8s.Delete(ctx, validating)).To(Succeed())
		duplicate := fromYAML(`apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: db-again}
spec: {selectors: {virtualMachineInstanceSelector: {app: db}}}
`)
		// The API server drops a deleted webhook configuration from its cache a moment later.
		Eventually(func() error { return k8s.Create(ctx, duplicate.DeepCopy()) }).Should(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, duplicate))).To(Succeed()) })
		validating.ResourceVersion, validating.UID = "", ""
		Expect(k8s.Create(ctx, validating)).To(Succeed())

		Eventually(annotationsOf("db-again")).Should(And(
			HaveKeyWithValue(migrationpolicy.AnnotationValid, "false"),
			HaveKeyWithValue(migrationpolicy.AnnotationInvalidReason, ContainSubstring(`same selectors as MigrationPolicy "db"`)),
			HaveKeyWithValue(migrationpolicy.AnnotationVMIs, "0"),
		))
		// With the validating webhook back, the invalid policy's metadata can still change (the
		// controller's annotations above did); its spec cannot stay invalid through an edit.
		Expect(k8s.Patch(ctx, duplicate, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"db"}}}`)))).To(Succeed())
		err := k8s.Patch(ctx, duplicate, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"allowPostCopy":true}}`)))
		Expect(err).To(MatchError(ContainSubstring(`same selectors as MigrationPolicy "db"`)))
		Eventually(func(g Gomega) []string {
			var events corev1.EventList
			g.Expect(k8s.List(ctx, &events, client.InNamespace("default"))).To(Succeed())
			var reasons []string
			for _, e := range events.Items {
				if e.InvolvedObject.Name == "db-again" && e.Type == corev1.EventTypeWarning {
					reasons = append(reasons, e.Reason)
				}
			}
			return reasons
		}).Should(ContainElement(migrationpolicy.ReasonInvalid))
	})
})

func annotationsOf(policy string) func(g Gomega) map[string]string {
	return func(g Gomega) map[string]string {
		p := kinds.NewObject(migrationpolicy.GVKMigrationPolicy)
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: policy}, p)).To(Succeed())
		return p.GetAnnotations()
	}
}

// runningDesignVM creates design 000's VM (examples/local-cluster/vm.yaml, the README tour's)
// named name in ns and waits until it runs.
func runningDesignVM(ns, name string) {
	GinkgoHelper()
	vms := readExample("local-cluster", "vm.yaml")
	Expect(vms).To(HaveLen(1))
	vm := vms[0]
	vm.SetNamespace(ns)
	vm.SetName(name)
	Expect(k8s.Create(ctx, vm)).To(Succeed())
	Eventually(func(g Gomega) any { return field(get(vmiKind, ns, name)(g), "status", "phase") }).Should(Equal("Running"))
}

// normalize is v after a JSON round trip, so numbers compare alike however they were decoded.
func normalize(v any) any {
	GinkgoHelper()
	data, err := json.Marshal(v)
	Expect(err).NotTo(HaveOccurred())
	var out any
	Expect(json.Unmarshal(data, &out)).To(Succeed())
	return out
}
