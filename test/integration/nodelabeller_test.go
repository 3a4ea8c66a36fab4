package integration_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// cpuNode is a node labelled as KubeVirt labels a host of that CPU generation.
func cpuNode(name, model string, migratesFrom []string, features, required []string) *corev1.Node {
	labels := map[string]string{"host-model-cpu.node.kubevirt.io/" + model: "true"}
	for _, m := range migratesFrom {
		labels["cpu-model-migration.node.kubevirt.io/"+m] = "true"
	}
	for _, f := range features {
		labels["cpu-feature.node.kubevirt.io/"+f] = "true"
	}
	for _, f := range required {
		labels["host-model-required-features.node.kubevirt.io/"+f] = "true"
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func levelOf(name string) func(g Gomega) string {
	return func(g Gomega) string {
		var n corev1.Node
		g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: name}, &n)).To(Succeed())
		if v, ok := n.Labels[nodelabeller.LabelLevel]; ok {
			return v
		}
		return "<none>"
	}
}

var _ = Describe("Node labeller", Ordered, func() {
	var stop func()
	skylake := func(name string) *corev1.Node {
		return cpuNode(name, "Skylake", []string{"Skylake"}, []string{"avx512f"}, []string{"avx512f"})
	}
	icelake := func(name string) *corev1.Node {
		return cpuNode(name, "Icelake", []string{"Skylake", "Icelake"}, []string{"avx512f", "gfni"}, []string{"gfni"})
	}

	BeforeAll(func() {
		var nodes corev1.NodeList
		Expect(k8sClient.List(ctx, &nodes)).To(Succeed())
		Expect(nodes.Items).To(BeEmpty(), "this spec owns the cluster's nodes")
		for _, n := range []*corev1.Node{skylake("sky-1"), skylake("sky-2"), icelake("ice-1")} {
			Expect(k8sClient.Create(ctx, n)).To(Succeed())
		}
		stop = startManager()
	})

	AfterAll(func() {
		stop()
		Expect(k8sClient.DeleteAllOf(ctx, &corev1.Node{})).To(Succeed())
	})

	It("labels every host-model node with design 002's level", func() {
		// Skylake hosts reach the other Skylake and the Icelake (2 of 2); the Icelake none.
		Eventually(levelOf("sky-1")).WithTimeout(20 * time.Second).Should(Equal("100"))
		Eventually(levelOf("sky-2")).Should(Equal("100"))
		Eventually(levelOf("ice-1")).Should(Equal("0"))
	})

	It("updates levels when a node is added", func() {
		Expect(k8sClient.Create(ctx, icelake("ice-2"))).To(Succeed())
		Eventually(levelOf("ice-1")).Should(Equal("33")) // ice-2 of 3 others
		Eventually(levelOf("ice-2")).Should(Equal("33"))
		Eventually(levelOf("sky-1")).Should(Equal("100"))
	})

	It("updates levels when a node is cordoned, and drops the cordoned node's label", func() {
		Expect(clustersuite.Cordon(ctx, k8sClient, "ice-2")).To(Succeed())
		Eventually(levelOf("ice-2")).Should(Equal("<none>"))
		Eventually(levelOf("ice-1")).Should(Equal("0"))
	})

	It("updates levels when a node is removed", func() {
		Expect(k8sClient.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sky-2"}})).To(Succeed())
		Eventually(levelOf("sky-1")).Should(Equal("100")) // ice-1 of 1 other schedulable node
		Eventually(levelOf("ice-1")).Should(Equal("0"))
	})
})
