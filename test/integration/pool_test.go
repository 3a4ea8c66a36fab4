package integration_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	poolv1alpha1 "github.com/virt-rules/virt-rules/api/pool/v1alpha1"
	"github.com/virt-rules/virt-rules/controllers/pool"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// newPool is a VirtualMachinePool of replicas VMs with one DataVolumeTemplate ("disk") and
// a cloud-init Secret reference; spec entries in extra replace the defaults.
func newPool(ns, name string, replicas int, extra map[string]any) *unstructured.Unstructured {
	GinkgoHelper()
	p := fromYAML(fmt.Sprintf(`
apiVersion: pool.virt-rules.io/v1alpha1
kind: VirtualMachinePool
metadata: {name: %s, namespace: %s}
spec:
  replicas: %d
  template:
    metadata: {labels: {app: pooltest}}
    spec:
      running: true
      dataVolumeTemplates:
      - metadata: {name: disk}
        spec: {pvc: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}
      template:
        spec:
          domain: {devices: {disks: [{name: disk, disk: {bus: virtio}}]}}
          volumes:
          - {name: disk, dataVolume: {name: disk}}
          - {name: cloudinit, cloudInitNoCloud: {secretRef: {name: userdata}}}
`, name, ns, replicas))
	for k, v := range extra {
		Expect(unstructured.SetNestedField(p.Object, v, "spec", k)).To(Succeed())
	}
	return p
}

func getObject(gvkObj *unstructured.Unstructured, ns, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvkObj.GroupVersionKind())
	err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, u)
	return u, err
}

// quietFor is how long a spec watches for a plan that must not come: a second, and the plan
// interval by which a plan that VM and VMI updates ask for may follow them.
const quietFor = time.Second + pool.DefaultPlanInterval

// poolVMs are the names of the VMs the pool owns (controller ownerReference), sorted by number.
func poolVMs(ns, poolName string) func(g Gomega) []string {
	return func(g Gomega) []string {
		vms := newUnstructured(pool.GVKVirtualMachine)
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(vms.GroupVersionKind().GroupVersion().WithKind("VirtualMachineList"))
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		var names []string
		for _, vm := range list.Items {
			if ref := metav1.GetControllerOf(&vm); ref != nil && ref.Name == poolName && vm.GetDeletionTimestamp() == nil {
				names = append(names, vm.GetName())
			}
		}
		sortByNumber(names)
		return names
	}
}

func sortByNumber(names []string) {
	sort.Slice(names, func(i, j int) bool {
		if len(names[i]) != len(names[j]) {
			return len(names[i]) < len(names[j])
		}
		return names[i] < names[j]
	})
}

func seq(prefix string, from, to int) []string {
	var out []string
	for n := from; n <= to; n++ {
		out = append(out, fmt.Sprintf("%s-%d", prefix, n))
	}
	return out
}

func listOf(gvkObj *unstructured.Unstructured, ns string) []unstructured.Unstructured {
	GinkgoHelper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvkObj.GroupVersionKind().GroupVersion().WithKind(gvkObj.GetKind() + "List"))
	Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	return list.Items
}

