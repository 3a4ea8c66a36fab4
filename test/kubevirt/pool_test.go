package kubevirt_test

import (
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/pool"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// poolYAML is a VirtualMachinePool of VMs that boot from a container disk; extra goes into the
// VM template's metadata.
var poolYAML = `apiVersion: pool.virt-rules.io/v1alpha1
kind: VirtualMachinePool
metadata: {name: %s}
spec:
  replicas: %d
  maxUnavailable: 1
  %s
  updateStrategy: {proactive: {selectionPolicy: {basePolicy: Oldest}}}
  template:
    metadata: {labels: {pool: %s}}
    spec:
      runStrategy: Always
      template:
` + clustersuite.VMI{Metadata: []string{"labels: {pool: %s}", "%s"}, Requests: "{cpu: 100m, memory: 256Mi}"}.YAML(8)

var (
	vmKind   = kinds.NewObject(kinds.VirtualMachine)
	poolKind = kinds.NewObject(pool.GVKPool)
)

// poolMembers are the pool's VMs (by controller owner) and, for each, the UID of its VMI when it
// runs and is Ready ("" otherwise), from one list of the namespace's VMIs: a consistent view.
func poolMembers(g Gomega, ns, name string) map[string]types.UID {
	vms := kinds.NewList(kinds.VirtualMachine)
	g.Expect(k8s.List(ctx, vms, client.InNamespace(ns))).To(Succeed())
	vmis := kinds.NewList(kinds.VirtualMachineInstance)
	g.Expect(k8s.List(ctx, vmis, client.InNamespace(ns))).To(Succeed())
	ready := map[string]types.UID{}
	for i := range vmis.Items {
		vmi := &vmis.Items[i]
		if field(vmi, "status", "phase") == "Running" && kinds.Condition(vmi, "Ready")["status"] == "True" && vmi.GetDeletionTimestamp() == nil {
			ready[vmi.GetName()] = vmi.GetUID()
		}
	}
	members := map[string]types.UID{}
	for i := range vms.Items {
		vm := &vms.Items[i]
		if ref := metav1.GetControllerOf(vm); ref != nil && ref.Name == name && vm.GetDeletionTimestamp() == nil {
			members[vm.GetName()] = ready[vm.GetName()]
		}
	}
	return members
}

func patchPool(ns, name, patch string) {
	GinkgoHelper()
	p := get(poolKind, ns, name)(Default)
	Expect(k8s.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
}

var _ = Describe("VirtualMachinePool beside KubeVirt (design 003)", Ordered, func() {
	var ns string

	BeforeAll(func() { ns = namespace(nil) })

	It("creates VMs that virt-controller starts: VMIs Running, launcher pods scheduled and Running", func() {
		apply(ns, poolYAML, "web", 3, "", "web", "web", "")
		Eventually(func(g Gomega) map[string]types.UID { return poolMembers(g, ns, "web") }).Should(And(
			HaveLen(3), HaveKey("web-1"), HaveKey("web-2"), HaveKey("web-3"), Not(ContainElement(types.UID(""))),
		))
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher", "pool": "web"})).To(Succeed())
		Expect(pods.Items).To(HaveLen(3))
		for _, p := range pods.Items {
			Expect(p.Spec.NodeName).NotTo(BeEmpty())
			Expect(p.Status.Phase).To(Equal(corev1.PodRunning))
		}
		Eventually(func(g Gomega) any { return field(get(poolKind, ns, "web")(g), "status", "readyReplicas") }).Should(BeEquivalentTo(3))
	})

	It("scales in: the VM goes, and KubeVirt stops its VMI and removes its pod", func() {
		patchPool(ns, "web", `{"spec":{"replicas":2}}`)
		Eventually(func(g Gomega) map[string]types.UID { return poolMembers(g, ns, "web") }).Should(HaveLen(2))
		Eventually(func(g Gomega) int {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher", "pool": "web"})).To(Succeed())
			return len(pods.Items)
		}).Should(Equal(2))
		Eventually(func(g Gomega) int {
			vmis := kinds.NewList(kinds.VirtualMachineInstance)
			g.Expect(k8s.List(ctx, vmis, client.InNamespace(ns))).To(Succeed())
			return len(vmis.Items)
		}).Should(Equal(2))
	})

	It("updates proactively by restarting real VMIs, never more unavailable than maxUnavailable", func() {
		before := poolMembers(Default, ns, "web")
		var (
			mu    sync.Mutex
			worst int
			steps int
		)
		done := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(stopped)
			for {
				select {
				case <-done:
					return
				case <-time.After(50 * time.Millisecond):
				}
				members := poolMembers(Default, ns, "web")
				unavailable := 2 - len(members)
				for _, uid := range members {
					if uid == "" {
						unavailable++
					}
				}
				mu.Lock()
				worst, steps = max(worst, unavailable), steps+1
				mu.Unlock()
				fmt.Fprintf(GinkgoWriter, "%s %v\n", time.Now().Format("15:04:05.000"), members)
			}
		}()
		patchPool(ns, "web", `{"spec":{"template":{"spec":{"template":{"metadata":{"labels":{"version":"2"}}}}}}}`)
		Eventually(func(g Gomega) {
			members := poolMembers(g, ns, "web")
			g.Expect(members).To(HaveLen(2))
			for vm, uid := range members {
				g.Expect(uid).NotTo(BeEmpty(), "%s ready", vm)
				g.Expect(uid).NotTo(Equal(before[vm]), "%s restarted", vm)
				vmi := get(vmiKind, ns, vm)(g)
				g.Expect(vmi.GetLabels()).To(HaveKeyWithValue("version", "2"))
			}
		}).Should(Succeed())
		close(done)
		<-stopped
		fmt.Fprintf(GinkgoWriter, "update observed in %d steps, at worst %d VMs unavailable\n", steps, worst)
		Expect(worst).To(Equal(1), "one at a time: maxUnavailable is 1")
	})

	It("re-provisions a VM whose VMI fails to start (autohealing), after KubeVirt counts the failure", func() {
		apply(ns, poolYAML, "heal", 1, "autohealing: {startupFailureThreshold: 1}", "heal", "heal",
			"annotations: {"+testcluster.AnnotationFailStart+": 'true'}")
		var first types.UID
		Eventually(func(g Gomega) {
			vm := get(vmKind, ns, "heal-1")(g)
			first = vm.GetUID()
			g.Expect(field(vm, "status", "startFailure", "consecutiveFailCount")).To(BeEquivalentTo(1), "written by virt-controller")
		}).Should(Succeed())
		Eventually(func(g Gomega) types.UID { return get(vmKind, ns, "heal-1")(g).GetUID() }).ShouldNot(Equal(first))
		Eventually(func(g Gomega) []string {
			var events corev1.EventList
			g.Expect(k8s.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
			var reasons []string
			for _, e := range events.Items {
				if e.InvolvedObject.Name == "heal-1" && e.Source.Component == pool.ControllerName {
					reasons = append(reasons, e.Reason)
				}
			}
			return reasons
		}).Should(ContainElement(pool.ReasonReprovisioned))
		Eventually(func(g Gomega) []any {
			r, _ := field(get(poolKind, ns, "heal")(g), "status", "reprovisions").([]any)
			return r
		}).Should(ContainElement(HaveKeyWithValue("name", "heal-1")))
	})
})
