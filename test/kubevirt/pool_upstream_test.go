package kubevirt_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/live"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// KubeVirt's own pool controller (virt-controller's, pool.kubevirt.io/v1beta1) is the oracle of
// virt-rules' pool plan under KubeVirt's semantics, as `eval` previews KubeVirt's pools. Each step reads the live
// state (the pool, its VMs, VMIs and ControllerRevisions), plans it with the change about to be
// made applied locally, makes the change on the real pool, and records what virt-controller
// then does until the first VM it touched is Ready again: the VMs it creates, deletes and
// updates, and the VMIs it restarts. That first wave is what one plan stands for: KubeVirt
// updates VMs in one pass and restarts their VMIs in the next, and starts no further
// disruption before one heals. Where KubeVirt picks at random (its Random sort policy), only
// what is determined is compared: how many, and from which VMs.
//
// The engine gets what eval's preview of KubeVirt's pools gives it (eval.KubeVirtPoolInput):
// KubeVirt's pool in virt-rules' terms (the same fields under pool.virt-rules.io/v1alpha1's
// names), each VM and VMI with the template hash virt-rules would have written on it had it
// made it from the ControllerRevision KubeVirt's label names, and KubeVirt's semantics. The
// specs' report entry counts the steps that agree.

var (
	kvPoolGVK     = schema.GroupVersionKind{Group: "pool.kubevirt.io", Version: "v1beta1", Kind: "VirtualMachinePool"}
	kvPoolKind    = kinds.NewObject(kvPoolGVK)
	vmResource    = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	vmiResourceKV = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
)

const (
	// kvRevisionLabel is where KubeVirt's pool controller writes the ControllerRevision (the
	// pool's spec at one generation) a VM, and so its VMI, was made from.
	kvRevisionLabel = "kubevirt.io/vm-pool-revision-name"
)

// kvPoolYAML is a KubeVirt VirtualMachinePool of VMs booting from a container disk.
var kvPoolYAML = `apiVersion: pool.kubevirt.io/v1beta1
kind: VirtualMachinePool
metadata: {name: '%[1]s'}
spec:
  replicas: %[2]d
  selector: {matchLabels: {kv-pool: '%[1]s'}}
  virtualMachineTemplate:
    metadata: {labels: {kv-pool: '%[1]s'}}
    spec:
      runStrategy: Always
      template:
` + clustersuite.VMI{Metadata: []string{"labels: {kv-pool: '%[1]s', tier: silver}"}, Requests: "{cpu: 100m, memory: 128Mi}"}.YAML(8)

// kvActions are the VM names a plan, or KubeVirt's first wave, creates, deletes (scale-in and
// autohealing), updates and restarts, each sorted.
type kvActions struct {
	Create, Delete, Update, Restart []string
}

// kvStep is one change to a pool and what is compared.
type kvStep struct {
	name string
	// act is a user's change to the cluster other than the pool (a VM edited, a launcher pod
	// turned not ready), made before the state is read; nil: none.
	act func(ns string)
	// change edits the pool's spec: applied locally for the plan, then to the real pool; nil:
	// the pool is not changed. For the first step, the pool is created with it.
	change func(spec map[string]any)
	// random names the lists KubeVirt picks at random, with the VMs it picks from.
	random map[string][]string
	// createReplicas are the replicas of a pool the step creates.
	createReplicas int
	// after undoes what act did once the wave is recorded (nil: nothing), so that the pool
	// settles.
	after func(ns string)
	// unsettled: KubeVirt is left waiting (a VM held while deleted, or halted), so the step
	// waits only until nothing happens.
	unsettled bool
}

