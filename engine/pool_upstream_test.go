package engine_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/virt-rules/virt-rules/test/reference"
)

// The pool's differential suite against KubeVirt v1.9.0's pool controller
// (pkg/virt-controller/watch/pool/pool.go), one case per fact read in its unit tests
// (pool_test.go, named in each case) or, where no test states it, its code. Fixtures are this
// project's own. Every case runs with the shipped semantics and with settings.semantics:
// kubevirt, through the engine and the Go reference (which must agree), and is labelled:
//
//   - agrees: both semantics give upstream's answer;
//   - differs: the design's semantics (default) differ from upstream on purpose, KubeVirt's
//     give upstream's answer.

type upstreamCase struct {
	name, upstream, class string
	in                    poolCase
	// upstreamWants is upstream's answer; defaultWants what the design answers instead (differs).
	upstreamWants, defaultWants func(reference.PoolPlan) bool
}

var upNow = time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)

var upTemplate = map[string]any{"spec": map[string]any{"running": true}}

func upPool(spec map[string]any) map[string]any {
	full := map[string]any{"replicas": int64(0), "template": upTemplate}
	for k, v := range spec {
		full[k] = v
	}
	return map[string]any{"metadata": map[string]any{"name": "my-pool", "namespace": "ns", "uid": "u"}, "spec": full}
}

// upVM is the pool's VM number n on the current template, running, reported ready, created n
// seconds after the first.
func upVM(n int, edit ...func(vm map[string]any)) map[string]any {
	vm := map[string]any{
		"metadata": map[string]any{
			"name":              fmt.Sprintf("my-pool-%d", n),
			"creationTimestamp": upNow.Add(-time.Hour + time.Duration(n)*time.Second).Format(time.RFC3339),
			"annotations":       map[string]any{"pool.virt-rules.io/template-hash": reference.TemplateHash(upTemplate)},
			"ownerReferences":   []any{map[string]any{"kind": "VirtualMachinePool", "name": "my-pool", "uid": "u", "controller": true}},
		},
		"spec":   map[string]any{"running": true},
		"status": map[string]any{"ready": true},
	}
	for _, e := range edit {
		e(vm)
	}
	return vm
}

// upVMICurrent stands for the hash a VMI running the current template carries, which depends
// on the semantics (reference.PoolVMIHash): forSemantics puts it in.
const upVMICurrent = "<current>"

// upVMI is VM n's running VMI, from the current template (or an older one), Ready or not.
func upVMI(n int, current, ready bool) map[string]any {
	hash := upVMICurrent
	if !current {
		hash = "old"
	}
	status := "True"
	if !ready {
		status = "False"
	}
	return map[string]any{
		"metadata": map[string]any{"name": fmt.Sprintf("my-pool-%d", n), "annotations": map[string]any{"pool.virt-rules.io/template-hash": hash}},
		"status":   map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": status}}},
	}
}

func upCase(pool map[string]any, vms, vmis []map[string]any) poolCase {
	return poolCase{Pool: pool, VMs: vms, VMIs: vmis, Now: upNow, Burst: 250}
}

func upRange(from, to int, f func(n int) map[string]any) []map[string]any {
	var out []map[string]any
	for n := from; n <= to; n++ {
		out = append(out, f(n))
	}
	return out
}

func withTemplateLabels(labels map[string]any) func(map[string]any) {
	return func(vm map[string]any) {
		vm["spec"].(map[string]any)["template"] = map[string]any{"metadata": map[string]any{"labels": labels}}
	}
}

func failingFor(status string, d time.Duration) func(map[string]any) {
	return func(vm map[string]any) {
		vm["status"] = map[string]any{"ready": false, "printableStatus": status, "conditions": []any{map[string]any{
			"type": "Ready", "status": "False", "lastProbeTime": upNow.Add(-d).Format(time.RFC3339),
		}}}
	}
}

func creates(names ...string) func(reference.PoolPlan) bool {
	return func(p reference.PoolPlan) bool { return slices.Equal(p.Create, names) }
}

func restarts(n int) func(reference.PoolPlan) bool {
	return func(p reference.PoolPlan) bool { return len(p.Restart) == n }
}

func restartsExactly(names ...string) func(reference.PoolPlan) bool {
	return func(p reference.PoolPlan) bool { return slices.Equal(p.Restart, names) }
}

func deletes(names ...string) func(reference.PoolPlan) bool {
	return func(p reference.PoolPlan) bool {
		var got []string
		for _, d := range p.Delete {
			got = append(got, d.Name)
		}
		slices.Sort(got)
		return slices.Equal(got, names)
	}
}

func reprovisions(names ...string) func(reference.PoolPlan) bool {
	return func(p reference.PoolPlan) bool { return slices.Equal(p.Reprovision, names) }
}

