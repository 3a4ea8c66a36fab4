package kubevirt_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// The drain preview judged by KubeVirt itself: eval --drain says what draining a node does to
// each VMI on it; KubeVirt's own eviction webhook (virt-api's virt-launcher eviction
// interceptor) answers an eviction of each launcher pod, and virt-controller's evacuation
// migrates what it marked. Whether a VMI is live-migratable is virt-handler's finding, which
// the stand-in reports as told (testcluster.AnnotationNotLiveMigratable).
var _ = Describe("A node drain: eval --drain's preview against KubeVirt's eviction webhook and evacuation", Ordered, func() {
	// The VMIs select the two nodes of the pair: they start on drain-a, the only one at first,
	// and the drain can move them only to drain-b.
	const node, other, pair = "drain-a", "drain-b", "drain.virt-rules.io/pair"
	var binary, ns string

	addNode := func(name string) {
		GinkgoHelper()
		Expect(cluster.CreateNodes(ctx, testcluster.Node(name, testcluster.Skylake, map[string]string{pair: "true"}))).To(Succeed())
		DeferCleanup(func() {
			Expect(client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}))).To(Succeed())
		})
	}

	BeforeAll(func(sctx SpecContext) {
		binary = clustersuite.BuildVirtRules(sctx, repoRoot, "")
		ns = namespace(nil)
		addNode(node)
	})

	It("previews for each VMI what KubeVirt does when its launcher pod is evicted", func() {
		cases := []struct{ name, strategy, notMigratable, want string }{
			{"migrates", "LiveMigrate", "", "migrate"},
			{"stuck", "LiveMigrate", "DisksNotLiveMigratable", "stuck"},
			{"stops", "None", "", "shutdown"},
			{"stops-if-not-migratable", "LiveMigrateIfPossible", "InterfaceNotLiveMigratable", "shutdown"},
			{"migrates-if-possible", "LiveMigrateIfPossible", "", "migrate"},
			{"external", "External", "", "external"},
		}
		for _, c := range cases {
			annotations := "{}"
			if c.notMigratable != "" {
				annotations = fmt.Sprintf("{%q: %s}", testcluster.AnnotationNotLiveMigratable, c.notMigratable)
			}
			apply(ns, `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: %s
  annotations: %s
`+clustersuite.VMI{
				Spec: []string{
					"evictionStrategy: %s",
					"nodeSelector: {" + pair + ": 'true'}",
					"networks: [{name: default, pod: {}}]",
				},
				Devices:  []string{"interfaces: [{name: default, masquerade: {}}]"},
				Requests: "{memory: 1Gi}",
			}.YAML(0), c.name, annotations, c.strategy)
		}
		for _, c := range cases {
			Eventually(func(g Gomega) any { return field(get(vmiKind, ns, c.name)(g), "status", "phase") }).Should(Equal("Running"), c.name)
		}
		Expect(field(get(vmiKind, ns, "migrates")(Default), "status", "nodeName")).To(Equal(node))
		addNode(other)
		// The drain: the node cordoned, as kubectl drain does first.
		cordon(node)
		drain, code := drainPreview(binary, node)
		Expect(code).To(Equal(1), "one VMI keeps the drain from finishing: %+v", drain)
		preview := map[string]int{}
		for i, v := range drain.VMIs {
			if name, ok := strings.CutPrefix(v.VMI, ns+"/"); ok {
				preview[name] = i
			}
		}
		Expect(preview).To(HaveLen(len(cases)), "every VMI on %s previewed: %+v", node, drain)
		Expect(drain.Stuck).To(Equal(1), "%+v", drain)

		// KubeVirt's answer to each eviction, asked as a dry run first (nothing changes): allowed
		// is the VMI stopped; refused for not being live-migratable, stuck; refused because the
		// eviction triggered an evacuation, a migration (or, External, another controller's).
		for _, c := range cases {
			v := drain.VMIs[preview[c.name]]
			pod := launcherPod(ns, c.name)
			err := k8s.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{
				DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}},
			}, &client.SubResourceCreateOptions{CreateOptions: client.CreateOptions{DryRun: []string{metav1.DryRunAll}}})
			kubevirt := "shutdown"
			switch {
			case err == nil:
			case strings.Contains(err.Error(), "is not live-migratable"):
				kubevirt = "stuck"
			case strings.Contains(err.Error(), "Eviction triggered evacuation") && c.strategy == "External":
				kubevirt = "external"
			case strings.Contains(err.Error(), "Eviction triggered evacuation"):
				kubevirt = "migrate"
			default:
				Fail(fmt.Sprintf("%s: KubeVirt's answer to the eviction: %v", c.name, err))
			}
			AddReportEntry("drain "+c.name, fmt.Sprintf("eval --drain: %s %s; KubeVirt's eviction webhook: %v", v.Action, v.Reason, err))
			Expect(v.Action).To(Equal(kubevirt), "%s: eval --drain says %s (%s), KubeVirt's eviction webhook %v", c.name, v.Action, v.Message, err)
			Expect(v.Action).To(Equal(c.want), c.name)
			if c.want == "stuck" {
				Expect(v.Reason).To(Equal("NotLiveMigratable"))
				Expect(v.Message).To(ContainSubstring(c.notMigratable))
			}
		}

		// Then for real, the VMIs KubeVirt migrates: virt-controller's evacuation creates a
		// migration for each, and each ends on one of the nodes the preview said it could go to.
		for _, c := range cases {
			if c.want != "migrate" {
				continue
			}
			pod := launcherPod(ns, c.name)
			err := k8s.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{})
			Expect(err).To(MatchError(ContainSubstring("Eviction triggered evacuation")), c.name)
			v := drain.VMIs[preview[c.name]]
			Expect(v.CandidateNodes).To(Equal([]string{other}))
			Expect(v.TargetNode).To(Equal(other))
			Eventually(func(g Gomega) string {
				vmi := get(vmiKind, ns, c.name)(g)
				onto, _ := field(vmi, "status", "nodeName").(string)
				return onto
			}).WithTimeout(2*time.Minute).Should(BeElementOf(v.CandidateNodes), "%s migrated off %s by KubeVirt's evacuation", c.name, node)
		}
		vmims := &unstructured.UnstructuredList{}
		vmims.SetGroupVersionKind(migrationKind.GroupVersionKind().GroupVersion().WithKind(migrationKind.GetKind() + "List"))
		Expect(k8s.List(ctx, vmims, client.InNamespace(ns))).To(Succeed())
		var migrated []string
		for _, m := range vmims.Items {
			name, _ := field(&m, "spec", "vmiName").(string)
			migrated = append(migrated, name)
		}
		slices.Sort(migrated)
		Expect(migrated).To(Equal([]string{"migrates", "migrates-if-possible"}), "KubeVirt migrated exactly the VMIs the preview said it would")
	})

	It("gives the evacuees the target's free capacity one after another, as kube-scheduler does: what does not fit is stuck", func() {
		// Two VMIs of 100Gi on a node of their own; the one node they can go to has room for one.
		const from, to, group = "drain-c", "drain-d", "drain.virt-rules.io/capacity"
		for _, name := range []string{from, to} {
			n := testcluster.Node(name, testcluster.Skylake, map[string]string{group: "true"})
			if name == to {
				n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("150Gi")
				n.Status.Capacity[corev1.ResourceMemory] = resource.MustParse("150Gi")
			}
			if name == from {
				Expect(cluster.CreateNodes(ctx, n)).To(Succeed())
			}
			DeferCleanup(func() {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}))).To(Succeed())
			})
			if name == to {
				for _, vmi := range []string{"big-1", "big-2"} {
					apply(ns, "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: %s}\n"+clustersuite.VMI{
						Spec: []string{
							"evictionStrategy: LiveMigrate",
							"nodeSelector: {" + group + ": 'true'}",
							"networks: [{name: default, pod: {}}]",
						},
						Devices:  []string{"interfaces: [{name: default, masquerade: {}}]"},
						Requests: "{memory: 100Gi}",
					}.YAML(0), vmi)
					Eventually(func(g Gomega) any { return field(get(vmiKind, ns, vmi)(g), "status", "phase") }).Should(Equal("Running"), vmi)
				}
				Expect(cluster.CreateNodes(ctx, n)).To(Succeed())
			}
		}
		cordon(from)

		drain, code := drainPreview(binary, from)
		Expect(code).To(Equal(1))
		actions := map[string]string{}
		for _, v := range drain.VMIs {
			actions[v.Action+" "+v.Reason+" "+v.TargetNode] += v.VMI + " "
		}
		AddReportEntry("drain "+from, actions)
		Expect(drain.VMIs).To(HaveLen(2))
		Expect(drain.Stuck).To(Equal(1))
		Expect(drain.VMIs[0].Action).To(Equal("migrate"))
		Expect(drain.VMIs[0].TargetNode).To(Equal(to))
		Expect(drain.VMIs[1].Action).To(Equal("stuck"))
		Expect(drain.VMIs[1].Reason).To(Equal("NoCapacity"))

		// KubeVirt: both evictions start an evacuation, both migrations are created; kube-
		// scheduler places one target pod on drain-d and leaves the other Pending.
		for _, vmi := range []string{"big-1", "big-2"} {
			err := k8s.SubResource("eviction").Create(ctx, launcherPod(ns, vmi), &policyv1.Eviction{})
			Expect(err).To(MatchError(ContainSubstring("Eviction triggered evacuation")), vmi)
		}
		Eventually(func(g Gomega) []string {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher"})).To(Succeed())
			var state []string
			for _, p := range pods.Items {
				if !strings.HasPrefix(p.Annotations["kubevirt.io/domain"], "big-") || p.Spec.NodeName == from {
					continue
				}
				where := p.Spec.NodeName
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
						where = string(c.Reason)
					}
				}
				if where != "" {
					state = append(state, where)
				}
			}
			slices.Sort(state)
			return state
		}).WithTimeout(2*time.Minute).Should(Equal([]string{"Unschedulable", to}), "one target pod on %s, the other unschedulable", to)
	})

	It("finds no target for a VMI whose named CPU model only the drained node runs, as kube-scheduler finds none for its target pod", func() {
		// drain-e runs Icelake-Server (and Skylake's models); drain-f only Skylake's. One VMI
		// asks for Icelake-Server, one for a model both run.
		const from, to, group = "drain-e", "drain-f", "drain.virt-rules.io/cpu"
		icelake := testcluster.CPU{Vendor: "Intel", HostModel: "Icelake-Server", Models: append([]string{"Icelake-Server"}, testcluster.Skylake.Models...)}
		nodes := map[string]testcluster.CPU{from: icelake, to: testcluster.Skylake}
		for _, name := range []string{from, to} {
			DeferCleanup(func() {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}))).To(Succeed())
			})
		}
		Expect(cluster.CreateNodes(ctx, testcluster.Node(from, nodes[from], map[string]string{group: "true"}))).To(Succeed())
		models := map[string]string{"only-icelake": "Icelake-Server", "any-skylake": "Skylake-Client-IBRS"}
		for vmi, model := range models {
			apply(ns, "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: %s}\n"+clustersuite.VMI{
				Spec: []string{
					"evictionStrategy: LiveMigrate",
					"nodeSelector: {" + group + ": 'true'}",
					"networks: [{name: default, pod: {}}]",
				},
				Domain:   []string{"cpu: {model: " + model + "}"},
				Devices:  []string{"interfaces: [{name: default, masquerade: {}}]"},
				Requests: "{memory: 1Gi}",
			}.YAML(0), vmi)
		}
		for vmi := range models {
			Eventually(func(g Gomega) any { return field(get(vmiKind, ns, vmi)(g), "status", "phase") }).Should(Equal("Running"), vmi)
		}
		Expect(cluster.CreateNodes(ctx, testcluster.Node(to, nodes[to], map[string]string{group: "true"}))).To(Succeed())
		cordon(from)

		drain, code := drainPreview(binary, from)
		Expect(code).To(Equal(1), "%+v", drain)
		previewed := map[string]int{}
		for i, v := range drain.VMIs {
			previewed[strings.TrimPrefix(v.VMI, ns+"/")] = i
		}
		Expect(previewed).To(HaveLen(2), "%+v", drain)
		stuck, moves := drain.VMIs[previewed["only-icelake"]], drain.VMIs[previewed["any-skylake"]]
		AddReportEntry("drain "+from, fmt.Sprintf("only-icelake: %s %s %s; any-skylake: %s %s", stuck.Action, stuck.Reason, stuck.Message, moves.Action, moves.TargetNode))
		Expect(stuck.Action).To(Equal("stuck"))
		Expect(stuck.Reason).To(Equal("ConflictsWithVMConstraints"))
		Expect(stuck.Message).To(ContainSubstring("cpu-model.node.kubevirt.io/Icelake-Server"))
		Expect(moves.Action).To(Equal("migrate"))
		Expect(moves.TargetNode).To(Equal(to))

		// KubeVirt: both evictions start an evacuation; kube-scheduler places the target pod of
		// the Skylake VMI on drain-f and finds no node for the Icelake one's.
		for vmi := range models {
			err := k8s.SubResource("eviction").Create(ctx, launcherPod(ns, vmi), &policyv1.Eviction{})
			Expect(err).To(MatchError(ContainSubstring("Eviction triggered evacuation")), vmi)
		}
		Eventually(func(g Gomega) map[string]string {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher"})).To(Succeed())
			targets := map[string]string{}
			for _, p := range pods.Items {
				vmi := p.Annotations["kubevirt.io/domain"]
				if _, ok := models[vmi]; !ok || p.Spec.NodeName == from {
					continue
				}
				targets[vmi] = p.Spec.NodeName
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
						targets[vmi] = string(c.Reason)
					}
				}
			}
			return targets
		}).WithTimeout(2 * time.Minute).Should(Equal(map[string]string{"only-icelake": "Unschedulable", "any-skylake": to}))
		Eventually(func(g Gomega) any { return field(get(vmiKind, ns, "any-skylake")(g), "status", "nodeName") }).
			WithTimeout(2*time.Minute).Should(Equal(to), "the Skylake VMI migrated where the preview placed it")
		Expect(field(get(vmiKind, ns, "only-icelake")(Default), "status", "nodeName")).To(Equal(from), "the Icelake VMI stays: the drain cannot finish")
	})
})

