package engine_test

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
)

// BenchmarkDrain previews draining one node of 110 VMIs (kubelet's default pod limit) in a
// cluster of 1,000 nodes (rego), against its floor: asking the migration target decision for
// each of the 110 VMIs once, one by one, as `eval --candidates` does (floor). Both are given
// what a cluster holds: the VMIs' virt-launcher pods. The preview must cost no more. Two
// clusters: VMIs of one shape, as a pool's or an instancetype's are, which the preview places
// together (one ask about every node, then asks about the nodes that took a VMI); and VMIs each
// of its own shape (each requests its own memory), where it asks about every node for each VMI
// as the floor does, and adds each placed VMI's target pod for the next.
func BenchmarkDrain(b *testing.B) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		b.Fatal(err)
	}
	nodes := eng.NewNodes()
	for i := range 1000 {
		if err := nodes.Upsert(drainNode(fmt.Sprintf("node-%04d", i), "64", "256Gi")); err != nil {
			b.Fatal(err)
		}
	}
	for _, shapes := range []string{"one-shape", "each-its-own-shape"} {
		var vmis, pods []*unstructured.Unstructured
		for i := range 110 {
			vmi := drainVMI(fmt.Sprintf("vm-%03d", i), "node-0000", "LiveMigrate")
			pod := drainLauncherPod(vmi)
			if shapes == "each-its-own-shape" {
				memory := fmt.Sprintf("%dMi", 4096+i)
				vmi.Object["spec"].(map[string]any)["domain"].(map[string]any)["resources"] = map[string]any{"requests": map[string]any{"cpu": "2", "memory": memory}}
				compute := pod.Object["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
				compute["resources"] = map[string]any{"requests": map[string]any{"cpu": "2", "memory": memory}}
			}
			vmis = append(vmis, vmi)
			pods = append(pods, pod)
		}
		in := engine.DrainInput{Drain: []string{"node-0000"}, VMIs: vmis, Nodes: nodes, Pods: pods}
		p, err := eng.Drain(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		if len(p.VMIs) != 110 || p.Stuck() != 0 {
			b.Fatalf("preview of %d VMIs, %d stuck: want 110 migrating", len(p.VMIs), p.Stuck())
		}
		b.Run("drain-110-of-1000-nodes-"+shapes, func(b *testing.B) {
			b.Run("rego", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := eng.Drain(ctx, in); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("floor", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					for _, vmi := range vmis {
						ask := engine.MigrationCandidatesInput{VMI: vmi, SourcePod: engine.SourceLauncherPod(vmi, pods), Nodes: nodes, Pods: pods}
						if _, err := eng.MigrationCandidates(ctx, ask); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		})
	}
}

// drainLauncherPod is vmi's virt-launcher pod on its node, as KubeVirt renders one: the compute
// container with the VMI's requests and KubeVirt's memory overhead, and its init containers.
func drainLauncherPod(vmi *unstructured.Unstructured) *unstructured.Unstructured {
	node, _, _ := unstructured.NestedString(vmi.Object, "status", "nodeName")
	requests := func(cpu, memory string) map[string]any {
		return map[string]any{"requests": map[string]any{"cpu": cpu, "memory": memory}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{
			"namespace": vmi.GetNamespace(), "name": "virt-launcher-" + vmi.GetName() + "-abcde",
			"ownerReferences": []any{map[string]any{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
				"name": vmi.GetName(), "uid": "", "controller": true}},
		},
		"spec": map[string]any{
			"nodeName": node,
			"containers": []any{
				map[string]any{"name": "compute", "resources": requests("2", "4484Mi")},
				map[string]any{"name": "volumecontainerdisk", "resources": requests("10m", "40M")},
			},
			"initContainers": []any{
				map[string]any{"name": "container-disk-binary", "resources": requests("10m", "40M")},
				map[string]any{"name": "volumecontainerdisk-init", "resources": requests("10m", "40M")},
			},
		},
		"status": map[string]any{"phase": "Running"},
	}}
}