var _ = Describe("VirtualMachinePool semantics kubevirt, judged by KubeVirt's own pool controller", Ordered, func() {
	var o *kvOracle

	BeforeAll(func() {
		o = newKVOracle()
	})

	// Every step of a spec is compared, whatever an earlier one found (KubeVirt acts either
	// way); the spec fails at its end with every mismatch.
	BeforeEach(func() { o.mismatches = nil })
	AfterEach(func() {
		Expect(o.mismatches).To(BeEmpty(), "virt-rules' plan (semantics kubevirt) and KubeVirt v1.8's pool controller")
	})

	AfterAll(func() {
		summary := fmt.Sprintf("%d steps: %d agree, %d mismatch (no difference is documented)", o.agree+o.mismatched, o.agree, o.mismatched)
		AddReportEntry("pool oracle: "+summary, strings.Join(o.cases, "\n"))
		fmt.Fprintln(GinkgoWriter, summary)
	})

	It("names VMs from 0, fills gaps, skips a detached VM's name; scale-in by ascending and descending ordinal", func() {
		ns := namespace(nil)
		o.create(ns, "n", 3, func(spec map[string]any) {
			spec["scaleInStrategy"] = map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{"sortPolicy": "AscendingOrder"}}}
		})
		o.step(ns, "n", kvStep{name: "scale in AscendingOrder 3 -> 1", change: replicas(1)})
		o.step(ns, "n", kvStep{name: "scale out 1 -> 4 fills gaps from 0", change: replicas(4)})
		o.step(ns, "n", kvStep{name: "scale in DescendingOrder 4 -> 2", change: func(spec map[string]any) {
			spec["replicas"] = int64(2)
			spec["scaleInStrategy"] = map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{"sortPolicy": "DescendingOrder"}}}
		}})
		o.step(ns, "n", kvStep{name: "a detached VM holds its name", act: func(ns string) {
			update(vmKind, ns, "n-0", func(_ Gomega, vm *unstructured.Unstructured) { vm.SetOwnerReferences(nil) })
		}})
		o.step(ns, "n", kvStep{name: "scale in Random 2 -> 1", change: func(spec map[string]any) {
			spec["replicas"] = int64(1)
			delete(spec, "scaleInStrategy")
		}, random: map[string][]string{"delete": {"n-1", "n-2"}}})
		var held string
		o.step(ns, "n", kvStep{name: "a VM being deleted counts until it is gone", act: func(ns string) {
			held = ownedVMs(ns, "n")[0]
			vm := update(vmKind, ns, held, func(_ Gomega, vm *unstructured.Unstructured) {
				vm.SetFinalizers(append(vm.GetFinalizers(), kvHoldFinalizer))
			})
			Expect(k8s.Delete(ctx, vm)).To(Succeed())
			Eventually(func(g Gomega) any { return get(vmKind, ns, held)(g).GetDeletionTimestamp() }).ShouldNot(BeNil())
		}, unsettled: true})
		o.step(ns, "n", kvStep{name: "its replacement once it is gone", act: func(ns string) {
			// KubeVirt's VM controller and pool controller drop their finalizers first; then
			// this one goes, and the VM with it. Read at once: KubeVirt waits a second.
			Eventually(func(g Gomega) []string { return get(vmKind, ns, held)(g).GetFinalizers() }).Should(Equal([]string{kvHoldFinalizer}))
			vm := update(vmKind, ns, held, func(_ Gomega, vm *unstructured.Unstructured) { vm.SetFinalizers(nil) })
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(vm), kinds.NewObject(kinds.VirtualMachine)))
			}).
				WithPolling(20 * time.Millisecond).Should(BeTrue())
		}})
	})

	It("scales in the oldest and the newest VMs, and only VMs its selectors match", func() {
		ns := namespace(nil)
		o.create(ns, "o", 1, func(spec map[string]any) {
			spec["scaleInStrategy"] = map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{"sortPolicy": "Oldest"}}}
		})
		// One VM per step: creation times a second or more apart, so Oldest and Newest are
		// determined (KubeVirt sorts on creationTimestamp alone, whose resolution is a second).
		for n := 2; n <= 4; n++ {
			time.Sleep(1100 * time.Millisecond)
			o.step(ns, "o", kvStep{name: fmt.Sprintf("scale out %d -> %d", n-1, n), change: replicas(n)})
		}
		o.step(ns, "o", kvStep{name: "scale in Oldest 4 -> 3", change: replicas(3)})
		o.step(ns, "o", kvStep{name: "scale in Newest 3 -> 2", change: func(spec map[string]any) {
			spec["replicas"] = int64(2)
			setPath(spec, "Newest", "scaleInStrategy", "proactive", "selectionPolicy", "sortPolicy")
		}})
		o.step(ns, "o", kvStep{name: "scale in Newest with a label selector filters 2 -> 1", act: func(ns string) {
			editVMITemplateLabels(ns, "o-1", map[string]string{"tier": "gold"})
		}, change: func(spec map[string]any) {
			spec["replicas"] = int64(1)
			setPath(spec, map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"tier": "gold"}}},
				"scaleInStrategy", "proactive", "selectionPolicy", "selectors")
		}})
		o.step(ns, "o", kvStep{name: "scale out 1 -> 3 fills gaps from 0", change: replicas(3)})
		o.step(ns, "o", kvStep{name: "opportunistic scale-in deletes no VM, a halted one neither", act: func(ns string) {
			halt(ns, "o-1")
		}, change: func(spec map[string]any) {
			spec["replicas"] = int64(2)
			spec["scaleInStrategy"] = map[string]any{"opportunistic": map[string]any{}}
		}, unsettled: true})
	})

	It("updates VMs at once and restarts their VMIs within maxUnavailable, not ready VMs first", func() {
		ns := namespace(nil)
		o.create(ns, "u", 4, func(spec map[string]any) {
			spec["maxUnavailable"] = int64(2)
			spec["updateStrategy"] = map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{"sortPolicy": "AscendingOrder"}}}
		})
		o.step(ns, "u", kvStep{name: "proactive update, maxUnavailable 2, u-3 not ready", act: func(ns string) {
			launcherNotReady(ns, "u-3")
		}, change: vmiLabel("version", "2")})
		o.step(ns, "u", kvStep{name: "a change of the VM's own metadata restarts no VMI", change: func(spec map[string]any) {
			setPath(spec, "a", "virtualMachineTemplate", "metadata", "labels", "team")
		}})
		o.step(ns, "u", kvStep{name: "opportunistic update: every VM, no VMI", change: func(spec map[string]any) {
			spec["updateStrategy"] = map[string]any{"opportunistic": map[string]any{}}
			vmiLabel("version", "3")(spec)
		}})
		o.step(ns, "u", kvStep{name: "pending restarts count against maxUnavailable 25%", change: func(spec map[string]any) {
			spec["maxUnavailable"] = "25%"
			spec["updateStrategy"] = map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{"sortPolicy": "DescendingOrder"}}}
		}})
		o.step(ns, "u", kvStep{name: "update selectors filter (labels the template keeps); a not ready VM outside them takes no budget", act: func(ns string) {
			for _, vm := range []string{"u-0", "u-1"} {
				editVMITemplateLabels(ns, vm, map[string]string{"canary": "true"})
			}
			launcherNotReady(ns, "u-3")
		}, after: func(ns string) {
			launcherReady(ns, "u-3")
		}, change: func(spec map[string]any) {
			spec["maxUnavailable"] = int64(1)
			vmiLabel("canary", "true")(spec)
			vmiLabel("version", "4")(spec)
			setPath(spec, map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"canary": "true"}}},
				"updateStrategy", "proactive", "selectionPolicy", "selectors")
		}})
		o.step(ns, "u", kvStep{name: "update selectors filter (labels the update removes)", act: func(ns string) {
			editVMITemplateLabels(ns, "u-2", map[string]string{"wave": "one"})
		}, change: func(spec map[string]any) {
			spec["maxUnavailable"] = "100%"
			vmiLabel("version", "5")(spec)
			setPath(spec, map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"wave": "one"}}},
				"updateStrategy", "proactive", "selectionPolicy", "selectors")
		}})
		o.step(ns, "u", kvStep{name: "proactive update, Random order, maxUnavailable 1", change: func(spec map[string]any) {
			spec["maxUnavailable"] = int64(1)
			spec["updateStrategy"] = map[string]any{"proactive": map[string]any{}}
			vmiLabel("version", "6")(spec)
		}, random: map[string][]string{"restart": {"u-0", "u-1", "u-2", "u-3"}}})
	})

	It("re-provisions a VM at startUpFailureThreshold consecutive start failures, not before", func() {
		ns := namespace(nil)
		o.healsAtThreshold(ns, "h", 2)
	})

	It("re-provisions a VM failing to schedule once minFailingToStartDuration has passed, not before", func() {
		ns := namespace(nil)
		o.step(ns, "s", kvStep{name: "create a pool whose VM cannot be scheduled", createReplicas: 1, change: func(spec map[string]any) {
			spec["autohealing"] = map[string]any{"minFailingToStartDuration": "40s"}
			setPath(spec, map[string]any{"virt-rules.test/nowhere": "true"}, "virtualMachineTemplate", "spec", "template", "spec", "nodeSelector")
		}, unsettled: true})
		var since time.Time
		Eventually(func(g Gomega) {
			vm := get(vmKind, ns, "s-0")(g)
			g.Expect(field(vm, "status", "printableStatus")).To(Equal("ErrorUnschedulable"))
			ready := kinds.Condition(vm, "Ready")
			g.Expect(ready).To(HaveKeyWithValue("status", "False"))
			t, err := time.Parse(time.RFC3339, fmt.Sprint(ready["lastProbeTime"]))
			g.Expect(err).NotTo(HaveOccurred(), "the Ready condition's lastProbeTime, which KubeVirt measures from")
			since = t
		}).Should(Succeed())
		Expect(time.Since(since)).To(BeNumerically("<", 30*time.Second), "time left to look before minFailingToStartDuration")
		o.step(ns, "s", kvStep{name: "ErrorUnschedulable for less than minFailingToStartDuration", act: pokePool("s"), unsettled: true})
		time.Sleep(time.Until(since.Add(45 * time.Second)))
		o.step(ns, "s", kvStep{name: "ErrorUnschedulable for minFailingToStartDuration", act: pokePool("s"), unsettled: true})
	})
})

