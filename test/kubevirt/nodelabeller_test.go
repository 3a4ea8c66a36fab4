package kubevirt_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// icelake is a newer CPU than the suite's Skylake nodes: it runs their host model, they do not
// run its.
var icelake = testcluster.CPU{Vendor: "Intel", HostModel: "Icelake-Server", Models: append([]string{"Icelake-Server"}, testcluster.Skylake.Models...)}

func kubevirtCR(g Gomega) *unstructured.Unstructured {
	kv := kinds.NewObject(kinds.KubeVirt)
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: testcluster.Namespace, Name: testcluster.KubeVirtName}, kv)).To(Succeed())
	return kv
}

// annotateKubeVirt sets (or with "" removes) an annotation of the KubeVirt CR.
func annotateKubeVirt(key, value string) {
	GinkgoHelper()
	var v any = value
	if value == "" {
		v = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: v}}})
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Patch(ctx, kubevirtCR(Default), client.RawPatch(types.MergePatchType, patch))).To(Succeed())
}

func launcherPodOf(g Gomega, ns, vmi string) corev1.Pod {
	var pods corev1.PodList
	g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": vmi})).To(Succeed())
	g.Expect(pods.Items).To(HaveLen(1))
	return pods.Items[0]
}

var _ = Describe("Migratability levels and first scheduling beside KubeVirt (design 002)", Ordered, func() {
	var ns string
	// A VM that can only run on icelake-1: pinned to it, tolerating its taint.
	const onIcelake = `nodeSelector: {kubernetes.io/hostname: icelake-1}
      tolerations: [{key: dedicated, value: icelake, effect: NoSchedule}]`

	BeforeAll(func() {
		ns = namespace(nil)
		n := testcluster.Node("icelake-1", icelake, nil)
		// Only the VMs of these specs go there.
		n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "icelake", Effect: corev1.TaintEffectNoSchedule}}
		Expect(cluster.CreateNodes(ctx, n)).To(Succeed())
		DeferCleanup(func() { Expect(k8s.Delete(ctx, n)).To(Succeed()) })
	})

	It("labels every kwok node with its level: Skylake nodes can go anywhere, the Icelake node nowhere", func() {
		Eventually(func(g Gomega) map[string]string {
			var nodes corev1.NodeList
			g.Expect(k8s.List(ctx, &nodes)).To(Succeed())
			levels := map[string]string{}
			for _, n := range nodes.Items {
				levels[n.Name] = n.Labels[nodelabeller.LabelLevel]
			}
			return levels
		}).Should(Equal(map[string]string{"node-1": "100", "node-2": "100", "node-3": "100", "node-4": "100", "icelake-1": "0"}))
	})

	It("drops the design's KubeVirt CR field: KubeVirt's schema has no requireHostModelMigratabilityLevel", func() {
		patch := []byte(`{"spec":{"configuration":{"migrations":{"requireHostModelMigratabilityLevel":50}}}}`)
		Expect(k8s.Patch(ctx, kubevirtCR(Default), client.RawPatch(types.MergePatchType, patch))).To(Succeed())
		Expect(field(kubevirtCR(Default), "spec", "configuration", "migrations")).NotTo(HaveKey("requireHostModelMigratabilityLevel"))
	})

	It("starts a pinned VM on the Icelake node while no level is required", func() {
		runningVM(ns, "before", onIcelake)
	})

	It("gives launcher pods made by virt-controller the required level, and kube-scheduler honours it", func() {
		annotateKubeVirt("migrations.virt-rules.io/require-host-model-migratability-level", "50")
		DeferCleanup(annotateKubeVirt, "migrations.virt-rules.io/require-host-model-migratability-level", "")
		level := corev1.NodeSelectorRequirement{Key: nodelabeller.LabelLevel, Operator: corev1.NodeSelectorOpGt, Values: []string{"49"}}

		// Anywhere: it starts, on a Skylake node.
		node := runningVM(ns, "anywhere", "")
		Expect(node).To(HavePrefix("node-"))
		terms := launcherPodOf(Default, ns, "anywhere").Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		for _, t := range terms {
			Expect(t.MatchExpressions).To(ContainElement(level))
		}

		// Pinned to the Icelake node (level 0): the scheduler refuses it.
		apply(ns, vmYAML, "after", "after", onIcelake)
		Eventually(func(g Gomega) string {
			pod := launcherPodOf(g, ns, "after")
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					return c.Reason + ": " + c.Message
				}
			}
			return string(pod.Status.Phase)
		}).Should(And(HavePrefix("Unschedulable"), ContainSubstring("affinity")))
		Consistently(func(g Gomega) any { return field(get(vmiKind, ns, "after")(g), "status", "nodeName") }, "2s").Should(BeNil())
	})
})
