package clustersuite

import (
	"context"
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/controllers/migrationtarget"
)

// Migration is a VirtualMachineInstanceMigration of vmi named ns/name as a user writes it,
// not created; when term is set it carries design 001's added node selector term in
// virt-rules' annotation.
func Migration(ns, name, vmi string, term map[string]any) *unstructured.Unstructured {
	GinkgoHelper()
	m := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"vmiName": vmi},
	}}
	if term != nil {
		WithTerm(m, term)
	}
	return m
}

// WithTerm puts term into m's added-term annotation (migrationtarget.AnnotationAddedTerm).
func WithTerm(m *unstructured.Unstructured, term map[string]any) {
	GinkgoHelper()
	data, err := json.Marshal(term)
	Expect(err).NotTo(HaveOccurred())
	m.SetAnnotations(map[string]string{migrationtarget.AnnotationAddedTerm: string(data)})
}

// ToNode is the node selector term that matches the node named name by its metadata.name.
func ToNode(name string) map[string]any {
	return map[string]any{"matchFields": []any{map[string]any{"key": "metadata.name", "operator": "In", "values": []any{name}}}}
}

// TargetPods are the virt-launcher pods KubeVirt made in ns for migration m (by its job UID
// label).
func TargetPods(ctx context.Context, g Gomega, c client.Reader, ns string, m client.Object) []corev1.Pod {
	var pods corev1.PodList
	g.Expect(c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{launcher.LabelMigrationJobUID: string(m.GetUID())})).To(Succeed())
	return pods.Items
}

// Events are, for every Event in ns that keep keeps (its second result), what keep makes of
// it, in the order the API server lists them.
func Events(ctx context.Context, c client.Reader, ns string, keep func(corev1.Event) (string, bool)) func(g Gomega) []string {
	return func(g Gomega) []string {
		var events corev1.EventList
		g.Expect(c.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		var out []string
		for _, e := range events.Items {
			if s, ok := keep(e); ok {
				out = append(out, s)
			}
		}
		return out
	}
}

// FillerPod is a pod bound to node (spec.nodeName, past the scheduler) whose one container,
// of image, requests quantity of res: it fills the node.
func FillerPod(ns, name, node, image string, res corev1.ResourceName, quantity string) *corev1.Pod {
	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
		Name: "filler", Image: image,
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{res: resource.MustParse(quantity)}},
	}}}}
	pod.Namespace, pod.Name = ns, name
	return pod
}
