package scheduler_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/controllers/migrationtarget"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// The source node's host-model CPU needs a feature a host-model VMI then requires of targets
// (virt-handler's node labeller: host-model-required-features.node.kubevirt.io/<feature>).
const requiredFeature = "pcid"

// source is the node every VM starts on: a Skylake host whose host-model CPU requires pcid.
func source() *corev1.Node {
	return testcluster.Node(sourceNode, testcluster.Skylake, map[string]string{
		"host-model-required-features.node.kubevirt.io/" + requiredFeature: "true",
		"cpu-feature.node.kubevirt.io/" + requiredFeature:                  "true",
		"rack":                   "r1",
		"kubevirt.io/cpumanager": "true",
		clusterSelectorKey:       "vms",
	})
}

// clusterSelectorKey is the label the KubeVirt CR's developerConfiguration.nodeSelectors asks
// of every node a launcher pod goes to.
const clusterSelectorKey = "virt-rules.test/pool"

// zooNode is one node of the zoo: a Skylake host like the source, changed by change; without
// is a resource it loses once Ready (testcluster waits for KubeVirt's device plugins).
type zooNode struct {
	name    string
	change  func(n *corev1.Node)
	without corev1.ResourceName
}

var (
	icelake = testcluster.CPU{Vendor: "Intel", HostModel: "Icelake-Server", Models: append([]string{"Icelake-Server"}, testcluster.Skylake.Models...)}
	// Icelake hosts that cannot run Skylake host-model guests (no cpu-model-migration label for
	// Skylake-Client-IBRS) nor the named Broadwell model.
	icelakeOnly = testcluster.CPU{Vendor: "Intel", HostModel: "Icelake-Server", Models: []string{"Icelake-Server", "Cascadelake-Server"}}
	// AMD hosts that name Intel models: only the vendor keeps Intel guests off them.
	amd = testcluster.CPU{Vendor: "AMD", HostModel: "EPYC-Rome", Models: append([]string{"EPYC-Rome"}, testcluster.Skylake.Models...)}
)

func withCPU(cpu testcluster.CPU) func(*corev1.Node) {
	return func(n *corev1.Node) {
		fresh := testcluster.Node(n.Name, cpu, nil)
		for k := range n.Labels {
			if strings.Contains(k, ".node.kubevirt.io/") && !strings.HasPrefix(k, "cpu-feature.") && !strings.HasPrefix(k, "machine-type.") {
				delete(n.Labels, k)
			}
		}
		for k, v := range fresh.Labels {
			if strings.Contains(k, ".node.kubevirt.io/") && !strings.HasPrefix(k, "machine-type.") {
				n.Labels[k] = v
			}
		}
	}
}

func label(k, v string) func(*corev1.Node) { return func(n *corev1.Node) { n.Labels[k] = v } }

func unlabel(k string) func(*corev1.Node) { return func(n *corev1.Node) { delete(n.Labels, k) } }

func taint(key string, effect corev1.TaintEffect) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: "true", Effect: effect})
	}
}

func allocatable(name corev1.ResourceName, q string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Status.Capacity[name], n.Status.Allocatable[name] = resource.MustParse(q), resource.MustParse(q)
	}
}

func all(changes ...func(*corev1.Node)) func(*corev1.Node) {
	return func(n *corev1.Node) {
		for _, c := range changes {
			c(n)
		}
	}
}

