package engine_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/virt-rules/virt-rules/engine"
)

// BenchmarkDecisionBudget measures what the budget costs a decision: the same decisions on
// two engines serving the embedded bundle, one with the default budget, one with none
// (engine.Budget{}: no watch at all). They alternate in blocks of 64, each first every other
// block, so that the machine's load weighs on both alike; budgeted/unbudgeted is the ratio of
// their times.
func BenchmarkDecisionBudget(b *testing.B) {
	ctx := context.Background()
	budgeted, err := engine.New(ctx)
	if err != nil {
		b.Fatal(err)
	}
	unbudgeted, err := engine.New(ctx, engine.WithDecisionBudget(engine.Budget{}))
	if err != nil {
		b.Fatal(err)
	}
	policies, subjects := sparsePolicies(rand.New(rand.NewPCG(100, 1)), 100)
	sets := [2]*engine.MigrationPolicies{}
	for i, e := range []*engine.Engine{budgeted, unbudgeted} {
		if sets[i], err = e.MigrationPolicies(policies, benchKubeVirt()); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("migration.policy/100", func(b *testing.B) {
		var took [2]time.Duration
		i := 0
		for b.Loop() {
			for k := range 2 {
				// Each side goes first every other block.
				side := (k + i/64) % 2
				set := sets[side]
				start := time.Now()
				for k := range 64 {
					if _, err := set.Decide(ctx, subjects[(i+k)%len(subjects)]); err != nil {
						b.Fatal(err)
					}
				}
				took[side] += time.Since(start)
			}
			i += 64
		}
		n := float64(b.N * 64)
		b.ReportMetric(float64(took[0])/n, "ns/budgeted")
		b.ReportMetric(float64(took[1])/n, "ns/unbudgeted")
		b.ReportMetric(float64(took[0])/float64(took[1]), "budgeted/unbudgeted")
	})
}
