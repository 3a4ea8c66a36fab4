package engine

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Reverting a bundle that breaks its budget live.
//
// The trial shows a bundle decides representative inputs within budget; a cluster's inputs
// may be larger. Each live evaluation stopped for its budget counts against the generation
// that served it. Once one generation has broken its budget revertPolicy.errors times within
// revertPolicy.window, it is refused (ReasonBudget) and the generation that served before it
// is restored: its own, as it was, with no new trial. A restored bundle from a server is
// persisted again as the last good one, over the refused one. The refused bundle is not
// loaded again: the watcher of a path waits for its content to change, the poller of a
// server (and, through the persisted ETag, a restarted engine) for a new ETag. With nothing to
// restore (the first bundle, or after a revert) the bundle keeps serving and each broken
// budget is still reported.
//
// Probation: a bundle from a server that replaced another is not persisted as the last good
// one when it is activated, but once it has served a whole revert window without breaking
// its budget (checked at each poll, so at the first poll after the window). Until then the
// persisted bundle stays the one before it: a restart, even one caused by the new bundle,
// starts from the bundle that was proven live, and the server's new bundle is downloaded and
// tried again. A bundle that breaks its budget during its probation is never persisted. With
// nothing to restore, or reverts off (WithBundleRevert(0, 0)), a bundle is persisted when it
// is activated.

type revertPolicy struct {
	errors int
	window time.Duration

	mu      sync.Mutex
	gen     uint64      // the generation the strikes are against
	strikes []time.Time // when its evaluations broke their budget, within the window
}

// strike counts a broken budget against g and tells whether g is now to be refused.
func (p *revertPolicy) strike(g *generation, now time.Time) bool {
	if p.errors <= 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen != g.id {
		p.gen, p.strikes = g.id, p.strikes[:0]
	}
	kept := p.strikes[:0]
	for _, t := range p.strikes {
		if now.Sub(t) < p.window {
			kept = append(kept, t)
		}
	}
	p.strikes = append(kept, now)
	if len(p.strikes) < p.errors {
		return false
	}
	p.strikes = p.strikes[:0]
	return true
}

// clean tells whether no evaluation of g broke its budget within the window before now.
func (p *revertPolicy) clean(g *generation, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen != g.id {
		return true
	}
	for _, t := range p.strikes {
		if now.Sub(t) < p.window {
			return false
		}
	}
	return true
}

// startProbation persists g, a bundle from a server just activated, at once if nothing could
// be restored instead of it; otherwise it is on probation until endProbation persists it.
func (e *Engine) startProbation(ctx context.Context, g *generation) {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	if e.active.Load() != g {
		return // refused or replaced meanwhile
	}
	if e.revert.errors <= 0 || e.previous == nil {
		e.persistLocked(ctx, g)
		return
	}
	e.probation, e.probationSince = g, time.Now()
	e.log.InfoContext(ctx, "bundle on probation: persisted as the last good one once it serves a revert window within budget",
		"revision", g.revision, "source", g.source, "window", e.revert.window, "persistedRevision", e.previous.revision)
}

// endProbation persists the bundle on probation once it has served a revert window, as of
// now, without breaking its budget; a broken budget within the window starts it again.
func (e *Engine) endProbation(ctx context.Context, now time.Time) {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	g := e.probation
	switch {
	case g == nil:
		return
	case e.active.Load() != g:
		e.probation = nil // reverted or replaced: never persisted
		return
	case now.Sub(e.probationSince) < e.revert.window:
		return
	case !e.revert.clean(g, now):
		e.probationSince = now
		return
	}
	e.probation = nil
	e.persistLocked(ctx, g)
}

// persistLocked persists g, which serves, as the last good bundle; loadMu is held.
func (e *Engine) persistLocked(ctx context.Context, g *generation) {
	if err := e.persist(ctx, g.raw, g.etag); err != nil {
		err = refused(g.source, ReasonPersist, "persist", err)
		e.log.ErrorContext(ctx, "bundle activated but not persisted", "revision", g.revision, "error", err)
		if e.events != nil {
			e.events(ctx, BundleEvent{Time: time.Now(), Source: g.source, PreviousRevision: g.revision, Err: err, Reason: ReasonPersist})
		}
		return
	}
	e.log.InfoContext(ctx, "bundle persisted as the last good one", "revision", g.revision, "source", g.source)
}

// budgetExceeded hears of every live evaluation stopped for its budget.
func (e *Engine) budgetExceeded(ctx context.Context, g *generation, berr *BudgetError) {
	e.log.WarnContext(ctx, "decision over budget", "decision", berr.Decision, "budget", berr.Budget,
		"revision", g.revision, "source", g.source, "error", berr)
	if e.onBudget != nil {
		e.onBudget(ctx, berr)
	}
	if e.revert.strike(g, time.Now()) {
		// Not in the deciding goroutine: a load may hold loadMu for a while.
		go e.revertFrom(context.WithoutCancel(ctx), g, berr)
	}
}

// revertFrom refuses bad, if it still serves, and restores the generation before it.
func (e *Engine) revertFrom(ctx context.Context, bad *generation, last *BudgetError) {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	if e.active.Load() != bad {
		return // replaced meanwhile
	}
	cause := fmt.Errorf("%d decisions broke their budget within %v, the last: %w", e.revert.errors, e.revert.window, last)
	prev := e.previous
	if prev == nil {
		err := refused(bad.source, ReasonBudget, "serve", fmt.Errorf("%w; no earlier bundle to restore, it keeps serving", cause))
		e.refuse(ctx, bad.source, err)
		return
	}
	e.active.Store(prev)
	e.previous = nil
	if e.probation == bad {
		e.probation = nil
	}
	err := refused(bad.source, ReasonBudget, "serve", fmt.Errorf("%w; revision %s restored", cause, prev.revision))
	e.log.ErrorContext(ctx, "bundle refused", "source", bad.source, "reason", ReasonBudget, "revision", bad.revision,
		"restoredRevision", prev.revision, "error", err)
	now := time.Now()
	if e.events != nil {
		e.events(ctx, BundleEvent{Time: now, Source: bad.source, PreviousRevision: bad.revision, RefusedRevision: bad.revision, Err: err, Reason: ReasonBudget})
		e.events(ctx, BundleEvent{Time: now, Source: prev.source, Revision: prev.revision, PreviousRevision: bad.revision, Restored: true})
	}
	if e.remote != nil && e.remote.store != nil {
		if err := e.persistRestored(ctx, prev); err != nil {
			err = refused(prev.source, ReasonPersist, "persist", err)
			e.log.ErrorContext(ctx, "bundle restored but not persisted", "error", err)
			if e.events != nil {
				e.events(ctx, BundleEvent{Time: time.Now(), Source: prev.source, PreviousRevision: prev.revision, Err: err, Reason: ReasonPersist})
			}
		}
	}
}

// persistRestored makes g the persisted last good bundle again, with the ETag of the refused
// one (the server's latest, which the engine holds as its own): a restarted engine starts
// from g and asks the server for anything but the refused bundle. Without g's bytes, no
// bundle stays persisted rather than the refused one.
func (e *Engine) persistRestored(ctx context.Context, g *generation) error {
	if g.raw != nil {
		return e.persist(ctx, g.raw, e.remote.currentETag())
	}
	if err := e.remote.store.Clear(ctx); err != nil {
		return fmt.Errorf("clear %s: %w", e.remote.store, err)
	}
	return nil
}