// pokePool changes an annotation of the pool, which has KubeVirt's pool controller look at it
// again (it does not on its own when time passes).
func pokePool(name string) func(ns string) {
	return func(ns string) {
		GinkgoHelper()
		update(kvPoolKind, ns, name, func(_ Gomega, p *unstructured.Unstructured) {
			p.SetAnnotations(map[string]string{"virt-rules.test/poked": time.Now().Format(time.RFC3339Nano)})
		})
	}
}

// healsAtThreshold creates a pool of one VM whose VMI fails to start, with
// startUpFailureThreshold threshold, and follows KubeVirt until it deletes the VM and creates
// it again. Every VM KubeVirt wrote on the way (each new consecutiveFailCount), and the state
// once the VM is gone, is planned: virt-rules must re-provision where KubeVirt deleted next,
// not where it kept the VM, and create the name KubeVirt creates.
func (o *kvOracle) healsAtThreshold(ns, name string, threshold int) {
	GinkgoHelper()
	pool := fromYAML(fmt.Sprintf(kvPoolYAML, name, 1))
	pool.SetNamespace(ns)
	spec := pool.Object["spec"].(map[string]any)
	spec["autohealing"] = map[string]any{"startUpFailureThreshold": int64(threshold)}
	setPath(spec, "true", "virtualMachineTemplate", "spec", "template", "metadata", "annotations", "testcluster.virt-rules.io/fail-start")
	before := o.observe(ns, name)
	rec := o.record(ns, before)
	defer rec.stop()
	Expect(k8s.Create(ctx, pool)).To(Succeed())
	// Until KubeVirt has deleted the first VM and made its successor.
	var first string
	Eventually(func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, ev := range rec.events {
			if ev.vmi || ev.obj.GetName() != name+"-0" {
				continue
			}
			if first == "" {
				first = string(ev.obj.GetUID())
			}
			if ev.typ == watch.Added && string(ev.obj.GetUID()) != first {
				return true
			}
		}
		return false
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(BeTrue())
	rec.mu.Lock()
	events := slices.Clone(rec.events)
	rec.mu.Unlock()

	live := get(kvPoolKind, ns, name)(Default)
	vmis := map[string]*unstructured.Unstructured{}
	var seen []int64
	for i, ev := range events {
		obj := ev.obj
		if ev.vmi {
			if ev.typ == watch.Deleted {
				delete(vmis, obj.GetName())
			} else {
				vmis[obj.GetName()] = obj
			}
			continue
		}
		if string(obj.GetUID()) != first {
			continue
		}
		if ev.typ == watch.Deleted {
			// Gone: the name is free, and KubeVirt creates it again.
			plan, err := o.plan(live, kvState{vmis: slices.Collect(maps.Values(vmis))}, time.Now())
			o.judge("once the failing VM is gone, its name is created again", plan, err, func(p *engine.PoolPlan) []string {
				return namesOf(p.Create, func(c engine.PoolCreate) string { return c.Name })
			}, []string{name + "-0"})
			break
		}
		count, _, _ := unstructured.NestedInt64(obj.Object, "status", "startFailure", "consecutiveFailCount")
		if count == 0 || slices.Contains(seen, count) || obj.GetDeletionTimestamp() != nil {
			continue
		}
		seen = append(seen, count)
		// What KubeVirt did next with this VM: deleted it before it counted another failure?
		deletedNext := false
		for _, later := range events[i+1:] {
			if later.vmi || string(later.obj.GetUID()) != first {
				continue
			}
			if later.typ == watch.Deleted || later.obj.GetDeletionTimestamp() != nil {
				deletedNext = true
				break
			}
			if c, _, _ := unstructured.NestedInt64(later.obj.Object, "status", "startFailure", "consecutiveFailCount"); c != count {
				break
			}
		}
		var want []string
		if deletedNext {
			want = []string{name + "-0"}
		}
		plan, err := o.plan(live, kvState{vms: []*unstructured.Unstructured{obj}, vmis: slices.Collect(maps.Values(vmis))}, time.Now())
		o.judge(fmt.Sprintf("%d consecutive start failures, threshold %d", count, threshold), plan, err, func(p *engine.PoolPlan) []string {
			return namesOf(p.Reprovision, func(r engine.PoolReprovision) string { return r.Name })
		}, want)
	}
	Expect(seen).To(ContainElement(int64(threshold)), "KubeVirt counted up to the threshold")
}

// judge compares one list of a plan with what KubeVirt did, and tallies it.
func (o *kvOracle) judge(step string, plan *engine.PoolPlan, err error, list func(*engine.PoolPlan) []string, want []string) {
	GinkgoHelper()
	var got []string
	if err != nil {
		o.mismatches = append(o.mismatches, fmt.Sprintf("%s: no plan: %v", step, err))
	} else {
		got = list(plan)
	}
	fmt.Fprintf(GinkgoWriter, "%s\n  virt-rules %v\n  KubeVirt   %v\n", step, sorted(got), sorted(want))
	if !slices.Equal(sorted(got), sorted(want)) {
		msg := fmt.Sprintf("%s: virt-rules %v, KubeVirt %v", step, sorted(got), sorted(want))
		o.mismatches = append(o.mismatches, msg)
		o.mismatched++
		o.cases = append(o.cases, "MISMATCH: "+msg)
		return
	}
	o.agree++
	o.cases = append(o.cases, "agrees: "+step)
}

func replicas(n int) func(map[string]any) {
	return func(spec map[string]any) { spec["replicas"] = int64(n) }
}

// vmiLabel sets a label of the VMI template.
func vmiLabel(key, value string) func(map[string]any) {
	return func(spec map[string]any) {
		setPath(spec, value, "virtualMachineTemplate", "spec", "template", "metadata", "labels", key)
	}
}

func setPath(obj map[string]any, value any, path ...string) {
	GinkgoHelper()
	Expect(unstructured.SetNestedField(obj, runtime.DeepCopyJSONValue(value), path...)).To(Succeed())
}

// editVMITemplateLabels adds labels to a VM's VMI template, as a user would; KubeVirt's pool
// controller leaves such edits alone (the VM keeps its revision) until it updates the VM.
func editVMITemplateLabels(ns, name string, labels map[string]string) {
	GinkgoHelper()
	update(vmKind, ns, name, func(g Gomega, vm *unstructured.Unstructured) {
		for k, v := range labels {
			g.Expect(unstructured.SetNestedField(vm.Object, v, "spec", "template", "metadata", "labels", k)).To(Succeed())
		}
	})
}

// kvHoldFinalizer keeps a deleted VM, so that a step sees KubeVirt while it is being deleted.
const kvHoldFinalizer = "virt-rules.test/hold"

// ownedVMs are the names of the VMs pool owns (by controller reference), sorted.
func ownedVMs(ns, pool string) []string {
	GinkgoHelper()
	vms := kinds.NewList(kinds.VirtualMachine)
	Expect(k8s.List(ctx, vms, client.InNamespace(ns))).To(Succeed())
	var out []string
	for i := range vms.Items {
		if ref := metav1.GetControllerOf(&vms.Items[i]); ref != nil && ref.Kind == kvPoolGVK.Kind && ref.Name == pool {
			out = append(out, vms.Items[i].GetName())
		}
	}
	return sorted(out)
}

// halt stops VM name as a user would (runStrategy Halted) and waits until its VMI is gone.
func halt(ns, name string) {
	GinkgoHelper()
	update(vmKind, ns, name, func(g Gomega, vm *unstructured.Unstructured) {
		g.Expect(unstructured.SetNestedField(vm.Object, "Halted", "spec", "runStrategy")).To(Succeed())
	})
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, kinds.NewObject(kinds.VirtualMachineInstance)))
	}).Should(BeTrue())
	Eventually(func(g Gomega) any { return field(get(vmKind, ns, name)(g), "status", "printableStatus") }).Should(Equal("Stopped"))
}