// drainPreview runs eval --drain on the cluster: the drain section, and the exit status.
func drainPreview(binary, node string) (drainReport, int) {
	GinkgoHelper()
	stdout, stderr, code, err := clustersuite.RunBinary(ctx, binary, "eval", "--kubeconfig", cluster.Kubeconfig, "--drain", node, "-o", "json")
	Expect(err).NotTo(HaveOccurred())
	var report struct {
		Drain drainReport `json:"drain"`
	}
	Expect(json.Unmarshal([]byte(stdout), &report)).To(Succeed(), "%s\n%s", stdout, stderr)
	return report.Drain, code
}

type drainReport struct {
	VMIs []struct {
		VMI, Action, TargetNode, Reason, Message string
		CandidateNodes                           []string
	} `json:"vmis"`
	Stuck int `json:"stuck"`
}

// cordon marks node unschedulable, as kubectl drain does first.
func cordon(node string) {
	GinkgoHelper()
	Expect(clustersuite.Cordon(ctx, k8s, node)).To(Succeed())
}

// launcherPod is the virt-launcher pod of VMI ns/name on its node.
func launcherPod(ns, name string) *corev1.Pod {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher"})).To(Succeed())
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Annotations["kubevirt.io/domain"] == name && p.Status.Phase == corev1.PodRunning {
			return p
		}
	}
	Fail("no running launcher pod of VMI " + ns + "/" + name)
	return nil
}
