package engine

import (
	"context"
	"testing"
)

// BenchmarkBudgetWatch is what the budget adds to every evaluation, alone: a watch started
// and finished (with a context to watch, as run does), against no budget at all.
func BenchmarkBudgetWatch(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name   string
		policy *budgetPolicy
	}{{"default", &budgetPolicy{Budget: DefaultDecisionBudget}}, {"none", &budgetPolicy{}}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := tc.policy.watch(nil)
				stop := context.AfterFunc(ctx, w.Cancel)
				stop()
				if w.finish("bench") != nil {
					b.Fatal("stopped")
				}
			}
		})
	}
}
