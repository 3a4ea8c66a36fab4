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
// each of the 110 VMIs once, one by one, as `eval --candidates` does (floor). The preview asks
// the same decision once per VMI (and orders them once), so it costs about as much.
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
	var vmis []*unstructured.Unstructured
	for i := range 110 {
		vmis = append(vmis, drainVMI(fmt.Sprintf("vm-%03d", i), "node-0000", "LiveMigrate"))
	}
	in := engine.DrainInput{Drain: []string{"node-0000"}, VMIs: vmis, Nodes: nodes}
	p, err := eng.Drain(ctx, in)
	if err != nil {
		b.Fatal(err)
	}
	if len(p.VMIs) != 110 || p.Stuck() != 0 {
		b.Fatalf("preview of %d VMIs, %d stuck: want 110 migrating", len(p.VMIs), p.Stuck())
	}
	b.Run("drain-110-of-1000-nodes", func(b *testing.B) {
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
					if _, err := eng.MigrationCandidates(ctx, engine.MigrationCandidatesInput{VMI: vmi, Nodes: nodes}); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	})
}
