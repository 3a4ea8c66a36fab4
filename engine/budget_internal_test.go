package engine

import (
	"context"
	"testing"
	"time"
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

// An evaluation that finishes past its time budget before the timer's callback has run is
// over budget all the same; one within it, or stopped by its caller, is not.
func TestFinishPastTheTimeBudget(t *testing.T) {
	p := &budgetPolicy{Budget: Budget{Timeout: time.Hour}}
	for _, tc := range []struct {
		name    string
		ran     time.Duration
		cancel  bool
		wantErr bool
	}{
		{name: "within", ran: time.Minute},
		{name: "past, the timer not yet run", ran: 2 * time.Hour, wantErr: true},
		{name: "past, stopped by its caller first", ran: 2 * time.Hour, cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := p.watch(nil)
			w.start = w.start.Add(-tc.ran)
			if tc.cancel {
				w.Cancel()
			}
			berr := w.finish("test")
			if (berr != nil) != tc.wantErr {
				t.Fatalf("finish after %v: %v, want an error %v", tc.ran, berr, tc.wantErr)
			}
			if berr != nil && (berr.Budget != BudgetTime || berr.Elapsed < tc.ran) {
				t.Errorf("finish after %v: budget %q, elapsed %v", tc.ran, berr.Budget, berr.Elapsed)
			}
		})
	}
}