// zoo are the nodes that join once the VMs run on the source node, each differing from it in
// one way (some in two, to reach the named-model VM). Which of them the scheduler accepts is
// for the scheduler to say.
var zoo = []zooNode{
	{"same-1", label("rack", "r1"), ""},
	{"same-2", nil, ""},
	{"icelake-runs-skylake", withCPU(icelake), ""},
	{"icelake-only", all(withCPU(icelakeOnly), label("rack", "r1")), ""},
	{"amd", all(withCPU(amd), label("rack", "r1")), ""},
	{"no-required-feature", unlabel("cpu-feature.node.kubevirt.io/" + requiredFeature), ""},
	{"no-machine-type", unlabel("machine-type.node.kubevirt.io/" + testcluster.MachineType), ""},
	{"arm64", label("kubernetes.io/arch", "arm64"), ""},
	{"kubevirt-unschedulable", label("kubevirt.io/schedulable", "false"), ""},
	{"tainted", all(taint("maintenance", corev1.TaintEffectNoSchedule), label("rack", "r1")), ""},
	{"tainted-tolerated", taint("dedicated", corev1.TaintEffectNoSchedule), ""},
	{"tainted-prefer", taint("noisy", corev1.TaintEffectPreferNoSchedule), ""},
	{"tainted-noexecute", taint("evicting", corev1.TaintEffectNoExecute), ""},
	{"cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }, ""},
	{"small-memory", allocatable(corev1.ResourceMemory, "1Gi"), ""},
	{"busy", all(allocatable(corev1.ResourceMemory, "4Gi"), label("rack", "r1")), ""},
	{"no-pods-left", allocatable(corev1.ResourcePods, "0"), ""},
	{"no-kvm", nil, "devices.kubevirt.io/kvm"},
	{"one-cpu", allocatable(corev1.ResourceCPU, "1"), ""},
	{"no-cpumanager", unlabel("kubevirt.io/cpumanager"), ""},
	{"outside-the-pool", label(clusterSelectorKey, "other"), ""},
}

// The VMs: host-model (KubeVirt's default CPU) and a named model; both tolerate the
// dedicated taint, and their migrations are held (see the package doc).
var vmYAML = clustersuite.VMYAML(clustersuite.VMI{
	Metadata: []string{"labels: {app: %s}", `annotations: {%s: "%v"}`},
	Spec:     []string{`tolerations: [{key: dedicated, operator: Equal, value: "true", effect: NoSchedule}]`},
	Domain:   []string{"%s"},
	Requests: "{cpu: '1', memory: 1Gi}",
})

var (
	vmiKind       = kinds.VirtualMachineInstance
	migrationKind = kinds.VirtualMachineInstanceMigration
)

var _ = Describe("Migration target candidates: the nodes kube-scheduler accepts for the target pod virt-controller creates (design 001)", Ordered, func() {
	var ns string

	BeforeAll(func() {
		By("asking, in the KubeVirt CR, that every launcher pod go to a node of the pool")
		kv := kubevirtCR()
		Expect(kv).NotTo(BeNil())
		patch := []byte(fmt.Sprintf(`{"spec":{"configuration":{"developerConfiguration":{"nodeSelectors":{%q:"vms"}}}}}`, clusterSelectorKey))
		Expect(k8s.Patch(ctx, kv, client.RawPatch(types.MergePatchType, patch))).To(Succeed())

		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "scheduler-"}}
		Expect(k8s.Create(ctx, nsObj)).To(Succeed())
		ns = nsObj.Name
		for _, vm := range []struct {
			name, cpu string
			hold      bool
		}{
			{"host-model", "", true}, {"broadwell", "cpu: {model: Broadwell-noTSX-IBRS}", true},
			{"dedicated", "cpu: {dedicatedCpuPlacement: true}", true}, {"traveller", "", false},
		} {
			createYAML(ns, fmt.Sprintf(vmYAML, vm.name, vm.name, testcluster.AnnotationHoldMigration, vm.hold, vm.cpu))
		}
		for _, vm := range []string{"host-model", "broadwell", "dedicated", "traveller"} {
			Eventually(func(g Gomega) {
				vmi := get(vmiKind, ns, vm)(g)
				g.Expect(field(vmi, "status", "phase")).To(Equal("Running"))
				g.Expect(field(vmi, "status", "nodeName")).To(Equal(sourceNode))
			}).Should(Succeed())
		}

		By("joining the zoo of nodes, each differing from the source node")
		var nodes []*corev1.Node
		for _, z := range zoo {
			n := testcluster.Node(z.name, testcluster.Skylake, map[string]string{
				"cpu-feature.node.kubevirt.io/" + requiredFeature: "true",
				"rack":                   "r2",
				"kubevirt.io/cpumanager": "true",
				clusterSelectorKey:       "vms",
			})
			if z.change != nil {
				z.change(n)
			}
			nodes = append(nodes, n)
		}
		Expect(cluster.CreateNodes(ctx, nodes...)).To(Succeed())
		for _, z := range zoo {
			if z.without == "" {
				continue
			}
			gone := map[string]any{string(z.without): nil}
			patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": gone, "allocatable": gone}})
			Expect(err).NotTo(HaveOccurred())
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: z.name}}
			Expect(k8s.Status().Patch(ctx, n, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
			Eventually(func(g Gomega) {
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(n), n)).To(Succeed())
				g.Expect(n.Status.Allocatable).NotTo(HaveKey(z.without))
			}).Should(Succeed())
		}
		// busy: a pod already asks for 3Gi of its 4Gi.
		filler := clustersuite.FillerPod(ns, "filler", "busy", "registry.k8s.io/pause:3.10", corev1.ResourceMemory, "3Gi")
		Expect(k8s.Create(ctx, filler)).To(Succeed())
	})

	It("takes a host-model VM to exactly the nodes the scheduler accepts", func() {
		judge(ns, "host-model", nil)
	})

	It("takes a VM with dedicated CPUs only to nodes with the CPU manager, as the scheduler does", func() {
		judge(ns, "dedicated", nil)
	})

	It("takes a host-model VM that migrated before to the nodes that can run the CPU of the node it first started on", func() {
		By("migrating it once, to the Icelake node that runs Skylake guests (virt-rules' added term)")
		first := clustersuite.Migration(ns, "traveller-first", "traveller", clustersuite.ToNode("icelake-runs-skylake"))
		Expect(k8s.Create(ctx, first)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(field(get(migrationKind, ns, "traveller-first")(g), "status", "phase")).To(Equal("Succeeded"))
			g.Expect(field(get(vmiKind, ns, "traveller")(g), "status", "nodeName")).To(Equal("icelake-runs-skylake"))
		}).Should(Succeed())
		By("holding its next migration, which KubeVirt renders from its Icelake launcher pod")
		vmi := get(vmiKind, ns, "traveller")(Default)
		patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, testcluster.AnnotationHoldMigration))
		Expect(k8s.Patch(ctx, vmi, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
		judge(ns, "traveller", nil)
	})

	It("takes a named-model VM with virt-rules' added term to exactly the nodes the scheduler accepts for the pod virt-rules constrained", func() {
		judge(ns, "broadwell", map[string]any{"matchExpressions": []any{
			map[string]any{"key": "rack", "operator": "In", "values": []any{"r1"}},
		}})
	})
})

