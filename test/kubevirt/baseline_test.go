//go:build libvirt

package kubevirt_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/cpumap"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// The CPU baseline on the test cluster: three nodes of three Intel server generations,
// labelled by KubeVirt's own node labeller (kubevirt-oracle node-labels) from what libvirt
// says of such hosts; the baseline eval --kubeconfig answers for their group is given to a
// VMI, which KubeVirt's virt-api admits and for which virt-controller writes the launcher
// pod's node selector; kube-scheduler then places a pod of that node selector on each node of
// the group, one by one.
var _ = Describe("The CPU baseline beside KubeVirt", Label("baseline"), Ordered, func() {
	const group = "baseline.virt-rules.io/pool"
	var binary, ns string
	hosts := []clustersuite.CPUHost{
		// Every host has invtsc beyond its model, and the Skylake one ssbd (microcode): the
		// baseline requires both.
		clustersuite.Host("baseline-sky", "Intel", "Skylake-Server-noTSX-IBRS", "+invtsc", "+ssbd"),
		clustersuite.Host("baseline-cascade", "Intel", "Cascadelake-Server-noTSX", "+invtsc"),
		clustersuite.Host("baseline-ice", "Intel", "Icelake-Server-noTSX", "+invtsc"),
	}

	BeforeAll(func(sctx SpecContext) {
		binary = clustersuite.BuildVirtRules(sctx, repoRoot, "")
		ns = namespace(nil)
		lib, err := cpumap.Open(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(lib.Close)
		oracle := filepath.Join(clustersuite.Assets(sctx, repoRoot, "KUBEVIRT_ASSETS", "kubevirt.sh", GinkgoWriter), "kubevirt-oracle")
		labels := clustersuite.LabellerLabels(ctx, lib, oracle, filepath.Join(repoRoot, "test", "fidelity", "testdata", "kubevirt.yaml"), hosts)
		for i, h := range hosts {
			l := map[string]string{group: "a"}
			for k, v := range labels[i] {
				l[k] = v
			}
			cpu := testcluster.CPU{Vendor: h.CPU.Vendor, HostModel: h.CPU.Model}
			Expect(cluster.CreateNodes(ctx, testcluster.Node(h.Name, cpu, l))).To(Succeed())
			DeferCleanup(func() {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.Name}}))).To(Succeed())
			})
		}
	}, NodeTimeout(5*time.Minute))

	It("gives a CPU KubeVirt admits, whose launcher pod kube-scheduler places on every node of the group", func() {
		stdout, stderr, code, err := clustersuite.RunBinary(ctx, binary, "eval", "--kubeconfig", cluster.Kubeconfig, "--cpu-baseline-group-by", group, "-o", "json")
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(BeElementOf(0, 1), stderr) // 1: other specs' objects in error
		var report struct {
			CPUBaseline []eval.CPUBaselineResult `json:"cpuBaseline"`
		}
		Expect(json.Unmarshal([]byte(stdout), &report)).To(Succeed(), stderr)
		var g *eval.CPUBaselineResult
		for i := range report.CPUBaseline {
			if report.CPUBaseline[i].Group == group+"=a" {
				g = &report.CPUBaseline[i]
			}
		}
		Expect(g).NotTo(BeNil(), "no group %s=a in %s", group, stdout)
		Expect(g.Nodes).To(ConsistOf("baseline-sky", "baseline-cascade", "baseline-ice"))
		Expect(g.Model).NotTo(BeNil(), "%s: %s", g.Reason, g.Message)
		cpu, err := json.Marshal(g.Snippets["cpu"])
		Expect(err).NotTo(HaveOccurred())
		Expect(g.Features).To(ContainElements(engine.CPUFeature{Name: "invtsc", Policy: "require"}, engine.CPUFeature{Name: "ssbd", Policy: "require"}))
		AddReportEntry("baseline of the group", fmt.Sprintf("%s with %v", *g.Model, g.Features))

		// The VMI as an admin writes it from the snippet, kept to the group.
		apply(ns, "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: baseline}\n%s", clustersuite.VMI{
			Spec:     []string{"nodeSelector: {" + group + ": a}"},
			Domain:   []string{"cpu: " + string(cpu)},
			Requests: "{memory: 1Gi}",
		}.YAML(0))
		var selector map[string]string
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher"})).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(1))
			selector = pods.Items[0].Spec.NodeSelector
		}).Should(Succeed())
		// KubeVirt selects the model and each required feature.
		Expect(selector).To(HaveKeyWithValue("cpu-model.node.kubevirt.io/"+*g.Model, "true"))
		for _, f := range g.Features {
			if f.Policy == "require" {
				Expect(selector).To(HaveKeyWithValue("cpu-feature.node.kubevirt.io/"+f.Name, "true"))
			}
		}

		// kube-scheduler places a pod of that node selector on each node of the group.
		for _, h := range hosts {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "selector-" + h.Name},
				Spec: corev1.PodSpec{
					NodeSelector: selector,
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
						NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
							Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{h.Name},
						}}}},
					}}},
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers:  []corev1.Container{{Name: "c", Image: "busybox"}},
				},
			}
			Expect(k8s.Create(ctx, pod)).To(Succeed())
			Eventually(func(g Gomega) string {
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
				return pod.Spec.NodeName
			}).Should(Equal(h.Name), "kube-scheduler places the launcher's node selector on %s", h.Name)
		}
	})
})