// launcherReady undoes launcherNotReady.
func launcherReady(ns, name string) {
	GinkgoHelper()
	setLauncherReady(ns, name, corev1.ConditionTrue, "")
	Eventually(func(g Gomega) any { return field(get(vmKind, ns, name)(g), "status", "ready") }).Should(Equal(true))
}

// launcherNotReady turns the launcher pod of VM name not ready, as kubelet does when its
// readiness probe fails (kwok keeps a Running pod's conditions), and waits until KubeVirt
// reports the VM not ready.
func launcherNotReady(ns, name string) {
	GinkgoHelper()
	setLauncherReady(ns, name, corev1.ConditionFalse, "ReadinessProbeFailed")
	// status.ready is omitted when false.
	Eventually(func(g Gomega) any { return field(get(vmKind, ns, name)(g), "status", "ready") }).ShouldNot(Equal(true))
}

func setLauncherReady(ns, name string, status corev1.ConditionStatus, reason string) {
	GinkgoHelper()
	vmi := get(vmiKind, ns, name)(Default)
	Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io/created-by": string(vmi.GetUID())})).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(1))
		pod := &pods.Items[0]
		for i, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
				pod.Status.Conditions[i].Status = status
				pod.Status.Conditions[i].Reason = reason
			}
		}
		g.Expect(k8s.Status().Update(ctx, pod)).To(Succeed())
	}).Should(Succeed())
}

