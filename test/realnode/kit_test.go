package realnode_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// kitNamespace is where the kit installs virt-rules.
const kitNamespace = "virt-rules"

var migrationPolicyGVK = schema.GroupVersionKind{Group: "migrations.kubevirt.io", Version: "v1alpha1", Kind: "MigrationPolicy"}

var _ = Describe("kubectl apply -k of an overlay of examples/deploy", Ordered, func() {
	var deployment *appsv1.Deployment

	It("applies, the image set as the README's install says (kustomize edit set image)", func(sctx SpecContext) {
		for _, o := range clustersuite.Kustomize(overlay(controllerImage)) {
			Expect(cluster.Client.Apply(sctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("kubectl"), client.ForceOwnership)).
				To(Succeed(), "apply %s %s", o.GetKind(), o.GetName())
		}
	})

	It("runs the controller Deployment as real pods on the real node, both ready", func(sctx SpecContext) {
		deployment = &appsv1.Deployment{}
		began := time.Now()
		Eventually(func(g Gomega) {
			g.Expect(cluster.Client.Get(sctx, client.ObjectKey{Namespace: kitNamespace, Name: "virt-rules"}, deployment)).To(Succeed())
			g.Expect(deployment.Status.ReadyReplicas).To(Equal(*deployment.Spec.Replicas))
		}).WithContext(sctx).WithTimeout(3*time.Minute).Should(Succeed(), func() string { return podsReport(sctx) })
		AddReportEntry("kit applied -> Deployment ready", time.Since(began).Round(time.Millisecond).String())
		pods := &corev1.PodList{}
		Expect(cluster.Client.List(sctx, pods, client.InNamespace(kitNamespace), client.MatchingLabels(deployment.Spec.Selector.MatchLabels))).To(Succeed())
		Expect(pods.Items).To(HaveLen(int(*deployment.Spec.Replicas)))
		for _, p := range pods.Items {
			Expect(p.Spec.NodeName).To(Equal(nodeName), "kube-scheduler placed %s", p.Name)
			Expect(p.Status.PodIP).To(HavePrefix("10.88."), "%s is on the node's bridge", p.Name)
			Expect(p.Spec.Containers[0].Image).To(Equal(controllerImage))
		}
	}, SpecTimeout(4*time.Minute))

	It("serves its webhooks to the API server from those pods: a duplicate MigrationPolicy is refused", func(sctx SpecContext) {
		By("waiting for the controller's CA in every webhook of its configurations")
		Eventually(func(g Gomega) {
			validating := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			g.Expect(cluster.Client.Get(sctx, client.ObjectKey{Name: "virt-rules-validating"}, validating)).To(Succeed())
			for _, w := range validating.Webhooks {
				g.Expect(w.ClientConfig.CABundle).NotTo(BeEmpty(), w.Name)
			}
		}).WithContext(sctx).Should(Succeed())

		first := migrationPolicy("realnode-db")
		Expect(cluster.Client.Create(sctx, first)).To(Succeed())
		DeferCleanup(func(sctx SpecContext) {
			Expect(client.IgnoreNotFound(cluster.Client.Delete(sctx, first))).To(Succeed())
		})
		err := cluster.Client.Create(sctx, migrationPolicy("realnode-db-again"))
		Expect(err).To(HaveOccurred(), "a policy with the selectors of another is refused by the validating webhook")
		Expect(err.Error()).To(ContainSubstring(`admission webhook "migrationpolicies.validate.virt-rules.io" denied the request`))
		Expect(err.Error()).To(ContainSubstring("realnode-db"))
	}, SpecTimeout(2*time.Minute))
})

// overlay writes a kustomization on examples/deploy that sets the controller's image to
// image, as `kustomize edit set image virt-rules/controller=IMAGE` in an admin's overlay
// does, and returns its folder.
func overlay(image string) string {
	GinkgoHelper()
	name, tag, ok := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
	Expect(ok).To(BeTrue(), "image %s has a tag", image)
	name = image[:strings.LastIndex(image, "/")+1] + name
	dir := GinkgoT().TempDir()
	// kustomize takes a base's path relative to the overlay only.
	base, err := filepath.Rel(dir, filepath.Join(clustersuite.RepoRoot(), "examples", "deploy"))
	Expect(err).NotTo(HaveOccurred())
	kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: virt-rules/controller
  newName: %s
  newTag: %s
`, base, name, tag)
	Expect(os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644)).To(Succeed())
	return dir
}

// migrationPolicy is a MigrationPolicy for the VMIs labelled app=realnode-db.
func migrationPolicy(name string) *unstructured.Unstructured {
	p := &unstructured.Unstructured{}
	p.SetGroupVersionKind(migrationPolicyGVK)
	p.SetName(name)
	p.Object["spec"] = map[string]any{"selectors": map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": "realnode-db"}}}
	return p
}

// podsReport is the kit's pods' phases and container states, and the events of the namespace,
// for a failed wait.
func podsReport(sctx SpecContext) string {
	var b strings.Builder
	pods := &corev1.PodList{}
	if err := cluster.Client.List(sctx, pods, client.InNamespace(kitNamespace)); err == nil {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s on %q: %s %+v\n", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
		}
	}
	events := &corev1.EventList{}
	if err := cluster.Client.List(sctx, events, client.InNamespace(kitNamespace)); err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "event %s %s: %s\n", e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}