func upstreamCases() []upstreamCase {
	pending := func(n int) map[string]any { return upVMI(n, false, true) }
	vms := func(from, to int) []map[string]any {
		return upRange(from, to, func(n int) map[string]any { return upVM(n) })
	}
	canary := map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{
		"orderedPolicies": []any{map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"app": "test"}}}},
	}}}
	labelled := append(upRange(0, 1, func(n int) map[string]any { return upVM(n, withTemplateLabels(map[string]any{"app": "test"})) }), vms(2, 4)...)
	cases := []upstreamCase{{
		name: "VM names fill gaps from 0", upstream: `"Calculate new VM names on scale out": "should fill in name gaps"`, class: classDiffers,
		in:            upCase(upPool(map[string]any{"replicas": int64(5)}), []map[string]any{upVM(1), upVM(3)}, []map[string]any{upVMI(1, true, true), upVMI(3, true, true)}),
		upstreamWants: creates("my-pool-0", "my-pool-2", "my-pool-4"), defaultWants: creates("my-pool-2", "my-pool-4", "my-pool-5"),
	}, {
		name: "VM names append after the last", upstream: `"Calculate new VM names on scale out": "should append to end if no name gaps exist"`, class: classAgrees,
		in:            upCase(upPool(map[string]any{"replicas": int64(5)}), vms(0, 2), upRange(0, 2, func(n int) map[string]any { return upVMI(n, true, true) })),
		upstreamWants: creates("my-pool-3", "my-pool-4"),
	}, {
		name: "pending restarts within maxUnavailable 25%", upstream: "should respect maxUnavailable limit during proactive updates", class: classAgrees,
		in:            upCase(upPool(map[string]any{"replicas": int64(4), "maxUnavailable": "25%"}), vms(0, 3), upRange(0, 3, pending)),
		upstreamWants: restarts(1),
	}, {
		name: "no restart while a VMI is not ready", upstream: "should not trigger proactive update when VMs are not ready", class: classAgrees,
		in: upCase(upPool(map[string]any{"replicas": int64(4), "maxUnavailable": "25%"}), vms(0, 3),
			append(upRange(0, 2, pending), upVMI(3, false, false))),
		upstreamWants: restarts(0),
	}, {
		name: "maxUnavailable unset restarts all (Newest)", upstream: "should update Newest VMs first when using Newest sort policy for update strategy", class: classDiffers,
		in: upCase(upPool(map[string]any{"replicas": int64(5), "updateStrategy": map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{"basePolicy": "Newest"}}}}),
			vms(0, 4), upRange(0, 4, pending)),
		upstreamWants: restarts(5), defaultWants: restartsExactly("my-pool-4"),
	}, {
		name: "update label selector filters (as upstream: maxUnavailable unset)", upstream: "should update VMIs and VMs using label selector filtering for proactive update strategy", class: classDiffers,
		in:            upCase(upPool(map[string]any{"replicas": int64(5), "updateStrategy": canary}), labelled, upRange(0, 4, pending)),
		upstreamWants: restartsExactly("my-pool-0", "my-pool-1"), defaultWants: restarts(1),
	}, {
		name: "update label selector filters (maxUnavailable 100%)", upstream: "should update VMIs and VMs using label selector filtering for proactive update strategy", class: classDiffers,
		in:            upCase(upPool(map[string]any{"replicas": int64(5), "updateStrategy": canary, "maxUnavailable": "100%"}), labelled, upRange(0, 4, pending)),
		upstreamWants: restartsExactly("my-pool-0", "my-pool-1"), defaultWants: restarts(5),
	}, {
		name: "maxUnavailable 0 resolves to 1", upstream: "calculateMaxUnavailableInt (code: at least 1, integers too)", class: classDiffers,
		in:            upCase(upPool(map[string]any{"replicas": int64(2), "maxUnavailable": int64(0)}), vms(0, 1), upRange(0, 1, pending)),
		upstreamWants: restarts(1), defaultWants: restarts(0),
	}, {
		name: "scale-in Oldest", upstream: "should delete Oldest VMs first when using Oldest sort for scale-in strategy", class: classAgrees,
		in: upCase(upPool(map[string]any{"replicas": int64(2), "scaleInStrategy": map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{"basePolicy": "Oldest"}}}}),
			vms(0, 4), upRange(0, 4, func(n int) map[string]any { return upVMI(n, true, true) })),
		upstreamWants: deletes("my-pool-0", "my-pool-1", "my-pool-2"),
	}, {
		name: "scale-in label selector filters", upstream: "scaleIn (code: sort, then filterVMsBasedOnSelectors, then the first count)", class: classDiffers,
		in: upCase(upPool(map[string]any{"replicas": int64(2), "scaleInStrategy": map[string]any{"proactive": map[string]any{"selectionPolicy": map[string]any{
			"basePolicy": "Oldest", "orderedPolicies": canary["proactive"].(map[string]any)["selectionPolicy"].(map[string]any)["orderedPolicies"],
		}}}}), labelled, upRange(0, 4, func(n int) map[string]any { return upVMI(n, true, true) })),
		upstreamWants: deletes("my-pool-0", "my-pool-1"), defaultWants: deletes("my-pool-0", "my-pool-1", "my-pool-2"),
	}, {
		name: "unmanaged update touches nothing", upstream: "should not update a VM if the update strategy is set to unmanaged", class: classAgrees,
		in: upCase(upPool(map[string]any{"replicas": int64(2), "updateStrategy": map[string]any{"unmanaged": map[string]any{}}}),
			upRange(0, 1, func(n int) map[string]any {
				return upVM(n, func(vm map[string]any) { vm["metadata"].(map[string]any)["annotations"] = map[string]any{} })
			}), upRange(0, 1, pending)),
		upstreamWants: func(p reference.PoolPlan) bool { return len(p.Update) == 0 && len(p.Restart) == 0 },
	}, {
		name: "autohealing at the start failure threshold", upstream: "should cleanup VMs with autohealing when the threshold for Consecutive failures is exceeded", class: classAgrees,
		in: upCase(upPool(map[string]any{"replicas": int64(1), "autohealing": map[string]any{"startupFailureThreshold": int64(3)}}),
			[]map[string]any{upVM(0, func(vm map[string]any) {
				vm["status"] = map[string]any{"ready": false, "startFailure": map[string]any{"consecutiveFailCount": int64(3)}}
			})}, nil),
		upstreamWants: reprovisions("my-pool-0"),
	}, {
		name: "no autohealing without the field", upstream: "should not cleanup VMs without autohealing enabled, even if the VM failed to start", class: classAgrees,
		in: upCase(upPool(map[string]any{"replicas": int64(1)}),
			[]map[string]any{upVM(0, func(vm map[string]any) {
				vm["status"] = map[string]any{"ready": false, "startFailure": map[string]any{"consecutiveFailCount": int64(3)}}
			})}, nil),
		upstreamWants: reprovisions(),
	}}
	for _, status := range []string{"CrashLoopBackOff", "ErrorUnschedulable", "DataVolumeError", "ErrorPvcNotFound", "ErrImagePull", "ImagePullBackOff"} {
		cases = append(cases, upstreamCase{
			name: "autohealing of a VM failing to start: " + status, upstream: `"should cleanup VMs when VM is in failing state for too long": ` + status, class: classDiffers,
			in: upCase(upPool(map[string]any{"replicas": int64(1), "autohealing": map[string]any{}}),
				[]map[string]any{upVM(0, failingFor(status, 6*time.Minute))}, nil),
			upstreamWants: reprovisions("my-pool-0"), defaultWants: reprovisions(),
		})
	}
	return cases
}

