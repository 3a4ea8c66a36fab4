package engine_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/virt-rules/virt-rules/engine"
)

// BenchmarkCPUBaseline asks the CPU baseline of 5,000 nodes of five CPU generations (those of
// the migratability benchmarks, half the nodes lacking a feature of their generation) from a
// fresh view (rego: NewNodes, Upsert each, CPUBaseline), against the host-model migratability
// levels of the same nodes from a fresh view in the same run (floor: NewNodes, Upsert each,
// Migratability), the node decision an admin already runs on every node change.
func BenchmarkCPUBaseline(b *testing.B) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		b.Fatal(err)
	}
	nodes := benchNodes(rand.New(rand.NewPCG(5_000, 3)), "node", 5_000)
	got, err := freshView(b, eng, nodes).CPUBaseline(ctx, "")
	if err != nil {
		b.Fatal(err)
	}
	if len(got.Groups) != 1 || got.Groups[0].Model == nil || len(got.Groups[0].Tradeoffs) == 0 {
		b.Fatalf("baseline of 5,000 nodes: %+v, want one group with a model and tradeoffs", got.Groups)
	}
	b.Run("nodes=5000", func(b *testing.B) {
		b.Run("rego", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := freshView(b, eng, nodes).CPUBaseline(ctx, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("floor", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := freshView(b, eng, nodes).Migratability(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
