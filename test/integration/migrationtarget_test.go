package integration_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/controllers/migrationtarget"
	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// node is a Ready node with allocatable room for four 1-CPU, 2Gi VMIs.
func node(name string, labels map[string]string) *corev1.Node {
	GinkgoHelper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	create(n)
	// The API server taints a new node not-ready until a kubelet reports; there is none.
	// A merge patch: the node labeller may already be writing this node's labels.
	Expect(k8sClient.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"taints":null}}`)))).To(Succeed())
	base := n.DeepCopy()
	n.Status.Allocatable = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110"),
	}
	n.Status.Capacity = n.Status.Allocatable
	Expect(k8sClient.Status().Patch(ctx, n, client.MergeFrom(base))).To(Succeed())
	return n
}

// migration is a VirtualMachineInstanceMigration of vmi adding term (design 001) in the
// annotation that carries it.
func migration(ns, name, vmi string, term map[string]any) *unstructured.Unstructured {
	GinkgoHelper()
	m := clustersuite.Migration(ns, name, vmi, term)
	create(m)
	return m
}

var (
	withTerm = clustersuite.WithTerm
	toNode   = clustersuite.ToNode
)

// targetCondition is the migration's phase and its MigrationTargetAvailable condition.
func targetCondition(ns, name string) func(g Gomega) map[string]any {
	return func(g Gomega) map[string]any {
		m := newUnstructured(migrationtarget.GVKMigration)
		g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, m)).To(Succeed())
		phase, _, _ := unstructured.NestedString(m.Object, "status", "phase")
		conditions, _, _ := unstructured.NestedSlice(m.Object, "status", "conditions")
		for _, c := range conditions {
			if c := c.(map[string]any); c["type"] == migrationtarget.ConditionTargetAvailable {
				return map[string]any{"phase": phase, "status": c["status"], "reason": c["reason"], "message": c["message"]}
			}
		}
		return map[string]any{"phase": phase}
	}
}

// warnings are the reasons of the Warning Events on the object named name in ns.
func warnings(ns, name string) func(g Gomega) []string {
	return clustersuite.Events(ctx, k8sClient, ns, func(e corev1.Event) (string, bool) {
		return e.Reason, e.InvolvedObject.Name == name && e.Type == corev1.EventTypeWarning
	})
}

// launcherPod is a virt-launcher pod as KubeVirt creates it for vmi; a migration's target pod
// when migrationUID is set.
func launcherPod(ns, name string, vmi *unstructured.Unstructured, migrationUID types.UID) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{launcher.LabelApp: launcher.App},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmi.GetName(), UID: vmi.GetUID(),
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "virt-launcher"}}},
	}
	if migrationUID != "" {
		pod.Labels[launcher.LabelMigrationJobUID] = string(migrationUID)
	}
	return pod
}

var _ = Describe("Migration target", Ordered, func() {
	var (
		ns   string
		stop func()
		// vmiSpecs are the specs of the VMIs as created: the controller and the webhooks
		// never change them (the migrationpolicy controller annotates them).
		vmiSpecs = map[string]any{}
	)

	vmi := func(name, yamlSpec string) *unstructured.Unstructured {
		GinkgoHelper()
		v := fromYAML(fmt.Sprintf("apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: %s, namespace: %s}\n%s", name, ns, yamlSpec))
		create(v)
		vmiSpecs[name] = v.Object["spec"]
		return v
	}
	// Design 001's VMI: 1 CPU and 2Gi, running on mt-node-1.
	running := "spec:\n  domain: {resources: {requests: {cpu: '1', memory: 2Gi}}, devices: {}}\n  %s\nstatus: {nodeName: mt-node-1}\n"

	BeforeAll(func() {
		ns = createNamespace()
		// The VMI is host-model (no model given): KubeVirt's node labels say its CPU (a node
		// without host-model-cpu label takes no host-model migration), and virt-handler marks them
		// schedulable (KubeVirt's launcher pods require kubevirt.io/schedulable=true).
		cpu := func(disk string) map[string]string {
			return map[string]string{"disktype": disk, "kubevirt.io/schedulable": "true", "host-model-cpu.node.kubevirt.io/Skylake": "true", "cpu-model-migration.node.kubevirt.io/Skylake": "true"}
		}
		node("mt-node-1", cpu("ssd"))
		node("mt-node-2", cpu("ssd"))
		node("mt-node-3", cpu("hdd"))
		vmi("vmi-fedora", fmt.Sprintf(running, ""))
		vmi("vmi-hdd", fmt.Sprintf(running, "nodeSelector: {disktype: hdd}"))
		stop = serveWebhooks()
	})

	AfterAll(func() {
		if stop != nil {
			stop()
		}
		for name, spec := range vmiSpecs {
			v := newUnstructured(migrationtarget.GVKVirtualMachineInstance)
			Expect(k8sClient.Get(ctx, vmiKey(ns, name), v)).To(Succeed())
			Expect(v.Object["spec"]).To(Equal(spec), "VMI %s spec changed", name)
			Expect(v.GetGeneration()).To(BeEquivalentTo(1), "VMI %s spec changed", name)
		}
	})

	It("migrates to the named node and puts the term on the target pod only (design 001's positive test)", func() {
		m := migration(ns, "to-node-2", "vmi-fedora", toNode("mt-node-2"))
		Eventually(targetCondition(ns, "to-node-2")).Should(Equal(map[string]any{
			"phase": "", "status": "True", "reason": migrationtarget.ReasonCandidatesFound, "message": "candidate nodes: mt-node-2",
		}))

		v := newUnstructured(migrationtarget.GVKVirtualMachineInstance)
		Expect(k8sClient.Get(ctx, vmiKey(ns, "vmi-fedora"), v)).To(Succeed())
		pod := launcherPod(ns, "virt-launcher-vmi-fedora-target", v, m.GetUID())
		create(pod)
		Expect(pod.Spec.Affinity).NotTo(BeNil(), "the webhook writes the target pod's affinity")
		Expect(pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms).To(Equal([]corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"mt-node-2"}}},
		}}))
	})

	It("ANDs the term into every required term the target pod already has", func() {
		m := migration(ns, "ssd-to-node-2", "vmi-fedora", toNode("mt-node-2"))
		v := newUnstructured(migrationtarget.GVKVirtualMachineInstance)
		Expect(k8sClient.Get(ctx, vmiKey(ns, "vmi-fedora"), v)).To(Succeed())
		pod := launcherPod(ns, "virt-launcher-vmi-fedora-ssd", v, m.GetUID())
		zone := func(z string) corev1.NodeSelectorTerm {
			return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{z}}}}
		}
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{zone("a"), zone("b")}},
		}}
		create(pod)
		terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		Expect(terms).To(HaveLen(2))
		for i, z := range []string{"a", "b"} {
			Expect(terms[i].MatchExpressions).To(Equal(zone(z).MatchExpressions))
			Expect(terms[i].MatchFields).To(Equal(toNodeRequirement("mt-node-2")))
		}
	})

	It("leaves pods that are not migration targets, and migrations without a term, alone", func() {
		migration(ns, "no-term", "vmi-fedora", nil)
		Consistently(targetCondition(ns, "no-term")).WithTimeout(2 * time.Second).Should(Equal(map[string]any{"phase": ""}))

		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain", Labels: map[string]string{launcher.LabelMigrationJobUID: "x"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		create(pod)
		Expect(pod.Spec.Affinity).To(BeNil())
	})

	DescribeTable("fails a migration with no target at once: phase Failed, a condition and an Event with the reason",
		func(name, vmiName, target, reason, message string) {
			migration(ns, name, vmiName, toNode(target))
			Eventually(targetCondition(ns, name)).Should(And(
				HaveKeyWithValue("phase", migrationtarget.PhaseFailed),
				HaveKeyWithValue("status", "False"),
				HaveKeyWithValue("reason", reason),
				HaveKeyWithValue("message", ContainSubstring(message)),
			))
			Eventually(warnings(ns, name)).Should(Equal([]string{reason}))
		},
		Entry("the node does not exist", "to-missing", "vmi-fedora", "mt-node-9", engine.ReasonNodeNotFound, "node mt-node-9 does not exist"),
		Entry("the VM already runs on that node", "to-itself", "vmi-fedora", "mt-node-1", engine.ReasonAlreadyOnNode, "already runs on node mt-node-1"),
		Entry("the node conflicts with the VM's own nodeSelector", "ssd-for-hdd", "vmi-hdd", "mt-node-2", engine.ReasonConflictsWithVMConstraints, "mt-node-2"),
	)

	It("fails a migration to a node the VM cannot fit on, counting the pods on it (NoCapacity)", func() {
		full := clustersuite.FillerPod(ns, "fills-node-3", "mt-node-3", "busybox", corev1.ResourceCPU, "3500m")
		create(full)
		migration(ns, "hdd-to-full-node", "vmi-hdd", toNode("mt-node-3"))
		Eventually(targetCondition(ns, "hdd-to-full-node")).Should(And(
			HaveKeyWithValue("phase", migrationtarget.PhaseFailed),
			HaveKeyWithValue("reason", engine.ReasonNoCapacity),
			HaveKeyWithValue("message", ContainSubstring("mt-node-3")),
		))
		Eventually(warnings(ns, "hdd-to-full-node")).Should(Equal([]string{engine.ReasonNoCapacity}))
	})

	It("injects the migratability affinity the KubeVirt CR asks for at a VMI's first scheduling (design 002)", func() {
		// A cluster has one KubeVirt CR: remove those other specs left.
		deleteKubeVirts()
		kv := fromYAML(`apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata:
  name: kubevirt
  namespace: ` + ns + `
  annotations:
    migrations.virt-rules.io/require-host-model-migratability-level: "50"
    migrations.virt-rules.io/preferred-host-model-migratability-level: '{"level": 80, "weight": 10}'