// kvOracle plans as eval previews KubeVirt's pools and records what KubeVirt does.
type kvOracle struct {
	eng *engine.Engine
	dyn dynamic.Interface
	// mismatches are the current spec's steps where virt-rules and KubeVirt differ.
	mismatches []string
	// The steps of every spec by class, for the report.
	agree, mismatched int
	cases             []string
}

func newKVOracle() *kvOracle {
	GinkgoHelper()
	// The shipped bundle as it is: eval asks for KubeVirt's semantics in its input.
	eng, err := engine.New(ctx, engine.WithBundlePath(clustersuite.ShippedBundleDir()))
	Expect(err).NotTo(HaveOccurred())
	dyn, err := dynamic.NewForConfig(cluster.Config)
	Expect(err).NotTo(HaveOccurred())
	return &kvOracle{eng: eng, dyn: dyn}
}

// kvState is the live state of one pool: as read, with the lists' resource versions.
type kvState struct {
	pool        *unstructured.Unstructured // nil before it exists
	vms, vmis   []*unstructured.Unstructured
	vmRV, vmiRV string
}

func (o *kvOracle) observe(ns, name string) kvState {
	GinkgoHelper()
	var s kvState
	pool := kinds.NewObject(kvPoolGVK)
	err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pool)
	if err == nil {
		s.pool = pool
	} else {
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "read pool: %v", err)
	}
	vms := kinds.NewList(kinds.VirtualMachine)
	Expect(k8s.List(ctx, vms, client.InNamespace(ns))).To(Succeed())
	vmis := kinds.NewList(kinds.VirtualMachineInstance)
	Expect(k8s.List(ctx, vmis, client.InNamespace(ns))).To(Succeed())
	for i := range vms.Items {
		s.vms = append(s.vms, &vms.Items[i])
	}
	for i := range vmis.Items {
		s.vmis = append(s.vmis, &vmis.Items[i])
	}
	s.vmRV, s.vmiRV = vms.GetResourceVersion(), vmis.GetResourceVersion()
	return s
}

