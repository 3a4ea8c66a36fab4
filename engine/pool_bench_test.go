package engine_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The pool benchmarks plan one large pool with the engine (`rego`) and with the Go reference
// (`go`), so `make bench` prints their ratio: a 1,000-VM pool scaling out from 750 VMs (one
// 250-VM pass), the same pool at rest, and during a proactive update of every VM. The engine
// keeps converted objects (WithObjectCache) as the controller's does, and the objects carry
// a UID and a resourceVersion as stored ones do: planning a pool again converts only what
// changed. BenchmarkPoolPlanParts times the conversion of every object too.

func benchPool(vms int, replicas int, outdated bool) poolCase {
	template := map[string]any{"spec": map[string]any{
		"running":             true,
		"dataVolumeTemplates": []any{map[string]any{"metadata": map[string]any{"name": "root"}}},
		"template": map[string]any{"spec": map[string]any{"volumes": []any{
			map[string]any{"name": "root", "dataVolume": map[string]any{"name": "root"}},
		}}},
	}}
	hash := reference.TemplateHash(template)
	vmHash := hash
	if outdated {
		vmHash = "old"
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := poolCase{Now: now, Burst: engine.DefaultPoolBurstLimit, Pool: map[string]any{
		"metadata": map[string]any{"name": "big", "namespace": "ns", "uid": "big-uid"},
		"spec":     map[string]any{"replicas": int64(replicas), "maxUnavailable": "10%", "template": template},
	}}
	owner := []any{map[string]any{"kind": "VirtualMachinePool", "name": "big", "uid": "big-uid", "controller": true}}
	for n := 1; n <= vms; n++ {
		name := fmt.Sprintf("big-%d", n)
		// Each pool's objects are its own: the engine keeps them by UID and resourceVersion.
		uid := fmt.Sprintf("%d-%d-%s-%d", vms, replicas, vmHash, n)
		c.VMs = append(c.VMs, map[string]any{
			"metadata": map[string]any{"name": name, "uid": "vm-" + uid, "resourceVersion": fmt.Sprint(2 * n), "ownerReferences": owner,
				"creationTimestamp": now.Add(time.Duration(n) * time.Second).Format(time.RFC3339),
				"annotations":       map[string]any{"pool.virt-rules.io/template-hash": vmHash}},
			"spec":   map[string]any{"running": true, "dataVolumeTemplates": []any{map[string]any{"metadata": map[string]any{"name": fmt.Sprintf("root-%d", n)}}}},
			"status": map[string]any{"ready": true},
		})
		c.VMIs = append(c.VMIs, map[string]any{"metadata": map[string]any{"name": name, "uid": "vmi-" + uid, "resourceVersion": fmt.Sprint(2*n + 1),
			"annotations": map[string]any{"pool.virt-rules.io/template-hash": vmHash}},
			"status": map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}})
	}
	return c
}

// poolBenchCases are the pools of the pool plan benchmarks.
func poolBenchCases() []struct {
	name string
	c    poolCase
} {
	return []struct {
		name string
		c    poolCase
	}{
		{"scale-out-750-to-1000", benchPool(750, 1000, false)},
		{"steady-1000", benchPool(1000, 1000, false)},
		{"update-1000", benchPool(1000, 1000, true)},
	}
}

// poolBenchObjects is the engine's object cache in the pool benchmarks: the controller's
// default (cmd/virt-rules controller --object-cache).
const poolBenchObjects = 20000

func BenchmarkPoolPlan(b *testing.B) {
	ctx := context.Background()
	eng, err := engine.New(ctx, engine.WithObjectCache(poolBenchObjects))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range poolBenchCases() {
		b.Run(bc.name, func(b *testing.B) {
			in := bc.c.input()
			got, err := eng.PoolPlan(ctx, in)
			if err != nil {
				b.Fatal(err)
			}
			want := reference.PlanPool(bc.c.Pool, bc.c.VMs, bc.c.VMIs, bc.c.Volumes, bc.c.Now, bc.c.Burst, reference.DefaultPoolSettings)
			if g, w := normalized(fromEngine(got)), normalized(fromReference(want)); !reflect.DeepEqual(g, w) {
				b.Fatalf("engine and reference disagree on %s", bc.name)
			}
			b.Run("rego", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := eng.PoolPlan(ctx, in); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("go", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					reference.PlanPool(bc.c.Pool, bc.c.VMs, bc.c.VMIs, bc.c.Volumes, bc.c.Now, bc.c.Burst, reference.DefaultPoolSettings)
				}
			})
		})
	}
}

// BenchmarkPoolPlanParts splits the engine's side of BenchmarkPoolPlan (the same pools) into
// its parts: the input's conversion into AST values (input: every object; input-cached: what
// a plan of an unchanged pool converts), the evaluation, and the decoding of the plan.
func BenchmarkPoolPlanParts(b *testing.B) {
	ctx := context.Background()
	eng, err := engine.New(ctx, engine.WithObjectCache(poolBenchObjects))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range poolBenchCases() {
		convert, convertCached, eval, decode, err := eng.PoolPlanParts(ctx, bc.c.input())
		if err != nil {
			b.Fatal(err)
		}
		for _, part := range []struct {
			name string
			run  func() error
		}{{"input", convert}, {"input-cached", convertCached}, {"eval", eval}, {"decode", decode}} {
			b.Run(bc.name+"/"+part.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := part.run(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
