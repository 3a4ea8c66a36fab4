package integration_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
)

// policyEvents counts, per VMI of namespace ns, the Events recording a policy decision: the
// controller records one per change it writes, so two replicas both writing would show two.
func policyEvents(ns string) map[string]int {
	GinkgoHelper()
	var events corev1.EventList
	Expect(k8sClient.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
	counts := map[string]int{}
	for _, e := range events.Items {
		if e.Reason == migrationpolicy.ReasonPolicyChanged {
			counts[e.InvolvedObject.Name] += int(max(e.Count, 1))
		}
	}
	return counts
}

func createVMI(ns, name string, labels map[string]string) {
	GinkgoHelper()
	vmi := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
	vmi.SetNamespace(ns)
	vmi.SetName(name)
	vmi.SetLabels(labels)
	vmi.Object["spec"] = map[string]any{"domain": map[string]any{"devices": map[string]any{}}}
	Expect(k8sClient.Create(ctx, vmi)).To(Succeed())
}

var _ = Describe("Two controller replicas", Ordered, func() {
	var (
		ns                 string
		stopA, stopB       func()
		electedA, electedB <-chan struct{}
	)

	BeforeAll(func() {
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		Expect(k8sClient.Create(ctx, policyObject("leader-test", map[string]any{"tier": "db"}, nil))).To(Succeed())
		ns = createNamespace()
		lease := createNamespace()
		stopA, electedA = startManagerOpts(cfg, nil, &lease)
		Eventually(electedA).WithTimeout(20 * time.Second).Should(BeClosed())
		stopB, electedB = startManagerOpts(cfg, nil, &lease)
	})

	AfterAll(func() {
		if stopB != nil {
			stopB()
		}
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
	})

	It("lets only the leader write", func() {
		Consistently(electedB).WithTimeout(3 * time.Second).ShouldNot(BeClosed())
		for i := range 20 {
			createVMI(ns, fmt.Sprintf("vm-%02d", i), map[string]string{"tier": "db"})
		}
		for i := range 20 {
			Eventually(policyOf(vmiKey(ns, fmt.Sprintf("vm-%02d", i)))).WithTimeout(20 * time.Second).Should(Equal("leader-test"))
		}
		Consistently(electedB).WithTimeout(time.Second).ShouldNot(BeClosed())
	})

	It("hands over when the leader stops mid-work: nothing lost, nothing written twice", func() {
		// The leader stops while a batch is being created; the other replica must take over
		// and decide every VMI, and no VMI may be decided by both.
		go func() {
			defer GinkgoRecover()
			time.Sleep(200 * time.Millisecond)
			stopA()
		}()
		for i := 20; i < 60; i++ {
			createVMI(ns, fmt.Sprintf("vm-%02d", i), map[string]string{"tier": "db"})
		}
		Eventually(electedB).WithTimeout(30 * time.Second).Should(BeClosed())
		for i := range 60 {
			Eventually(policyOf(vmiKey(ns, fmt.Sprintf("vm-%02d", i)))).WithTimeout(30 * time.Second).Should(Equal("leader-test"))
		}
		// No VMI was decided by both replicas. A write the stopping leader had in flight may
		// have reached the server after its context ended: the annotation is there, but that
		// write's Event (best effort, as Events are) is not; the new leader sees nothing to
		// change. At most one write per worker (4) can be in flight.
		Consistently(func() map[string]int { return policyEvents(ns) }).WithTimeout(3*time.Second).Should(And(
			HaveEach(Equal(1)),
			WithTransform(func(m map[string]int) int { return len(m) }, BeNumerically(">=", 60-4)),
		), "every VMI's decision is written once")
	})
})