// judge migrates vmiName (with virt-rules' added term when term is set), then compares, node
// by node, virt-rules' answer for the migration with kube-scheduler's for its target pod.
func judge(ns, vmiName string, term map[string]any) {
	GinkgoHelper()
	m := clustersuite.Migration(ns, vmiName+"-migration", vmiName, term)
	Expect(k8s.Create(ctx, m)).To(Succeed())
	// A held migration stays in flight, and KubeVirt runs at most two outbound migrations per
	// node: each is deleted once judged, with its target pod (left behind by KubeVirt, as the
	// target never came up), before the next.
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, m))).To(Succeed())
		Expect(k8s.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.GracePeriodSeconds(0),
			client.MatchingLabels{launcher.LabelMigrationJobUID: string(m.GetUID())})).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(clustersuite.TargetPods(ctx, g, k8s, ns, m)).To(BeEmpty())
		}).Should(Succeed())
	})

	By("waiting for virt-controller's target pod and kube-scheduler's answer for it")
	var target corev1.Pod
	Eventually(func(g Gomega) {
		pods := clustersuite.TargetPods(ctx, g, k8s, ns, m)
		g.Expect(pods).To(HaveLen(1))
		target = pods[0]
		g.Expect(target.Spec.NodeName != "" || unschedulable(&target) != "").To(BeTrue(), "target pod %s not yet judged", target.Name)
	}).Should(Succeed())

	Expect(target.Spec.NodeSelector).To(HaveKeyWithValue(clusterSelectorKey, "vms"), "virt-controller renders the KubeVirt CR's nodeSelectors into the target pod")

	By("asking virt-rules, on the cluster as it was when the target pod was made")
	vmi := get(vmiKind, ns, vmiName)(Default)
	migration := get(migrationKind, ns, m.GetName())(Default)
	var nodeList corev1.NodeList
	Expect(k8s.List(ctx, &nodeList)).To(Succeed())
	nodes := eng.NewNodes()
	Expect(nodes.Sync(nodeList.Items)).To(Succeed())
	var podList corev1.PodList
	Expect(k8s.List(ctx, &podList)).To(Succeed())
	var pods []*unstructured.Unstructured
	for i := range podList.Items {
		if podList.Items[i].UID == target.UID {
			continue
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&podList.Items[i])
		Expect(err).NotTo(HaveOccurred())
		pods = append(pods, &unstructured.Unstructured{Object: obj})
	}
	sourcePod := engine.SourceLauncherPod(vmi, pods)
	Expect(sourcePod).NotTo(BeNil())
	x, err := eng.ExplainMigrationTarget(ctx, engine.MigrationTargetInput{
		Migration: migration, VMI: vmi, SourcePod: sourcePod, KubeVirt: kubevirtCR(), Nodes: nodes, Pods: pods,
	})
	Expect(err).NotTo(HaveOccurred())
	virtRules := map[string]string{}
	for _, n := range x.Nodes {
		if n.Candidate {
			virtRules[n.Node] = ""
		} else {
			virtRules[n.Node] = n.Reason
		}
	}

	By("asking kube-scheduler about every node, one pinned copy of the target pod each")
	scheduler := map[string]string{}
	if target.Spec.NodeName != "" {
		scheduler[target.Spec.NodeName] = ""
	}
	copies := map[string]*corev1.Pod{}
	for _, n := range nodeList.Items {
		if _, judged := scheduler[n.Name]; judged {
			continue
		}
		c := pinnedCopy(&target, n.Name)
		Expect(k8s.Create(ctx, c)).To(Succeed(), "copy of the target pod for node %s", n.Name)
		copies[n.Name] = c
	}
	for node, c := range copies {
		Eventually(func(g Gomega) {
			var got corev1.Pod
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(c), &got)).To(Succeed())
			switch why := unschedulable(&got); {
			case got.Spec.NodeName == node:
				scheduler[node] = ""
			case why != "":
				scheduler[node] = why
			default:
				g.Expect(got.Spec.NodeName).NotTo(BeEmpty(), "copy for %s not yet judged", node)
				Fail(fmt.Sprintf("copy pinned to %s bound to %s", node, got.Spec.NodeName))
			}
		}).Should(Succeed())
	}
	for _, c := range copies {
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, c, client.GracePeriodSeconds(0)))).To(Succeed())
	}

	var table strings.Builder
	var mismatches []string
	accepted := 0
	for _, node := range slices.Sorted(maps.Keys(scheduler)) {
		why, fits := scheduler[node], scheduler[node] == ""
		reason, known := virtRules[node]
		candidate := known && reason == ""
		if fits {
			accepted++
		}
		mark := "agree"
		if !known || candidate != fits {
			mark = "DIFFER"
			mismatches = append(mismatches, node)
		}
		fmt.Fprintf(&table, "%-24s scheduler: %-5v virt-rules: %-5v %-6s | virt-rules: %s | scheduler: %s\n", node, fits, candidate, mark, reason, firstLine(why))
	}
	AddReportEntry(fmt.Sprintf("%s: %d nodes, %d accepted by kube-scheduler, %d differ", vmiName, len(scheduler), accepted, len(mismatches)), table.String())
	GinkgoWriter.Print(table.String())
	Expect(mismatches).To(BeEmpty(), "nodes where virt-rules and kube-scheduler differ:\n%s", table.String())
	// The zoo is built so that both answers occur: a suite where every node fits, or none,
	// would prove nothing.
	Expect(accepted).To(BeNumerically(">", 0))
	Expect(accepted).To(BeNumerically("<", len(scheduler)))

	if term == nil {
		// A migration that adds no constraint is KubeVirt's alone: virt-rules writes nothing.
		Consistently(func(g Gomega) map[string]any {
			return kinds.Condition(get(migrationKind, ns, m.GetName())(g), migrationtarget.ConditionTargetAvailable)
		}, "2s").Should(BeNil())
		return
	}
	By("the target pod the scheduler judged is the one virt-rules constrained: the term is in every required term")
	Expect(target.Spec.Affinity).NotTo(BeNil())
	Expect(target.Spec.Affinity.NodeAffinity).NotTo(BeNil())
	required := target.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	Expect(required).NotTo(BeNil())
	Expect(required.NodeSelectorTerms).NotTo(BeEmpty())
	for _, t := range required.NodeSelectorTerms {
		Expect(t.MatchExpressions).To(ContainElement(corev1.NodeSelectorRequirement{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"r1"}}))
	}
}