// forSemantics is c with the VMIs running the current template stamped as settings stamp them.
func (c poolCase) forSemantics(settings reference.PoolSettings) poolCase {
	out := c
	out.VMIs = nil
	for _, vmi := range c.VMIs {
		vmi = runtime.DeepCopyJSON(vmi)
		if annotations, _ := vmi["metadata"].(map[string]any)["annotations"].(map[string]any); annotations["pool.virt-rules.io/template-hash"] == upVMICurrent {
			annotations["pool.virt-rules.io/template-hash"] = reference.PoolVMIHash(upTemplate, settings)
		}
		out.VMIs = append(out.VMIs, vmi)
	}
	return out
}

func TestPoolAgainstUpstream(t *testing.T) {
	ctx := context.Background()
	counts := map[string]int{}
	cases := upstreamCases()
	for _, semantics := range []string{"default", "kubevirt"} {
		eng, settings := poolEngine(t, semantics)
		for _, c := range cases {
			t.Run(semantics+"/"+c.name, func(t *testing.T) {
				c.in = c.in.forSemantics(settings)
				got, err := eng.PoolPlan(ctx, c.in.input())
				if err != nil {
					t.Fatal(err)
				}
				ref := reference.PlanPool(c.in.Pool, c.in.VMs, c.in.VMIs, c.in.Volumes, c.in.Now, c.in.Burst, settings)
				if g, w := normalized(fromEngine(got)), normalized(fromReference(ref)); !reflect.DeepEqual(g, w) {
					t.Fatalf("engine and reference disagree:\nengine    %+v\nreference %+v", g, w)
				}
				want, what := c.upstreamWants, "upstream's answer"
				if semantics == "default" && c.class == classDiffers {
					if c.upstreamWants(ref) {
						t.Fatalf("labelled %q but the design's semantics give upstream's answer: %+v", c.class, ref)
					}
					want, what = c.defaultWants, "the design's answer"
				}
				if !want(ref) {
					t.Fatalf("(%s, upstream test %s) want %s, got %+v", c.class, c.upstream, what, ref)
				}
			})
		}
	}
	for _, c := range cases {
		counts[c.class]++
	}
	t.Logf("%d cases, each in both semantics: %v", len(cases), counts)
}