// create makes the pool name with n replicas (edited by change) as the first step.
func (o *kvOracle) create(ns, name string, n int, change func(spec map[string]any)) {
	GinkgoHelper()
	o.step(ns, name, kvStep{name: fmt.Sprintf("create with %d replicas: names from 0", n), change: change, createReplicas: n})
}

// step runs one step and compares.
func (o *kvOracle) step(ns, name string, st kvStep) {
	GinkgoHelper()
	By(name + ": " + st.name)
	if st.act != nil {
		st.act(ns)
	}
	before := o.observe(ns, name)
	var pool *unstructured.Unstructured
	if before.pool == nil {
		pool = fromYAML(fmt.Sprintf(kvPoolYAML, name, st.createReplicas))
		pool.SetNamespace(ns)
	} else {
		pool = before.pool.DeepCopy()
	}
	if st.change != nil {
		spec, _ := pool.Object["spec"].(map[string]any)
		st.change(spec)
	}
	plan, err := o.plan(pool, before, time.Now())
	if err != nil {
		o.mismatches = append(o.mismatches, fmt.Sprintf("%s: no plan: %v", st.name, err))
		plan = &engine.PoolPlan{}
	}
	// A VM re-provisioned is deleted, and created again under its name once it is gone.
	reprovisioned := namesOf(plan.Reprovision, func(r engine.PoolReprovision) string { return r.Name })
	want := kvActions{
		Create:  sorted(append(namesOf(plan.Create, func(c engine.PoolCreate) string { return c.Name }), reprovisioned...)),
		Delete:  sorted(append(namesOf(plan.Delete, func(d engine.PoolDelete) string { return d.Name }), reprovisioned...)),
		Update:  sorted(namesOf(plan.Update, func(u engine.PoolUpdate) string { return u.Name })),
		Restart: sorted(slices.Clone(plan.Restart)),
	}
	rec := o.record(ns, before)
	switch {
	case before.pool == nil:
		Expect(k8s.Create(ctx, pool)).To(Succeed())
	case st.change != nil:
		update(kvPoolKind, ns, name, func(_ Gomega, live *unstructured.Unstructured) {
			spec, _ := live.Object["spec"].(map[string]any)
			st.change(spec)
		})
	}
	got := rec.wave(before)
	rec.stop()
	if !o.compare(st, want, got) {
		o.reportInput(st.name, pool, before, rec)
	}
	if st.after != nil {
		st.after(ns)
	}
	o.settle(ns, name, !st.unsettled)
}

// reportInput puts what a mismatched step planned from, and what KubeVirt did, into the
// report: the input as the engine got it, and KubeVirt's writes in order.
func (o *kvOracle) reportInput(step string, pool *unstructured.Unstructured, before kvState, rec *kvRecorder) {
	GinkgoHelper()
	input, err := o.input(pool, before, time.Now())
	in := map[string]any{"error": fmt.Sprint(err)}
	if err == nil {
		var vms, vmis []any
		for _, vm := range input.VMs {
			vms = append(vms, vm.Object)
		}
		for _, vmi := range input.VMIs {
			vmis = append(vmis, vmi.Object)
		}
		in = map[string]any{"pool": input.Pool.Object, "vms": vms, "vmis": vmis, "semantics": input.Semantics}
	}
	var writes []string
	rec.mu.Lock()
	for _, ev := range rec.events {
		kind := "VM"
		if ev.vmi {
			kind = "VMI"
		}
		writes = append(writes, fmt.Sprintf("%s %s %s uid=%s revision=%s deleting=%v phase=%v ready=%v", ev.typ, kind, ev.obj.GetName(), ev.obj.GetUID(),
			ev.obj.GetLabels()[kvRevisionLabel], ev.obj.GetDeletionTimestamp() != nil, field(ev.obj, "status", "phase"), field(ev.obj, "status", "ready")))
	}
	rec.mu.Unlock()
	raw, err := json.MarshalIndent(in, "", "  ")
	Expect(err).NotTo(HaveOccurred())
	AddReportEntry("virt-rules' input at "+step, string(raw), ReportEntryVisibilityFailureOrVerbose)
	AddReportEntry("KubeVirt's writes after "+step, strings.Join(writes, "\n"), ReportEntryVisibilityFailureOrVerbose)
}