// kubevirtCR is the cluster's KubeVirt CR, as virt-rules' controller reads it.
func kubevirtCR() *unstructured.Unstructured {
	GinkgoHelper()
	kv, err := kinds.ReadClusterKubeVirt(ctx, k8s)
	Expect(err).NotTo(HaveOccurred())
	return kv
}

// pinnedCopy is target as a plain pod pinned to node: the same spec (requests, overhead,
// affinity, tolerations, node selector) with kubernetes.io/hostname ANDed into its node
// selector, without KubeVirt's labels and owner, so neither KubeVirt nor virt-rules acts on it.
func pinnedCopy(target *corev1.Pod, node string) *corev1.Pod {
	spec := target.Spec.DeepCopy()
	spec.NodeName = ""
	// The Priority admission plugin sets these from priorityClassName again.
	spec.Priority, spec.PreemptionPolicy = nil, nil
	selector := maps.Clone(spec.NodeSelector)
	if selector == nil {
		selector = map[string]string{}
	}
	if v, ok := selector[corev1.LabelHostname]; ok && v != node {
		Fail(fmt.Sprintf("target pod already selects hostname %s", v))
	}
	selector[corev1.LabelHostname] = node
	spec.NodeSelector = selector
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "judge-" + node + "-" + string(target.UID)[:8],
			Namespace: target.Namespace,
			Labels:    map[string]string{"virt-rules.test/judge": "true"},
		},
		Spec: *spec,
	}
}

// unschedulable is kube-scheduler's message for a pod it could not place, "" if none yet.
func unschedulable(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

// firstLine is the scheduler's message without its preemption part.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	s, _, _ = strings.Cut(s, " no new claims")
	s, _, _ = strings.Cut(s, " preemption:")
	return s
}

func createYAML(ns, doc string) {
	GinkgoHelper()
	obj := clustersuite.FromYAML(doc)
	obj.SetNamespace(ns)
	Expect(k8s.Create(ctx, obj)).To(Succeed())
}

// get reads the object of kind gvk named ns/name, as stored.
func get(gvk schema.GroupVersionKind, ns, name string) func(g Gomega) *unstructured.Unstructured {
	return clustersuite.Get(ctx, k8s, gvk, ns, name)
}

var field = clustersuite.Field