spec: {}
`)
		create(kv)
		starting := vmi("vmi-starting", "spec:\n  domain: {cpu: {model: host-model}, devices: {}}\n")
		level := corev1.NodeSelectorRequirement{Key: nodelabeller.LabelLevel, Operator: corev1.NodeSelectorOpGt, Values: []string{"49"}}
		disk := corev1.NodeSelectorRequirement{Key: "disktype", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}
		var pod *corev1.Pod
		// The webhook reads the KubeVirt CR from its cache: a pod created before the cache
		// holds it starts without the affinity, as it would without virt-rules.
		Eventually(func(g Gomega) []corev1.NodeSelectorTerm {
			pod = launcherPod(ns, "", starting, "")
			pod.GenerateName = "virt-launcher-vmi-starting-"
			// KubeVirt has put an affinity of its own on the pod; the level is ANDed into it.
			pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{disk},
				}}},
			}}
			g.Expect(tryCreate(pod)).To(Succeed())
			return pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		}).Should(Equal([]corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{disk, level}}}))
		Expect(pod.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution).To(Equal([]corev1.PreferredSchedulingTerm{{
			Weight: 10, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: nodelabeller.LabelLevel, Operator: corev1.NodeSelectorOpGt, Values: []string{"79"}},
			}},
		}}))
	})
})

func toNodeRequirement(name string) []corev1.NodeSelectorRequirement {
	return []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{name}}}
}
