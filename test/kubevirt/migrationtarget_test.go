package kubevirt_test

import (
	"reflect"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/migrationtarget"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

var (
	vmiKind       = kinds.NewObject(kinds.VirtualMachineInstance)
	migrationKind = kinds.NewObject(kinds.VirtualMachineInstanceMigration)
)

// vmYAML is a VM that starts at once: one CPU, 1Gi, a container disk; extra goes into the VMI
// template's spec.
var vmYAML = clustersuite.VMYAML(clustersuite.VMI{
	Metadata: []string{"labels: {app: %s}"},
	Spec:     []string{"%s"},
	Requests: "{cpu: '1', memory: 1Gi}",
})

// runningVM creates a VM as a user would and waits until KubeVirt runs its VMI; it returns
// the node the scheduler put it on.
func runningVM(ns, name, extra string) string {
	GinkgoHelper()
	apply(ns, vmYAML, name, name, extra)
	var node string
	Eventually(func(g Gomega) {
		vmi := get(vmiKind, ns, name)(g)
		g.Expect(field(vmi, "status", "phase")).To(Equal("Running"))
		node, _ = field(vmi, "status", "nodeName").(string)
	}).Should(Succeed())
	return node
}

// migrate creates a migration of vmi as a user would (kubectl create), carrying design 001's
// term in virt-rules' annotation when term is set; spec is merged into the migration's spec.
func migrate(ns, name, vmi string, term map[string]any, spec map[string]any) *unstructured.Unstructured {
	GinkgoHelper()
	m := clustersuite.Migration(ns, name, vmi, term)
	for k, v := range spec {
		m.Object["spec"].(map[string]any)[k] = v
	}
	Expect(k8s.Create(ctx, m)).To(Succeed())
	return m
}

var toNode = clustersuite.ToNode

// otherNode is a node of the suite other than those given, in sorted order.
func otherNode(not ...string) string {
	for _, n := range []string{"node-1", "node-2", "node-3", "node-4"} {
		if !slices.Contains(not, n) {
			return n
		}
	}
	Fail("no other node")
	return ""
}

// targetOutcome is a migration's phase and virt-rules' MigrationTargetAvailable condition.
func targetOutcome(ns, name string) func(g Gomega) map[string]any {
	return func(g Gomega) map[string]any {
		m := get(migrationKind, ns, name)(g)
		out := map[string]any{"phase": field(m, "status", "phase")}
		if c := kinds.Condition(m, migrationtarget.ConditionTargetAvailable); c != nil {
			out["status"], out["reason"], out["message"] = c["status"], c["reason"], c["message"]
		}
		return out
	}
}

// warnings are the reasons of the Warning Events about the object named name in ns.
func warnings(ns, name string) func(g Gomega) []string {
	return clustersuite.Events(ctx, k8s, ns, func(e corev1.Event) (string, bool) {
		return e.Reason, e.InvolvedObject.Name == name && e.Type == corev1.EventTypeWarning && e.Source.Component == migrationtarget.ControllerName
	})
}

// targetPods are the virt-launcher pods KubeVirt made for migration m.
func targetPods(g Gomega, ns string, m *unstructured.Unstructured) []corev1.Pod {
	return clustersuite.TargetPods(ctx, g, k8s, ns, m)
}

var _ = Describe("Migration target beside KubeVirt (design 001)", Ordered, func() {
	var ns, fedoraNode, hddNode string

	BeforeAll(func() {
		ns = namespace(nil)
		fedoraNode = runningVM(ns, "fedora", "")
		hddNode = runningVM(ns, "hdd", "nodeSelector: {disktype: hdd}")
	})

	It("moves a VM to the named node: virt-controller makes the target pod, virt-rules constrains it, kube-scheduler binds it", func() {
		target := otherNode(fedoraNode)
		m := migrate(ns, "to-"+target, "fedora", toNode(target), nil)
		Eventually(targetOutcome(ns, m.GetName())).Should(HaveKeyWithValue("phase", "Succeeded"))
		vmi := get(vmiKind, ns, "fedora")(Default)
		Expect(field(vmi, "status", "nodeName")).To(Equal(target))
		Expect(vmi.GetLabels()).To(HaveKeyWithValue("kubevirt.io/nodeName", target))
		pods := targetPods(Default, ns, m)
		Expect(pods).To(HaveLen(1))
		Expect(pods[0].Spec.NodeName).To(Equal(target))
		terms := pods[0].Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		Expect(terms).NotTo(BeEmpty())
		for _, t := range terms {
			Expect(t.MatchFields).To(ContainElement(corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{target}}))
		}
		// The VMI's own affinity is not changed: the term lives on the migration and its pod.
		Expect(field(vmi, "spec", "affinity")).To(BeNil())
		fedoraNode = target
	})

	It("keeps KubeVirt's own spec.addedNodeSelector working alongside the term", func() {
		zone := map[string]string{"node-1": "zone-a", "node-2": "zone-a", "node-3": "zone-b", "node-4": "zone-b"}
		// Both constraints hold on exactly one node other than the current one.
		target := otherNode(fedoraNode, hddNode)
		m := migrate(ns, "zoned", "fedora", map[string]any{"matchExpressions": []any{
			map[string]any{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": []any{fedoraNode}},
		}}, map[string]any{"addedNodeSelector": map[string]any{"topology.kubernetes.io/zone": zone[target], "kubernetes.io/hostname": target}})
		Eventually(targetOutcome(ns, m.GetName())).Should(HaveKeyWithValue("phase", "Succeeded"))
		Expect(field(get(vmiKind, ns, "fedora")(Default), "status", "nodeName")).To(Equal(target))
		fedoraNode = target
	})

	DescribeTable("fails a migration with no node to go to at once: phase Failed, the reason, a Warning Event; the VM keeps running",
		func(name string, vmi func() string, target func() string, reason string) {
			source := get(vmiKind, ns, vmi())(Default)
			sourceNode := field(source, "status", "nodeName")
			m := migrate(ns, name, vmi(), toNode(target()), nil)
			Eventually(targetOutcome(ns, name)).Should(And(
				HaveKeyWithValue("phase", "Failed"),
				HaveKeyWithValue("status", "False"),
				HaveKeyWithValue("reason", reason),
			))
			Eventually(warnings(ns, name)).Should(ContainElement(reason))
			// Nothing else is disturbed: the VMI runs where it ran, its placement untouched (KubeVirt
			// itself writes the VMI's spec, so its generation moves), and no target pod is left
			// running.
			after := get(vmiKind, ns, vmi())(Default)
			Expect(field(after, "status", "phase")).To(Equal("Running"))
			Expect(field(after, "status", "nodeName")).To(Equal(sourceNode))
			for _, f := range []string{"affinity", "nodeSelector"} {
				Expect(reflect.DeepEqual(field(after, "spec", f), field(source, "spec", f))).To(BeTrue(), "VMI spec.%s changed", f)
			}
			Eventually(func(g Gomega) []string {
				var running []string
				for _, p := range targetPods(g, ns, m) {
					if p.Status.Phase == corev1.PodRunning {
						running = append(running, p.Name)
					}
				}
				return running
			}).Should(BeEmpty())
		},
		Entry("NodeNotFound", "to-missing", func() string { return "fedora" }, func() string { return "node-9" }, engine.ReasonNodeNotFound),
		Entry("AlreadyOnNode", "to-itself", func() string { return "fedora" }, func() string { return fedoraNode }, engine.ReasonAlreadyOnNode),
		Entry("ConflictsWithVMConstraints", "hdd-to-ssd", func() string { return "hdd" }, func() string { return "node-1" }, engine.ReasonConflictsWithVMConstraints),
	)

	It("fails a migration to a node the VM cannot fit on, counting the pods there (NoCapacity)", func() {
		full := otherNode(fedoraNode, hddNode)
		filler := clustersuite.FillerPod(ns, "fills-"+full, full, "busybox", corev1.ResourceCPU, "31500m")
		Expect(k8s.Create(ctx, filler)).To(Succeed())
		DeferCleanup(func() {
			Expect(client.IgnoreNotFound(k8s.Delete(ctx, filler, client.GracePeriodSeconds(0)))).To(Succeed())
		})
		migrate(ns, "to-full", "fedora", toNode(full), nil)
		Eventually(targetOutcome(ns, "to-full")).Should(And(
			HaveKeyWithValue("phase", "Failed"),
			HaveKeyWithValue("reason", engine.ReasonNoCapacity),
			HaveKeyWithValue("message", ContainSubstring(full)),
		))
		Expect(field(get(vmiKind, ns, "fedora")(Default), "status", "phase")).To(Equal("Running"))
	})

	It("leaves a migration without spec.vmiName to KubeVirt, whose webhook refuses it (its schema does not)", func() {
		m := clustersuite.Migration(ns, "no-vmi", "", nil)
		m.Object["spec"] = map[string]any{}
		m.SetAnnotations(map[string]string{migrationtarget.AnnotationAddedTerm: `{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}`})
		err := k8s.Create(ctx, m, client.DryRunAll)
		Expect(err).To(MatchError(ContainSubstring(`admission webhook "migration-create-validator.kubevirt.io" denied the request`)))
	})

	It("never sees the design's spec.addedNodeSelectorTerm: KubeVirt's schema has no such field, the API server drops it and warns", func() {
		c, warnings := warnedClient()
		m := clustersuite.Migration(ns, "design-field", "hdd", nil)
		m.Object["spec"].(map[string]any)["addedNodeSelectorTerm"] = toNode("node-9")
		Expect(c.Create(ctx, m, client.FieldValidation("Warn"))).To(Succeed())
		Expect(field(m, "spec", "addedNodeSelectorTerm")).To(BeNil(), "stored without the field")
		Expect(strings.Join(warnings.texts(), "\n")).To(ContainSubstring(`unknown field "spec.addedNodeSelectorTerm"`))
	})
})
