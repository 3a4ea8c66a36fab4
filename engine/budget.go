package engine

import (
	"context"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Budgets.
//
// Every evaluation runs under a budget: a time budget and a memory budget. OPA offers
// cancellation (topdown.Cancel, checked between evaluation steps and inside builtins that
// build large values, such as numbers.range) but nothing that bounds memory, so the engine
// watches the evaluation:
//
//   - time: the evaluation is cancelled once it has run for Budget.Timeout; one that
//     finishes past it before the timer fires is over budget all the same, so whether an
//     evaluation breaks its time budget depends on how long it ran, not on the scheduler;
//   - memory: from heapWatchDelay into the evaluation, the process heap (live objects and
//     those not yet collected, runtime/metrics /memory/classes/heap/objects:bytes) is sampled
//     every heapWatchInterval. When it exceeds the sample taken at that start by more than
//     Budget.Memory, a garbage collection is forced (at most one every forcedGCInterval,
//     whoever asks) and the heap measured again; if it still exceeds it, the evaluation is
//     cancelled. What garbage was on the heap when the watch started does not count against
//     the evaluation, so the bound is Budget.Memory plus that garbage, plus what is allocated
//     between two samples and in the first heapWatchDelay, plus what one builtin call
//     allocates at once (OPA checks cancellation between steps).
//
// The heap is the process's: evaluations running side by side share one heap, and an
// evaluation that holds a lot can make another that started before its growth go over budget
// too. The forced collection keeps garbage made elsewhere from counting.
//
// A stopped evaluation returns a *BudgetError (ErrBudgetExceeded). Before activation, a
// bundle decides representative inputs under the trial budget (trial.go); live, a bundle
// whose decisions break their budget too often is refused and the previous one restored
// (WithBundleRevert).

// Budget bounds one evaluation. A zero field is no bound.
type Budget struct {
	// Timeout is how long one evaluation may run.
	Timeout time.Duration
	// Memory is how many bytes the heap may grow by while one evaluation runs.
	Memory int64
}

// Default budgets: a live decision's (WithDecisionBudget) and one trial decision's
// (WithTrialBudget). The shipped bundle's largest evaluation at scale, the partial evaluation
// of 10,000 MigrationPolicies of random selectors, takes about 9 s on 2 shared cores and
// grows the heap by less than 48 MiB once collected; the trial's inputs are small, and each
// decides in milliseconds.
var (
	DefaultDecisionBudget = Budget{Timeout: 30 * time.Second, Memory: 128 << 20}
	DefaultTrialBudget    = Budget{Timeout: 2 * time.Second, Memory: 64 << 20}
)

// Default policy of WithBundleRevert.
const (
	DefaultRevertErrors = 3
	DefaultRevertWindow = time.Minute
)

// WithDecisionBudget bounds every evaluation of a live decision (see Budget). An evaluation
// that breaks it returns a *BudgetError.
func WithDecisionBudget(b Budget) Option { return func(o *options) { o.decisionBudget = b } }

// WithTrialBudget bounds every evaluation of a bundle's trial, before its activation: a
// bundle that breaks it on a representative input is refused (ReasonBudget).
func WithTrialBudget(b Budget) Option { return func(o *options) { o.trialBudget = b } }

// WithBundleRevert refuses the serving bundle once its live decisions have broken their
// budget n times within window, and restores the bundle that served before it (with a remote
// bundle, also as the persisted last good one). With nothing to restore the bundle keeps
// serving and every broken budget is still reported. n = 0 never refuses.
func WithBundleRevert(n int, window time.Duration) Option {
	return func(o *options) { o.revertErrors, o.revertWindow = n, window }
}

// WithBudgetEvents calls f for every live evaluation stopped for breaking its budget (not for
// the trial's, which refuse the bundle and are bundle events), in the deciding goroutine.
func WithBudgetEvents(f func(context.Context, *BudgetError)) Option {
	return func(o *options) { o.budgetEvents = f }
}

const (
	heapWatchDelay    = 5 * time.Millisecond
	heapWatchInterval = 5 * time.Millisecond
	forcedGCInterval  = 50 * time.Millisecond
)

// budgetPolicy is the budget a generation's evaluations run under, and who hears of one
// stopped for breaking it (nil: nobody, as in the trial).
type budgetPolicy struct {
	Budget
	exceeded func(context.Context, *generation, *BudgetError)
}

// report tells whoever listens of an evaluation stopped for breaking the budget.
func (p *budgetPolicy) report(ctx context.Context, g *generation, berr *BudgetError) {
	if p != nil && p.exceeded != nil {
		p.exceeded(ctx, g, berr)
	}
}

// Why an evaluation was stopped.
const (
	running int32 = iota
	stoppedByCaller
	stoppedByTime
	stoppedByMemory
)

// watch is one evaluation under a budget. It is the topdown.Cancel of the evaluation; done
// (a context's cancel function, or nil) is called when it is stopped.
type watch struct {
	budget  Budget
	start   time.Time
	done    func()
	why     atomic.Int32
	over    atomic.Bool // the evaluation has returned
	grew    atomic.Int64
	mu      sync.Mutex // orders the timer's creation before its callbacks
	timer   *time.Timer
	base    uint64 // the first heap sample, taken by the timer's callback
	sampled bool
}

// watch starts watching one evaluation; finish ends it. A nil policy is no budget.
func (p *budgetPolicy) watch(done func()) *watch {
	w := &watch{start: time.Now(), done: done}
	if p == nil {
		return w
	}
	w.budget = p.Budget
	first := heapWatchDelay
	switch {
	case w.budget.Memory <= 0 && w.budget.Timeout <= 0:
		return w
	case w.budget.Memory <= 0:
		first = w.budget.Timeout
	case w.budget.Timeout > 0:
		first = min(first, w.budget.Timeout)
	}
	w.mu.Lock()
	w.timer = time.AfterFunc(first, w.check)
	w.mu.Unlock()
	return w
}

// Cancel stops the evaluation for its caller (its context ended).
func (w *watch) Cancel() { w.stop(stoppedByCaller) }

// Cancelled tells the evaluator to stop.
func (w *watch) Cancelled() bool { return w.why.Load() != running }

func (w *watch) stop(why int32) {
	if w.why.CompareAndSwap(running, why) && w.done != nil {
		w.done()
	}
}

// check runs on the watch's timer: it stops the evaluation over budget, or looks again later.
func (w *watch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.over.Load() || w.why.Load() != running {
		return
	}
	elapsed := time.Since(w.start)
	if w.budget.Timeout > 0 && elapsed >= w.budget.Timeout {
		w.stop(stoppedByTime)
		return
	}
	next := heapWatchInterval
	if w.budget.Memory > 0 {
		heap := heapBytes()
		switch {
		case !w.sampled:
			w.base, w.sampled = heap, true
		case heap > w.base && int64(heap-w.base) > w.budget.Memory:
			if grew, ok := confirmHeapGrowth(w.base, w.budget.Memory); ok {
				w.grew.Store(grew)
				w.stop(stoppedByMemory)
				return
			}
		}
	} else {
		next = w.budget.Timeout - elapsed
	}
	if w.budget.Timeout > 0 {
		next = min(next, w.budget.Timeout-time.Since(w.start))
	}
	w.timer.Reset(max(next, time.Millisecond))
}

// finish ends the watch of the evaluation of decision. It returns why the evaluation was
// stopped when a budget stopped it, or when it ran past its time budget and finished before
// the timer could stop it; nil otherwise.
func (w *watch) finish(decision string) *BudgetError {
	w.over.Store(true)
	if w.timer != nil {
		w.timer.Stop()
	}
	elapsed := time.Since(w.start)
	why := w.why.Load()
	if why == running && w.budget.Timeout > 0 && elapsed >= w.budget.Timeout {
		// Finished before the timer's callback ran (it runs on another goroutine): the
		// evaluation still ran past its budget, and says so whatever the scheduling.
		why = stoppedByTime
	}
	var budget string
	switch why {
	case stoppedByTime:
		budget = BudgetTime
	case stoppedByMemory:
		budget = BudgetMemory
	default:
		return nil
	}
	return &BudgetError{Decision: decision, Budget: budget, Limit: w.budget, Elapsed: elapsed, Grew: w.grew.Load()}
}

// run runs f, which honours its context, under p: a budget that stops it cancels the
// context, and the error is then a *BudgetError for decision.
func (p *budgetPolicy) run(ctx context.Context, decision string, f func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := p.watch(cancel)
	err := f(ctx)
	if berr := w.finish(decision); berr != nil {
		return berr
	}
	return err
}

// heapBytes is the heap's objects, live and not yet collected.
func heapBytes() uint64 {
	s := [1]metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s[:])
	return s[0].Value.Uint64()
}

// forcedGC orders and spaces the collections watches force.
var forcedGC struct {
	sync.Mutex
	last time.Time
}

// confirmHeapGrowth collects garbage and tells whether the heap still holds more than limit
// bytes over base, and by how much it does. It collects at most once every forcedGCInterval
// (false in between: the watch looks again at its next sample).
func confirmHeapGrowth(base uint64, limit int64) (int64, bool) {
	forcedGC.Lock()
	defer forcedGC.Unlock()
	if time.Since(forcedGC.last) < forcedGCInterval {
		return 0, false
	}
	runtime.GC()
	forcedGC.last = time.Now()
	heap := heapBytes()
	if heap <= base {
		return 0, false
	}
	grew := int64(heap - base)
	return grew, grew > limit
}
