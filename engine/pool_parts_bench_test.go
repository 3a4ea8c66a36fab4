package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/virt-rules/virt-rules/internal/reference"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// BenchmarkPoolPlanParts splits the engine's side of BenchmarkPoolPlan (the same pools: a
// 1,000-VM pool scaling out from 750 VMs, at rest, and during a proactive update of every VM)
// into its three parts: the input's conversion into AST values, the evaluation, and the
// decoding of the plan.
func BenchmarkPoolPlanParts(b *testing.B) {
	ctx := context.Background()
	e, err := New(ctx)
	if err != nil {
		b.Fatal(err)
	}
	g := e.active.Load()
	for _, bc := range []struct {
		name string
		in   PoolInput
	}{
		{"scale-out-750-to-1000", partsPool(750, 1000, false)},
		{"steady-1000", partsPool(1000, 1000, false)},
		{"update-1000", partsPool(1000, 1000, true)},
	} {
		input, err := poolInput(bc.in, DefaultPoolBurstLimit)
		if err != nil {
			b.Fatal(err)
		}
		t, err := g.eval(ctx, entryPoolPlan, input)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name+"/input", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := poolInput(bc.in, DefaultPoolBurstLimit); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/eval", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := g.eval(ctx, entryPoolPlan, input); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodePoolPlan(t); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// partsPool is BenchmarkPoolPlan's pool (engine_test's benchPool), built here because this
// benchmark reaches the engine's unexported parts.
func partsPool(vms, replicas int, outdated bool) PoolInput {
	template := map[string]any{"spec": map[string]any{
		"running":             true,
		"dataVolumeTemplates": []any{map[string]any{"metadata": map[string]any{"name": "root"}}},
		"template": map[string]any{"spec": map[string]any{"volumes": []any{
			map[string]any{"name": "root", "dataVolume": map[string]any{"name": "root"}},
		}}},
	}}
	hash := reference.TemplateHash(template)
	if outdated {
		hash = "old"
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	in := PoolInput{Now: now, BurstLimit: DefaultPoolBurstLimit, Pool: &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "big", "namespace": "ns", "uid": "big-uid"},
		"spec":     map[string]any{"replicas": int64(replicas), "maxUnavailable": "10%", "template": template},
	}}}
	owner := []any{map[string]any{"kind": "VirtualMachinePool", "name": "big", "uid": "big-uid", "controller": true}}
	for n := 1; n <= vms; n++ {
		name := fmt.Sprintf("big-%d", n)
		in.VMs = append(in.VMs, &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{
				"name": name, "ownerReferences": owner,
				"creationTimestamp": now.Add(time.Duration(n) * time.Second).Format(time.RFC3339),
				"annotations":       map[string]any{"pool.virt-rules.io/template-hash": hash},
			},
			"spec":   map[string]any{"running": true, "dataVolumeTemplates": []any{map[string]any{"metadata": map[string]any{"name": fmt.Sprintf("root-%d", n)}}}},
			"status": map[string]any{"ready": true},
		}})
		in.VMIs = append(in.VMIs, &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": name, "annotations": map[string]any{"pool.virt-rules.io/template-hash": hash}},
			"status":   map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": "True"}}},
		}})
	}
	return in
}