// compare wants got (KubeVirt) and want (virt-rules' plan) alike, or, for Random lists, alike
// in number and both drawn from the given VMs; it tallies the step and tells whether it agrees.
func (o *kvOracle) compare(st kvStep, want, got kvActions) bool {
	GinkgoHelper()
	lists := map[string][2][]string{
		"create": {want.Create, got.Create}, "delete": {want.Delete, got.Delete},
		"update": {want.Update, got.Update}, "restart": {want.Restart, got.Restart},
	}
	var problems []string
	for _, key := range []string{"create", "delete", "update", "restart"} {
		w, g := lists[key][0], lists[key][1]
		if from, ok := st.random[key]; ok {
			if len(w) != len(g) || !subset(w, from) || !subset(g, from) {
				problems = append(problems, fmt.Sprintf("%s: virt-rules %v, KubeVirt %v: want as many, each of %v", key, w, g, from))
			}
			continue
		}
		if !slices.Equal(w, g) {
			problems = append(problems, fmt.Sprintf("%s: virt-rules %v, KubeVirt %v", key, w, g))
		}
	}
	if len(problems) > 0 {
		o.mismatches = append(o.mismatches, st.name+": "+strings.Join(problems, "; "))
		o.mismatched++
		o.cases = append(o.cases, "MISMATCH: "+st.name+": "+strings.Join(problems, "; "))
		return false
	}
	o.agree++
	o.cases = append(o.cases, "agrees: "+st.name)
	return true
}

// plan is virt-rules' plan for pool (KubeVirt's, as changed locally) over the state, from the
// input eval's preview of KubeVirt's pools gives the engine.
func (o *kvOracle) plan(pool *unstructured.Unstructured, s kvState, now time.Time) (*engine.PoolPlan, error) {
	GinkgoHelper()
	in, err := o.input(pool, s, now)
	if err != nil {
		return nil, err
	}
	return o.eng.PoolPlan(ctx, in)
}

// input is eval's input for pool over the state and the namespace's ControllerRevisions, as
// read now (eval.KubeVirtPoolInput: the pool in virt-rules' terms, each VM and VMI stamped with
// its revision's template hash, KubeVirt's semantics).
func (o *kvOracle) input(pool *unstructured.Unstructured, s kvState, now time.Time) (engine.PoolInput, error) {
	GinkgoHelper()
	revisions := kinds.NewList(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "ControllerRevision"})
	Expect(k8s.List(ctx, revisions, client.InNamespace(pool.GetNamespace()))).To(Succeed())
	var objs []manifest.Object
	add := func(u *unstructured.Unstructured) {
		objs = append(objs, manifest.Object{Source: live.Source, Unstructured: u.DeepCopy()})
	}
	for i := range revisions.Items {
		add(&revisions.Items[i])
	}
	for _, vm := range s.vms {
		add(vm)
	}
	for _, vmi := range s.vmis {
		add(vmi)
	}
	p := pool.DeepCopy()
	p.SetGroupVersionKind(kvPoolGVK)
	in, idle, _, err := eval.KubeVirtPoolInput(ctx, o.eng, manifest.Object{Source: live.Source, Unstructured: p}, objs, now)
	if err == nil && idle != "" {
		err = fmt.Errorf("KubeVirt's controller plans nothing: %s", idle)
	}
	return in, err
}

// kvRecorder watches the namespace's VMs and VMIs from a state's resource versions.
type kvRecorder struct {
	mu     sync.Mutex
	events []kvEvent
	last   time.Time
	stop   func()
}

type kvEvent struct {
	vmi bool
	typ watch.EventType
	obj *unstructured.Unstructured
}

func (o *kvOracle) record(ns string, s kvState) *kvRecorder {
	GinkgoHelper()
	r := &kvRecorder{last: time.Now()}
	var stops []func()
	for _, w := range []struct {
		vmi bool
		res schema.GroupVersionResource
		rv  string
	}{{false, vmResource, s.vmRV}, {true, vmiResourceKV, s.vmiRV}} {
		wi, err := o.dyn.Resource(w.res).Namespace(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: w.rv})
		Expect(err).NotTo(HaveOccurred())
		stops = append(stops, wi.Stop)
		go func() {
			for ev := range wi.ResultChan() {
				obj, ok := ev.Object.(*unstructured.Unstructured)
				if !ok {
					continue
				}
				r.mu.Lock()
				r.events = append(r.events, kvEvent{vmi: w.vmi, typ: ev.Type, obj: obj})
				r.last = time.Now()
				r.mu.Unlock()
			}
		}()
	}
	r.stop = func() {
		for _, s := range stops {
			s()
		}
	}
	return r
}

