package outage_test

import (
	"fmt"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/controllers/migrationtarget"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// get reads the object of kind gvk named ns/name, as stored.
func get(gvk schema.GroupVersionKind, ns, name string) func(g Gomega) *unstructured.Unstructured {
	return clustersuite.Get(ctx, k8s, gvk, ns, name)
}

var (
	vmiKind       = kinds.VirtualMachineInstance
	migrationKind = kinds.VirtualMachineInstanceMigration
	field         = clustersuite.Field
)

// The names of the webhook entries that fail closed, as the API server quotes them.
const (
	migrationWebhook = "addednodeselectorterm.virtualmachineinstancemigrations.validate.virt-rules.io"
	targetPodWebhook = "migrationtarget.pod.mutate.virt-rules.io"
)

// vmYAML is a VM that starts at once; %v says whether the stand-in holds its migrations
// (testcluster.AnnotationHoldMigration).
var vmYAML = clustersuite.VMYAML(clustersuite.VMI{
	Metadata: []string{"labels: {app: %s}", `annotations: {%s: "%v"}`},
	Requests: "{cpu: '1', memory: 1Gi}",
})

// migration creates a migration of vmi named name, with virt-rules' added term sending it to
// node when node is not "", and returns it with the API server's error.
func migration(ns, name, vmi, node string) (*unstructured.Unstructured, error) {
	GinkgoHelper()
	var term map[string]any
	if node != "" {
		term = clustersuite.ToNode(node)
	}
	m := clustersuite.Migration(ns, name, vmi, term)
	return m, k8s.Create(ctx, m)
}

// nodeOf is the node the VMI runs on.
func nodeOf(ns, vmi string) string {
	GinkgoHelper()
	node, _ := field(get(vmiKind, ns, vmi)(Default), "status", "nodeName").(string)
	Expect(node).NotTo(BeEmpty())
	return node
}

// elsewhere is a node other than the one the VMI runs on.
func elsewhere(ns, vmi string) string {
	GinkgoHelper()
	current := nodeOf(ns, vmi)
	i := slices.IndexFunc(nodes, func(n string) bool { return n != current })
	return nodes[i]
}

// succeeded waits until migration name has moved its VMI, to node when node is not "".
func succeeded(ns, name, vmi, node string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(field(get(migrationKind, ns, name)(g), "status", "phase")).To(Equal("Succeeded"))
		if node != "" {
			g.Expect(field(get(vmiKind, ns, vmi)(g), "status", "nodeName")).To(Equal(node))
		}
	}).Should(Succeed())
}

// targetPods are the virt-launcher pods KubeVirt made for migration m.
func targetPods(g Gomega, ns string, m *unstructured.Unstructured) []corev1.Pod {
	return clustersuite.TargetPods(ctx, g, k8s, ns, m)
}

// podCreationFailures are the messages of virt-controller's FailedCreate Events about vmi.
func podCreationFailures(ns, vmi string) func(g Gomega) []string {
	return clustersuite.Events(ctx, k8s, ns, func(e corev1.Event) (string, bool) {
		return e.Message, e.InvolvedObject.Name == vmi && e.Reason == "FailedCreate"
	})
}