// typedPoolClient knows the typed VirtualMachinePool, for its scale subresource.
func typedPoolClient() client.Client {
	GinkgoHelper()
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(poolv1alpha1.AddToScheme(scheme)).To(Succeed())
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// getScale reads a pool's scale subresource, as `kubectl scale` and an HPA do.
func getScale(ns, name string) *autoscalingv1.Scale {
	GinkgoHelper()
	s := &autoscalingv1.Scale{}
	p := &poolv1alpha1.VirtualMachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	Expect(typedPoolClient().SubResource("scale").Get(ctx, p, s)).To(Succeed())
	return s
}

// scale sets a pool's replicas through its scale subresource, as `kubectl scale` does.
func scale(ns, name string, replicas int32) {
	GinkgoHelper()
	s := getScale(ns, name)
	s.Spec.Replicas = replicas
	s.ResourceVersion = "" // unconditional, as kubectl scale without --resource-version
	p := &poolv1alpha1.VirtualMachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	Expect(typedPoolClient().SubResource("scale").Update(ctx, p, client.WithSubResourceBody(s))).To(Succeed())
}

func poolStatus(ns, name string) func(g Gomega) map[string]any {
	return func(g Gomega) map[string]any {
		p, err := getObject(newUnstructured(pool.GVKPool), ns, name)
		g.Expect(err).NotTo(HaveOccurred())
		status, _, _ := unstructured.NestedMap(p.Object, "status")
		return status
	}
}

// kubeVirt plays KubeVirt's part for the VMs of one namespace, as the tests need it: it
// creates each VM's DataVolumes (owned by the VM), starts a VMI for every VM that should run
// (not ready at first, Ready after readyAfter), stops VMIs of VMs that should not, writes the
// VM's status.ready, and collects what the garbage collector would (VMIs and DataVolumes
// whose VM is gone). The control plane of these tests runs neither KubeVirt nor a GC.
type kubeVirt struct {
	ns         string
	readyAfter time.Duration
	cancel     context.CancelFunc
	done       chan struct{}
}

func simulateKubeVirt(ns string, readyAfter time.Duration) *kubeVirt {
	kctx, cancel := context.WithCancel(ctx)
	k := &kubeVirt{ns: ns, readyAfter: readyAfter, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(k.done)
		started := map[types.UID]time.Time{}
		for kctx.Err() == nil {
			if err := k.step(kctx, started); err != nil && kctx.Err() == nil {
				fmt.Fprintf(GinkgoWriter, "kubevirt simulation: %v\n", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	DeferCleanup(k.stop)
	return k
}

func (k *kubeVirt) stop() {
	k.cancel()
	<-k.done
}

func (k *kubeVirt) list(kctx context.Context, gvkObj *unstructured.Unstructured) (map[string]*unstructured.Unstructured, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvkObj.GroupVersionKind().GroupVersion().WithKind(gvkObj.GetKind() + "List"))
	if err := k8sClient.List(kctx, list, client.InNamespace(k.ns)); err != nil {
		return nil, err
	}
	out := map[string]*unstructured.Unstructured{}
	for i := range list.Items {
		out[list.Items[i].GetName()] = &list.Items[i]
	}
	return out, nil
}

func (k *kubeVirt) step(kctx context.Context, started map[types.UID]time.Time) error {
	vms, err := k.list(kctx, newUnstructured(pool.GVKVirtualMachine))
	if err != nil {
		return err
	}
	vmis, err := k.list(kctx, newUnstructured(pool.GVKVMI))
	if err != nil {
		return err
	}
	dvs, err := k.list(kctx, newUnstructured(pool.GVKDataVolume))
	if err != nil {
		return err
	}
	var errs []error
	for name, vm := range vms {
		if vm.GetDeletionTimestamp() != nil {
			continue
		}
		templates, _, _ := unstructured.NestedSlice(vm.Object, "spec", "dataVolumeTemplates")
		for _, t := range templates {
			dvName, _, _ := unstructured.NestedString(t.(map[string]any), "metadata", "name")
			if _, ok := dvs[dvName]; ok {
				continue
			}
			dv := newUnstructured(pool.GVKDataVolume)
			dv.SetNamespace(k.ns)
			dv.SetName(dvName)
			dv.SetOwnerReferences([]metav1.OwnerReference{ownerRef(vm)})
			_ = unstructured.SetNestedField(dv.Object, map[string]any{"pvc": map[string]any{}}, "spec")
			errs = append(errs, client.IgnoreAlreadyExists(k8sClient.Create(kctx, dv)))
		}
		running, _, _ := unstructured.NestedBool(vm.Object, "spec", "running")
		vmi, exists := vmis[name]
		ready, _, _ := unstructured.NestedBool(vm.Object, "status", "ready")
		switch {
		case running && !exists:
			// The VM's status says not ready before the new VMI exists.
			errs = append(errs, setVMReady(kctx, vm, false))
			annotations, _, _ := unstructured.NestedStringMap(vm.Object, "spec", "template", "metadata", "annotations")
			vmi = newUnstructured(pool.GVKVMI)
			vmi.SetNamespace(k.ns)
			vmi.SetName(name)
			vmi.SetAnnotations(annotations)
			vmi.SetOwnerReferences([]metav1.OwnerReference{ownerRef(vm)})
			now := time.Now().UTC().Format(time.RFC3339)
			vmi.Object["spec"] = map[string]any{"domain": map[string]any{"devices": map[string]any{}}}
			vmi.Object["status"] = map[string]any{
				"phase":      "Running",
				"conditions": []any{map[string]any{"type": "Ready", "status": "False"}},
				"phaseTransitionTimestamps": []any{
					map[string]any{"phase": "Pending", "phaseTransitionTimestamp": now},
					map[string]any{"phase": "Running", "phaseTransitionTimestamp": now},
				},
			}
			errs = append(errs, k8sClient.Create(kctx, vmi))
			started[vmi.GetUID()] = time.Now()
		case !running && exists:
			errs = append(errs, client.IgnoreNotFound(k8sClient.Delete(kctx, vmi)), setVMReady(kctx, vm, false))
		case running && exists && !ready:
			if t, ok := started[vmi.GetUID()]; ok && time.Since(t) < k.readyAfter {
				continue
			}
			patch := []byte(`{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)
			errs = append(errs, client.IgnoreNotFound(k8sClient.Patch(kctx, vmi, client.RawPatch(types.MergePatchType, patch))))
			errs = append(errs, setVMReady(kctx, vm, true))
		}
	}
	for name, vmi := range vmis {
		if _, ok := vms[name]; !ok {
			errs = append(errs, client.IgnoreNotFound(k8sClient.Delete(kctx, vmi)))
		}
	}
	for _, dv := range dvs {
		if ref := metav1.GetControllerOf(dv); ref != nil {
			if vm, ok := vms[ref.Name]; !ok || vm.GetUID() != ref.UID {
				errs = append(errs, client.IgnoreNotFound(k8sClient.Delete(kctx, dv)))
			}
		}
	}
	for _, err := range errs {
		if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

func ownerRef(vm *unstructured.Unstructured) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: vm.GetName(), UID: vm.GetUID(), Controller: &yes}
}

func setVMReady(kctx context.Context, vm *unstructured.Unstructured, ready bool) error {
	patch := fmt.Appendf(nil, `{"status":{"ready":%t}}`, ready)
	return client.IgnoreNotFound(k8sClient.Status().Patch(kctx, vm, client.RawPatch(types.MergePatchType, patch)))
}

func vmEvents(ns, reason string) func(g Gomega) []string {
	events := clustersuite.Events(ctx, k8sClient, ns, func(e corev1.Event) (string, bool) {
		return e.InvolvedObject.Name, e.Reason == reason && e.InvolvedObject.Kind == "VirtualMachine"
	})
	return func(g Gomega) []string {
		names := events(g)
		sortByNumber(names)
		return slices.Compact(names)
	}
}

func objectUID(gvkObj *unstructured.Unstructured, ns, name string) func(g Gomega) types.UID {
	return func(g Gomega) types.UID {
		o, err := getObject(gvkObj, ns, name)
		if apierrors.IsNotFound(err) {
			return ""
		}
		g.Expect(err).NotTo(HaveOccurred())
		return o.GetUID()
	}
}

var _ = Describe("VirtualMachinePool", func() {
	var (
		ns   string
		stop func()
	)

	BeforeEach(func() {
		ns = createNamespace()
		stop = startManager()
		DeferCleanup(func() { stop() })
	})

	It("scales 3 -> 2 -> 4 through the scale subresource as the design's naming example", func() {
		simulateKubeVirt(ns, 0)
		create(newPool(ns, "my-vm", 3, nil))
		Eventually(poolVMs(ns, "my-vm")).Should(Equal(seq("my-vm", 1, 3)))
		Eventually(poolStatus(ns, "my-vm")).Should(And(HaveKeyWithValue("readyReplicas", BeEquivalentTo(3)),
			HaveKeyWithValue("labelSelector", "pool.virt-rules.io/pool=my-vm")))
		// Every VM got its own DataVolume.
		for n := 1; n <= 3; n++ {
			Eventually(objectUID(newUnstructured(pool.GVKDataVolume), ns, fmt.Sprintf("disk-%d", n))).ShouldNot(BeEmpty())
		}

		// my-vm-2 is stopped: Random, the default, takes it first, the least disruptive.
		vm2, err := getObject(newUnstructured(pool.GVKVirtualMachine), ns, "my-vm-2")
		Expect(err).NotTo(HaveOccurred())
		Expect(k8sClient.Patch(ctx, vm2, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"running":false}}`)))).To(Succeed())
		Eventually(poolStatus(ns, "my-vm")).Should(HaveKeyWithValue("readyReplicas", BeEquivalentTo(2)))

		scale(ns, "my-vm", 2)
		Eventually(poolVMs(ns, "my-vm")).Should(Equal([]string{"my-vm-1", "my-vm-3"}))
		// Disabled state preservation (the default): its DataVolume went with it.
		Eventually(objectUID(newUnstructured(pool.GVKDataVolume), ns, "disk-2")).Should(BeEmpty())

		scale(ns, "my-vm", 4)
		Eventually(poolVMs(ns, "my-vm")).Should(Equal(seq("my-vm", 1, 4)))
		Consistently(poolVMs(ns, "my-vm")).WithTimeout(quietFor).Should(Equal(seq("my-vm", 1, 4)))

		Eventually(func(g Gomega) {
			s := getScale(ns, "my-vm")
			g.Expect(s.Spec.Replicas).To(BeEquivalentTo(4))
			g.Expect(s.Status.Replicas).To(BeEquivalentTo(4))
			g.Expect(s.Status.Selector).To(Equal("pool.virt-rules.io/pool=my-vm"))
		}).Should(Succeed())
		Eventually(vmEvents(ns, pool.ReasonCreated)).Should(Equal(seq("my-vm", 1, 4)))
		Eventually(vmEvents(ns, pool.ReasonDeleted)).Should(Equal([]string{"my-vm-2"}))
		Eventually(poolStatus(ns, "my-vm")).Should(And(
			HaveKeyWithValue("replicas", BeEquivalentTo(4)),
			HaveKeyWithValue("readyReplicas", BeEquivalentTo(4)),
			HaveKeyWithValue("updatedReplicas", BeEquivalentTo(4)),
			HaveKeyWithValue("observedGeneration", BeEquivalentTo(3)),
			HaveKeyWithValue("conditions", ContainElement(And(HaveKeyWithValue("type", "Ready"), HaveKeyWithValue("status", "True")))),
		))
	})

	It("keeps the DataVolume of a removed name with Offline preservation and reuses it", func() {
		simulateKubeVirt(ns, 0)
		create(newPool(ns, "keep", 2, map[string]any{"scaleInStrategy": map[string]any{"proactive": map[string]any{
			"statePreservation": "Offline", "selectionPolicy": map[string]any{"basePolicy": "Newest"},
		}}}))
		Eventually(poolVMs(ns, "keep")).Should(Equal(seq("keep", 1, 2)))
		dvUID := objectUID(newUnstructured(pool.GVKDataVolume), ns, "disk-2")
		Eventually(dvUID).ShouldNot(BeEmpty())
		kept := dvUID(Default)

		scale(ns, "keep", 1)
		Eventually(poolVMs(ns, "keep")).Should(Equal([]string{"keep-1"}))
		Eventually(vmEvents(ns, pool.ReasonStateKept)).Should(Equal([]string{"keep-2"}))
		Consistently(dvUID).WithTimeout(quietFor).Should(Equal(kept), "the kept DataVolume outlives its VM")
		dv, err := getObject(newUnstructured(pool.GVKDataVolume), ns, "disk-2")
		Expect(err).NotTo(HaveOccurred())
		Expect(dv.GetOwnerReferences()).To(BeEmpty())
		Expect(dv.GetLabels()).To(HaveKeyWithValue(pool.LabelPreserved, "keep"))
		Expect(dv.GetAnnotations()).To(HaveKeyWithValue(pool.AnnotationPreservedVM, "keep-2"))

		scale(ns, "keep", 2)
		Eventually(poolVMs(ns, "keep")).Should(Equal(seq("keep", 1, 2)))
		Eventually(func(g Gomega) {
			dv, err := getObject(newUnstructured(pool.GVKDataVolume), ns, "disk-2")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(dv.GetUID()).To(Equal(kept))
			vm, err := getObject(newUnstructured(pool.GVKVirtualMachine), ns, "keep-2")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(metav1.GetControllerOf(dv)).NotTo(BeNil())
			g.Expect(metav1.GetControllerOf(dv).UID).To(Equal(vm.GetUID()))
			g.Expect(dv.GetLabels()).NotTo(HaveKey(pool.LabelPreserved))
		}).Should(Succeed())
	})

	It("takes VMs matching the ordered label selectors first, in their order", func() {
		simulateKubeVirt(ns, 0)
		create(newPool(ns, "ord", 5, map[string]any{"scaleInStrategy": map[string]any{"proactive": map[string]any{
			"selectionPolicy": map[string]any{
				"orderedPolicies": []any{
					map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"tier": "scratch"}}},
					map[string]any{"labelSelector": map[string]any{"matchExpressions": []any{
						map[string]any{"key": "tier", "operator": "In", "values": []any{"batch"}},
					}}},
				},
				"basePolicy": "Oldest",
			},
		}}}))
		Eventually(poolVMs(ns, "ord")).Should(Equal(seq("ord", 1, 5)))
		for name, tier := range map[string]string{"ord-2": "batch", "ord-4": "scratch"} {
			vm, err := getObject(newUnstructured(pool.GVKVirtualMachine), ns, name)
			Expect(err).NotTo(HaveOccurred())
			patch := fmt.Appendf(nil, `{"metadata":{"labels":{"tier":%q}}}`, tier)
			Expect(k8sClient.Patch(ctx, vm, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
		}
		scale(ns, "ord", 4)
		Eventually(poolVMs(ns, "ord")).Should(Equal([]string{"ord-1", "ord-2", "ord-3", "ord-5"}))
		scale(ns, "ord", 3)
		Eventually(poolVMs(ns, "ord")).Should(Equal([]string{"ord-1", "ord-3", "ord-5"}))
		// Then the base policy: the oldest of the rest. ord-1 may share ord-3's creation
		// second, so the name decides between them as it does in the plan.
		scale(ns, "ord", 2)
		Eventually(poolVMs(ns, "ord")).Should(HaveLen(2))
		Expect(poolVMs(ns, "ord")(Default)).To(ContainElement("ord-5"))
	})

	It("admits KubeVirt's ordinal sort policies and scales in by the number in the name", func() {
		simulateKubeVirt(ns, 0)
		create(newPool(ns, "desc", 4, map[string]any{"scaleInStrategy": map[string]any{"proactive": map[string]any{
			"selectionPolicy": map[string]any{"basePolicy": "DescendingOrder"},
		}}}))
		Eventually(poolVMs(ns, "desc")).Should(Equal(seq("desc", 1, 4)))
		scale(ns, "desc", 2)
		Eventually(poolVMs(ns, "desc")).Should(Equal([]string{"desc-1", "desc-2"}))
	})

	It("never has more VMs unavailable than maxUnavailable during a proactive update", func() {
		simulateKubeVirt(ns, 300*time.Millisecond)
		create(newPool(ns, "roll", 6, map[string]any{"maxUnavailable": int64(2)}))
		Eventually(poolStatus(ns, "roll")).WithTimeout(40 * time.Second).Should(HaveKeyWithValue("readyReplicas", BeEquivalentTo(6)))

		obs := observeAvailability(ns, "roll")
		p, err := getObject(newUnstructured(pool.GVKPool), ns, "roll")
		Expect(err).NotTo(HaveOccurred())
		Expect(k8sClient.Patch(ctx, p, client.RawPatch(types.MergePatchType,
			[]byte(`{"spec":{"template":{"metadata":{"labels":{"version":"2"}}}}}`)))).To(Succeed())

		Eventually(poolStatus(ns, "roll")).WithTimeout(60 * time.Second).Should(And(
			HaveKeyWithValue("updatedReplicas", BeEquivalentTo(6)),
			HaveKeyWithValue("readyReplicas", BeEquivalentTo(6)),
			HaveKeyWithValue("conditions", ContainElement(And(HaveKeyWithValue("type", "Updated"), HaveKeyWithValue("status", "True")))),
		))
		Eventually(func(g Gomega) {
			for _, vmi := range listOf(newUnstructured(pool.GVKVMI), ns) {
				vm, err := getObject(newUnstructured(pool.GVKVirtualMachine), ns, vmi.GetName())
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(vmi.GetAnnotations()[pool.AnnotationTemplateHash]).To(Equal(vm.GetAnnotations()[pool.AnnotationTemplateHash]))
				g.Expect(vm.GetLabels()).To(HaveKeyWithValue("version", "2"))
			}
		}).Should(Succeed())
		worst, steps := obs.stop()
		fmt.Fprintf(GinkgoWriter, "update observed in %d steps, at worst %d VMs unavailable\n", steps, worst)
		Expect(steps).To(BeNumerically(">", 12), "the update was observed step by step")
		Expect(worst).To(BeNumerically(">=", 1), "VMs were restarted")
		Expect(worst).To(BeNumerically("<=", 2), "never more than maxUnavailable at once")
		Eventually(vmEvents(ns, pool.ReasonRestarted)).Should(Equal(seq("roll", 1, 6)))
		// Six first starts, six restarts: each stop and start counted for the pool. The controller
		// counts them as it sees the VMI events, which may trail the status read above.
		Eventually(func() float64 { return poolMetric("virtrules_pool_vm_starts_total", ns+"/roll") }).Should(BeNumerically(">=", 12))
		Eventually(func() float64 { return poolMetric("virtrules_pool_vm_stops_total", ns+"/roll") }).Should(BeNumerically(">=", 6))
		Eventually(func() float64 { return poolMetric("virtrules_pool_vmi_phase_transition_seconds", ns+"/roll") }).Should(BeNumerically(">=", 12))
	})

	It("re-provisions a VM after startupFailureThreshold failures, and backs off", func() {
		create(newPool(ns, "heal", 1, map[string]any{"autohealing": map[string]any{"startupFailureThreshold": int64(2)}}))
		Eventually(poolVMs(ns, "heal")).Should(Equal([]string{"heal-1"}))
		vmUID := objectUID(newUnstructured(pool.GVKVirtualMachine), ns, "heal-1")
		first := vmUID(Default)
		// KubeVirt made its DataVolume; the VM failed to start once: not yet.
		dv := newUnstructured(pool.GVKDataVolume)
		dv.SetNamespace(ns)
		dv.SetName("disk-1")
		vm, err := getObject(newUnstructured(pool.GVKVirtualMachine), ns, "heal-1")
		Expect(err).NotTo(HaveOccurred())
		dv.SetOwnerReferences([]metav1.OwnerReference{ownerRef(vm)})
		dv.Object["spec"] = map[string]any{"pvc": map[string]any{}}
		Expect(k8sClient.Create(ctx, dv)).To(Succeed())
		failStarts := func(uid types.UID, n int) {
			GinkgoHelper()
			vm, err := getObject(newUnstructured(pool.GVKVirtualMachine), ns, "heal-1")
			Expect(err).NotTo(HaveOccurred())
			Expect(vm.GetUID()).To(Equal(uid))
			patch := fmt.Appendf(nil, `{"status":{"ready":false,"startFailure":{"consecutiveFailCount":%d}}}`, n)
			Expect(k8sClient.Status().Patch(ctx, vm, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
		}
		failStarts(first, 1)
		Consistently(vmUID).WithTimeout(quietFor).Should(Equal(first))

		failStarts(first, 2)
		Eventually(vmUID).ShouldNot(Or(Equal(first), BeEmpty()))
		second := vmUID(Default)
		firstAt := time.Now()
		Eventually(objectUID(newUnstructured(pool.GVKDataVolume), ns, "disk-1")).Should(BeEmpty(), "its state went with it")
		Eventually(vmEvents(ns, pool.ReasonReprovisioned)).Should(Equal([]string{"heal-1"}))
		Eventually(poolStatus(ns, "heal")).Should(HaveKeyWithValue("reprovisions", ConsistOf(And(
			HaveKeyWithValue("name", "heal-1"), HaveKeyWithValue("count", BeEquivalentTo(1))))))

		// It fails again at once: the second re-provisioning waits 10 s after the first.
		failStarts(second, 2)
		Consistently(vmUID).WithTimeout(7 * time.Second).Should(Equal(second))
		Eventually(vmUID).WithTimeout(15 * time.Second).ShouldNot(Or(Equal(second), BeEmpty()))
		Expect(time.Since(firstAt)).To(BeNumerically(">=", 9*time.Second))
		Eventually(poolStatus(ns, "heal")).Should(HaveKeyWithValue("reprovisions", ConsistOf(
			HaveKeyWithValue("count", BeEquivalentTo(2)))))
		Expect(poolVMs(ns, "heal")(Default)).To(Equal([]string{"heal-1"}))
	})

	It("replaces a detached VM and never adopts it again", func() {
		simulateKubeVirt(ns, 0)
		create(newPool(ns, "det", 2, nil))
		Eventually(poolVMs(ns, "det")).Should(Equal(seq("det", 1, 2)))
		vm, err := getObject(newUnstructured(pool.GVKVirtualMachine), ns, "det-1")
		Expect(err).NotTo(HaveOccurred())
		// A merge patch, as `kubectl patch` sends: the simulated virt-controller writes
		// this VM's status meanwhile, and an Update of the copy read above would conflict.
		Expect(k8sClient.Patch(ctx, vm, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"ownerReferences":null}}`)))).To(Succeed())

		Eventually(poolVMs(ns, "det")).Should(Equal([]string{"det-2", "det-3"}))
		Consistently(func(g Gomega) {
			g.Expect(poolVMs(ns, "det")(g)).To(Equal([]string{"det-2", "det-3"}))
			vm, err := getObject(newUnstructured(pool.GVKVirtualMachine), ns, "det-1")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(vm.GetOwnerReferences()).To(BeEmpty())
			g.Expect(vm.GetLabels()).To(HaveKeyWithValue(pool.LabelPool, "det"), "its labels still match")
		}).WithTimeout(2 * time.Second).Should(Succeed())
	})

	It("scales a 1,000-VM pool out in passes of at most 250", func() {
		create(newPool(ns, "big", 1000, map[string]any{"template": map[string]any{"spec": map[string]any{
			"running": false, "template": map[string]any{"spec": minimalVMISpec()},
		}}}))
		Eventually(poolVMs(ns, "big")).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(HaveLen(1000))
		Expect(poolVMs(ns, "big")(Default)).To(Equal(seq("big", 1, 1000)))
		count, sum, atMost250 := createsPerPass(ns + "/big")
		Expect(sum).To(BeEquivalentTo(1000))
		Expect(count).To(BeNumerically(">=", 4), "at least four passes")
		Expect(atMost250).To(Equal(count), "no pass created more than 250")
		fmt.Fprintf(GinkgoWriter, "1000 VMs created in %d passes\n", count)
		Eventually(poolStatus(ns, "big")).Should(HaveKeyWithValue("replicas", BeEquivalentTo(1000)))
	})

	It("ends with exactly replicas VMs when the controller is killed mid-scale-out and restarted", func() {
		create(newPool(ns, "crash", 400, map[string]any{"template": map[string]any{"spec": map[string]any{
			"running": false, "template": map[string]any{"spec": minimalVMISpec()},
		}}}))
		Eventually(func(g Gomega) int { return len(poolVMs(ns, "crash")(g)) }).WithPolling(20 * time.Millisecond).Should(BeNumerically(">=", 60))
		stop()
		midway := len(poolVMs(ns, "crash")(Default))
		Expect(midway).To(BeNumerically("<", 400), "killed mid-scale-out")
		fmt.Fprintf(GinkgoWriter, "controller stopped with %d of 400 VMs\n", midway)
		stop = startManager()
		Eventually(poolVMs(ns, "crash")).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Equal(seq("crash", 1, 400)))
		Consistently(func(g Gomega) int { return len(listOf(newUnstructured(pool.GVKVirtualMachine), ns)) }).WithTimeout(2 * time.Second).Should(Equal(400))
	})

	It("runs the design's three example pools of examples/pool", func() {
		objs, err := manifest.Read([]string{
			filepath.Join(repoRoot, "examples", "pool", "namespaces.yaml"),
			filepath.Join(repoRoot, "examples", "pool", "pools.yaml"),
		}, nil)
		Expect(err).NotTo(HaveOccurred())
		var pools []*unstructured.Unstructured
		for _, o := range objs {
			u := o.Unstructured.DeepCopy()
			if u.GetKind() == "Namespace" {
				Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, u))).To(Succeed())
				continue
			}
			u.SetUID("") // the API server assigns it
			create(u)
			pools = append(pools, u)
		}
		Expect(pools).To(HaveLen(3))
		for _, p := range pools {
			Eventually(poolVMs(p.GetNamespace(), p.GetName())).WithTimeout(time.Minute).Should(HaveLen(100), p.GetNamespace())
			Eventually(poolStatus(p.GetNamespace(), p.GetName())).Should(HaveKeyWithValue("replicas", BeEquivalentTo(100)))
			vm, err := getObject(newUnstructured(pool.GVKVirtualMachine), p.GetNamespace(), "my-vm-pool-7")
			Expect(err).NotTo(HaveOccurred())
			templates, _, _ := unstructured.NestedSlice(vm.Object, "spec", "dataVolumeTemplates")
			Expect(templates).To(HaveLen(1))
			Expect(templates[0]).To(HaveKeyWithValue("metadata", HaveKeyWithValue("name", "alpine-dv-7")))
		}
	})

	It("refuses two strategies and Online state preservation with clear messages", func() {
		twoStrategies := newPool(ns, "bad", 1, map[string]any{"updateStrategy": map[string]any{"unmanaged": map[string]any{}, "proactive": map[string]any{}}})
		err := tryCreate(twoStrategies)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.updateStrategy: Invalid value: set exactly one of unmanaged, opportunistic, proactive"))

		online := newPool(ns, "bad", 1, map[string]any{"scaleInStrategy": map[string]any{"proactive": map[string]any{"statePreservation": "Online"}}})
		err = tryCreate(online)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("Online is not supported until VM memory state can be kept on a PVC; use Offline or Disabled"))

		// Defaults: proactive strategies, 25%, Random, Disabled.
		ok := newPool(ns, "defaults", 0, map[string]any{"scaleInStrategy": map[string]any{"proactive": map[string]any{}}, "autohealing": map[string]any{}})
		create(ok)
		got, err := getObject(newUnstructured(pool.GVKPool), ns, "defaults")
		Expect(err).NotTo(HaveOccurred())
		spec := got.Object["spec"].(map[string]any)
		Expect(spec).To(HaveKeyWithValue("maxUnavailable", "25%"))
		Expect(spec).To(HaveKeyWithValue("updateStrategy", map[string]any{"proactive": map[string]any{}}))
		Expect(spec).To(HaveKeyWithValue("scaleInStrategy", map[string]any{"proactive": map[string]any{"statePreservation": "Disabled"}}))
		Expect(spec).To(HaveKeyWithValue("autohealing", map[string]any{"startupFailureThreshold": int64(3)}))
	})
})

// createsPerPass reads the pool controller's histogram of VMs created per pass for pool:
// how many passes created VMs, how many VMs in all, and how many passes created 250 or fewer.
func createsPerPass(poolKey string) (count, sum, atMost250 uint64) {
	GinkgoHelper()
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != "virtrules_pool_creates_per_pass" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" && l.GetValue() == poolKey {
					h := m.GetHistogram()
					for _, b := range h.GetBucket() {
						if b.GetUpperBound() == 250 {
							atMost250 = b.GetCumulativeCount()
						}
					}
					return h.GetSampleCount(), uint64(h.GetSampleSum()), atMost250
				}
			}
		}
	}
	Fail("no virtrules_pool_creates_per_pass for " + poolKey)
	return 0, 0, 0
}

// poolMetric is the value of a pool counter, or the sample count of a pool histogram,
// summed over the pool's series.
func poolMetric(name, poolKey string) float64 {
	GinkgoHelper()
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" && l.GetValue() == poolKey {
					if m.GetCounter() != nil {
						total += m.GetCounter().GetValue()
					}
					if m.GetHistogram() != nil {
						total += float64(m.GetHistogram().GetSampleCount())
					}
				}
			}
		}
	}
	return total
}

// availability watches a pool's VMs and VMIs and, after every event, counts the VMs that
// are unavailable: not ready, or without a ready VMI.
type availability struct {
	mu     sync.Mutex
	worst  int
	steps  int
	cancel context.CancelFunc
	done   chan struct{}
}

func observeAvailability(ns, poolName string) *availability {
	GinkgoHelper()
	wc, err := client.NewWithWatch(cfg, client.Options{})
	Expect(err).NotTo(HaveOccurred())
	vmList := &unstructured.UnstructuredList{}
	vmList.SetGroupVersionKind(pool.GVKVirtualMachine.GroupVersion().WithKind("VirtualMachineList"))
	vmiList := &unstructured.UnstructuredList{}
	vmiList.SetGroupVersionKind(pool.GVKVMI.GroupVersion().WithKind("VirtualMachineInstanceList"))
	wctx, cancel := context.WithCancel(ctx)
	vmWatch, err := wc.Watch(wctx, vmList, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	vmiWatch, err := wc.Watch(wctx, vmiList, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	a := &availability{cancel: cancel, done: make(chan struct{})}
	vmReady, vmiReady := map[string]bool{}, map[string]bool{}
	go func() {
		defer GinkgoRecover()
		defer close(a.done)
		defer vmWatch.Stop()
		defer vmiWatch.Stop()
		for {
			var ev watch.Event
			var ok, ofVMI bool
			select {
			case <-wctx.Done():
				return
			case ev, ok = <-vmWatch.ResultChan():
			case ev, ok = <-vmiWatch.ResultChan():
				ofVMI = true
			}
			if !ok {
				return
			}
			u, isU := ev.Object.(*unstructured.Unstructured)
			switch {
			case !isU:
				continue
			case ofVMI:
				vmiReady[u.GetName()] = ev.Type != watch.Deleted && vmiIsReady(u)
			default:
				if ref := metav1.GetControllerOf(u); ref == nil || ref.Name != poolName || ev.Type == watch.Deleted {
					delete(vmReady, u.GetName())
				} else {
					r, _, _ := unstructured.NestedBool(u.Object, "status", "ready")
					vmReady[u.GetName()] = r
				}
			}
			unavailable := 0
			for name, r := range vmReady {
				if !r || !vmiReady[name] {
					unavailable++
				}
			}
			a.mu.Lock()
			a.steps++
			// Until all six are seen (the initial list events), counting means nothing.
			if len(vmReady) == 6 && len(vmiReady) >= 6 {
				a.worst = max(a.worst, unavailable)
			}
			a.mu.Unlock()
		}
	}()
	return a
}

func vmiIsReady(vmi *unstructured.Unstructured) bool {
	conditions, _, _ := unstructured.NestedSlice(vmi.Object, "status", "conditions")
	for _, c := range conditions {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" && m["status"] == "True" {
			return true
		}
	}
	return false
}

func (a *availability) stop() (worst, steps int) {
	a.cancel()
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.worst, a.steps
}

var _ = Describe("VirtualMachinePool with only examples/deploy's RBAC", func() {
	It("creates, updates, restarts, keeps state and deletes as the controller's service account", func() {
		objs, err := manifest.Read([]string{
			filepath.Join(repoRoot, "examples", "deploy", "base", "namespace.yaml"),
			filepath.Join(repoRoot, "examples", "deploy", "base", "rbac.yaml"),
		}, nil)
		Expect(err).NotTo(HaveOccurred())
		for _, o := range objs {
			Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, o.Unstructured.DeepCopy()))).To(Succeed(), o.Describe())
		}
		asController := rest.CopyConfig(cfg)
		asController.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:virt-rules:virt-rules"}
		leaseNS := "virt-rules"
		stop, elected := startManagerOpts(asController, nil, &leaseNS)
		DeferCleanup(stop)
		Eventually(elected).Should(BeClosed())

		ns := createNamespace()
		simulateKubeVirt(ns, 0)
		create(newPool(ns, "rbac", 2, map[string]any{"scaleInStrategy": map[string]any{"proactive": map[string]any{
			"statePreservation": "Offline", "selectionPolicy": map[string]any{"basePolicy": "Newest"},
		}}}))
		Eventually(poolStatus(ns, "rbac")).Should(HaveKeyWithValue("readyReplicas", BeEquivalentTo(2)))

		p, err := getObject(newUnstructured(pool.GVKPool), ns, "rbac")
		Expect(err).NotTo(HaveOccurred())
		Expect(k8sClient.Patch(ctx, p, client.RawPatch(types.MergePatchType,
			[]byte(`{"spec":{"template":{"metadata":{"labels":{"version":"2"}}}}}`)))).To(Succeed())
		Eventually(vmEvents(ns, pool.ReasonRestarted)).Should(Equal(seq("rbac", 1, 2)))
		Eventually(poolStatus(ns, "rbac")).Should(HaveKeyWithValue("updatedReplicas", BeEquivalentTo(2)))

		scale(ns, "rbac", 1)
		Eventually(poolVMs(ns, "rbac")).Should(Equal([]string{"rbac-1"}))
		Eventually(func(g Gomega) map[string]string {
			dv, err := getObject(newUnstructured(pool.GVKDataVolume), ns, "disk-2")
			g.Expect(err).NotTo(HaveOccurred())
			return dv.GetLabels()
		}).Should(HaveKeyWithValue(pool.LabelPreserved, "rbac"))
		scale(ns, "rbac", 2)
		Eventually(func(g Gomega) map[string]string {
			dv, err := getObject(newUnstructured(pool.GVKDataVolume), ns, "disk-2")
			g.Expect(err).NotTo(HaveOccurred())
			return dv.GetLabels()
		}).ShouldNot(HaveKey(pool.LabelPreserved))
		Eventually(vmEvents(ns, pool.ReasonCreated)).Should(Equal(seq("rbac", 1, 2)))
	})
})

// minimalVMISpec is the smallest VMI spec KubeVirt's schema takes (domain.devices is required).
func minimalVMISpec() map[string]any {
	return map[string]any{"domain": map[string]any{
		"devices":   map[string]any{},
		"resources": map[string]any{"requests": map[string]any{"memory": "64Mi"}},
	}}
}