// kvQuiet is how long KubeVirt does nothing before a wave that has not healed a VM is over:
// longer than its pool controller's delays (1 s to enqueue, 3 s to retry an update held by
// maxUnavailable).
const kvQuiet = 6 * time.Second

// wave is what KubeVirt did from the state before: the VMs created, deleted and updated, and
// the VMIs deleted (restarted) of VMs it kept, until a VMI it started is Ready, or nothing
// happens for kvQuiet.
func (r *kvRecorder) wave(before kvState) kvActions {
	GinkgoHelper()
	var got kvActions
	Eventually(func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		var healed bool
		got, healed = waveOf(before, r.events)
		return healed || time.Since(r.last) >= kvQuiet
	}).WithTimeout(2 * time.Minute).WithPolling(250 * time.Millisecond).Should(BeTrue())
	return got
}

func waveOf(before kvState, events []kvEvent) (kvActions, bool) {
	vmRevision := map[string]string{}
	going := map[string]bool{} // VMs being deleted already: their VMIs go with them
	for _, vm := range before.vms {
		if vm.GetDeletionTimestamp() == nil {
			vmRevision[string(vm.GetUID())] = vm.GetLabels()[kvRevisionLabel]
		} else {
			going[vm.GetName()] = true
		}
	}
	oldVMI := map[string]bool{}
	for _, vmi := range before.vmis {
		if vmi.GetDeletionTimestamp() == nil {
			oldVMI[string(vmi.GetUID())] = true
		}
	}
	created, deleted, updated, gone := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	healed := false
	for _, ev := range events {
		obj, uid, name := ev.obj, string(ev.obj.GetUID()), ev.obj.GetName()
		going := ev.typ == watch.Deleted || obj.GetDeletionTimestamp() != nil
		if ev.vmi {
			if going && oldVMI[uid] {
				gone[name] = true
			}
			if !oldVMI[uid] && !going && field(obj, "status", "phase") == "Running" && kinds.Condition(obj, "Ready")["status"] == "True" {
				healed = true
				break
			}
			continue
		}
		switch old, known := vmRevision[uid]; {
		case !known && ev.typ == watch.Added:
			created[name] = true
		case known && going:
			deleted[name] = true
		case known && obj.GetLabels()[kvRevisionLabel] != old:
			updated[name] = true
		}
	}
	var got kvActions
	got.Create, got.Delete, got.Update = sorted(slices.Collect(maps.Keys(created))), sorted(slices.Collect(maps.Keys(deleted))), sorted(slices.Collect(maps.Keys(updated)))
	for name := range gone {
		if !deleted[name] && !going[name] {
			got.Restart = append(got.Restart, name)
		}
	}
	got.Restart = sorted(got.Restart)
	return got, healed
}

// settle waits until KubeVirt is done with the pool: nothing changes for kvQuiet and, with
// ready, no VM or VMI is being deleted and every VM the pool owns is Ready.
func (o *kvOracle) settle(ns, name string, ready bool) {
	GinkgoHelper()
	s := o.observe(ns, name)
	r := o.record(ns, s)
	defer r.stop()
	Eventually(func(g Gomega) {
		r.mu.Lock()
		quiet := time.Since(r.last)
		r.mu.Unlock()
		g.Expect(quiet).To(BeNumerically(">=", kvQuiet))
		if !ready {
			return
		}
		now := o.observe(ns, name)
		for _, obj := range append(now.vms, now.vmis...) {
			g.Expect(obj.GetDeletionTimestamp()).To(BeNil(), "%s %s is being deleted", obj.GetKind(), obj.GetName())
		}
		for _, vm := range now.vms {
			if ref := metav1.GetControllerOf(vm); ref != nil && ref.Kind == kvPoolGVK.Kind {
				g.Expect(field(vm, "status", "ready")).To(Equal(true), "VM %s is ready", vm.GetName())
			}
		}
	}).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
}

func namesOf[T any](items []T, name func(T) string) []string {
	out := []string{}
	for _, it := range items {
		out = append(out, name(it))
	}
	return out
}

func sorted(s []string) []string {
	if s == nil {
		s = []string{}
	}
	slices.SortFunc(s, func(a, b string) int {
		// By pool and number, so that logs read n-2 before n-10.
		ai, aerr := strconv.Atoi(a[strings.LastIndex(a, "-")+1:])
		bi, berr := strconv.Atoi(b[strings.LastIndex(b, "-")+1:])
		if aerr == nil && berr == nil && a[:strings.LastIndex(a, "-")] == b[:strings.LastIndex(b, "-")] {
			return ai - bi
		}
		return strings.Compare(a, b)
	})
	return s
}

func subset(s, of []string) bool {
	for _, x := range s {
		if !slices.Contains(of, x) {
			return false
		}
	}
	return true
}