var _ = Describe("A cluster while virt-rules is down", Ordered, func() {
	var ns string

	BeforeAll(func() {
		By("letting KubeVirt run one migration at a time, so a migration can wait for its target pod")
		kv, err := kinds.ReadClusterKubeVirt(ctx, k8s)
		Expect(err).NotTo(HaveOccurred())
		Expect(kv).NotTo(BeNil())
		Expect(k8s.Patch(ctx, kv, client.RawPatch(types.MergePatchType,
			[]byte(`{"spec":{"configuration":{"migrations":{"parallelMigrationsPerCluster":1}}}}`)))).To(Succeed())
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "outage-"}}
		Expect(k8s.Create(ctx, nsObj)).To(Succeed())
		ns = nsObj.Name
	})

	It("creates and starts VMs while virt-rules is down (every webhook on VMs and their pods is Ignore)", func() {
		Expect(running).To(BeNil())
		for _, vm := range []struct {
			name string
			hold bool
		}{{"web", false}, {"db", false}, {"held", true}} {
			_, err := create(ns, vmYAML, vm.name, vm.name, testcluster.AnnotationHoldMigration, vm.hold)
			Expect(err).NotTo(HaveOccurred(), "VM %s", vm.name)
		}
		for _, vm := range []string{"web", "db", "held"} {
			Eventually(func(g Gomega) {
				g.Expect(field(get(vmiKind, ns, vm)(g), "status", "phase")).To(Equal("Running"))
			}).Should(Succeed(), "VMI %s runs", vm)
		}
	})

	It("refuses a migration with an added node constraint while virt-rules is down, naming the webhook", func() {
		_, err := migration(ns, "web-constrained-down", "web", elsewhere(ns, "web"))
		Expect(err).To(MatchError(ContainSubstring(fmt.Sprintf("failed calling webhook %q", migrationWebhook))))
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(kinds.VirtualMachineInstanceMigration)
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(BeEmpty(), "nothing was created")
		Expect(get(vmiKind, ns, "web")(Default).GetLabels()).NotTo(HaveKey(migrationtarget.LabelConstrainedMigration))
	})

	It("with virt-rules up, marks the VMI of a constrained migration so that its target pod, and only it, goes through the entry that fails closed", func() {
		startVirtRules()
		target := elsewhere(ns, "db")
		m, err := migration(ns, "db-constrained", "db", target)
		Expect(err).NotTo(HaveOccurred())
		succeeded(ns, m.GetName(), "db", target)
		Expect(get(vmiKind, ns, "db")(Default).GetLabels()).To(HaveKeyWithValue(migrationtarget.LabelConstrainedMigration, string(m.GetUID())))
		pods := targetPods(Default, ns, m)
		Expect(pods).To(HaveLen(1))
		Expect(pods[0].Labels).To(HaveKeyWithValue(migrationtarget.LabelConstrainedMigration, string(m.GetUID())))
		Expect(pods[0].Spec.NodeName).To(Equal(target))
		for _, t := range pods[0].Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			Expect(t.MatchFields).To(ContainElement(corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{target}}))
		}
	})

	It("migrates VMs whose migration adds nothing while virt-rules is down, a VMI marked by an earlier constrained migration too", func() {
		stopVirtRules()
		for _, vm := range []string{"web", "db"} {
			m, err := migration(ns, vm+"-down", vm, "")
			Expect(err).NotTo(HaveOccurred(), "migration of %s", vm)
			succeeded(ns, m.GetName(), vm, "")
		}
		Expect(get(vmiKind, ns, "db")(Default).GetLabels()).To(HaveKey(migrationtarget.LabelConstrainedMigration), "db still carries the earlier migration's mark")
	})

	It("does not create the target pod of a constrained migration while virt-rules is down, and does once it is back", func() {
		By("holding a migration of another VM, so the constrained one waits for KubeVirt's one slot")
		held, err := migration(ns, "held-down", "held", "")
		Expect(err).NotTo(HaveOccurred())
		Eventually(func(g Gomega) { g.Expect(targetPods(g, ns, held)).To(HaveLen(1)) }).Should(Succeed())

		By("creating the constrained migration with virt-rules up, then stopping virt-rules")
		startVirtRules()
		target := elsewhere(ns, "web")
		m, err := migration(ns, "web-constrained", "web", target)
		Expect(err).NotTo(HaveOccurred())
		Expect(get(vmiKind, ns, "web")(Default).GetLabels()).To(HaveKeyWithValue(migrationtarget.LabelConstrainedMigration, string(m.GetUID())))
		stopVirtRules()
		Consistently(func(g Gomega) []corev1.Pod { return targetPods(g, ns, m) }, "3s").Should(BeEmpty(), "KubeVirt waits for its one migration slot")

		By("freeing the slot: KubeVirt now renders the target pod, and the API server refuses it")
		Expect(k8s.Delete(ctx, held)).To(Succeed())
		Expect(k8s.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.GracePeriodSeconds(0),
			client.MatchingLabels{launcher.LabelMigrationJobUID: string(held.GetUID())})).To(Succeed())
		Eventually(podCreationFailures(ns, "web")).Should(ContainElement(
			ContainSubstring(fmt.Sprintf("failed calling webhook %q", targetPodWebhook))))
		Consistently(func(g Gomega) []corev1.Pod { return targetPods(g, ns, m) }, "3s").Should(BeEmpty())
		Expect(field(get(vmiKind, ns, "web")(Default), "status", "phase")).To(Equal("Running"))

		By("starting virt-rules again: KubeVirt's retry creates the constrained target pod, and the VM moves where the term says")
		startVirtRules()
		succeeded(ns, m.GetName(), "web", target)
		pods := targetPods(Default, ns, m)
		Expect(pods).NotTo(BeEmpty())
		for _, t := range pods[0].Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			Expect(t.MatchFields).To(ContainElement(corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{target}}))
		}
		var failures []string
		for _, msg := range podCreationFailures(ns, "web")(Default) {
			failures = append(failures, strings.SplitN(msg, "\n", 2)[0])
		}
		AddReportEntry("virt-controller's target pod creation failures while virt-rules was down", strings.Join(failures, "\n"))
	})
})
