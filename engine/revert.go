package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
// server (and, through the persisted ETag, a restarted engine) for a new ETag. With nothing to restore (the first bundle, or after a revert) the
// bundle keeps serving and each broken budget is still reported.

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
	err := refused(bad.source, ReasonBudget, "serve", fmt.Errorf("%w; revision %s restored", cause, prev.revision))
	e.log.ErrorContext(ctx, "bundle refused", "source", bad.source, "reason", ReasonBudget, "revision", bad.revision,
		"restoredRevision", prev.revision, "error", err)
	now := time.Now()
	if e.events != nil {
		e.events(ctx, BundleEvent{Time: now, Source: bad.source, PreviousRevision: bad.revision, RefusedRevision: bad.revision, Err: err, Reason: ReasonBudget})
		e.events(ctx, BundleEvent{Time: now, Source: prev.source, Revision: prev.revision, PreviousRevision: bad.revision, Restored: true})
	}
	if e.remote != nil && e.remote.cfg.CacheDir != "" {
		if err := e.persistRestored(prev); err != nil {
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
func (e *Engine) persistRestored(g *generation) error {
	if g.raw != nil {
		return e.persist(bytes.NewReader(g.raw), e.remote.currentETag())
	}
	var errs []error
	for _, name := range []string{CachedBundleFile, cachedETagFile} {
		if err := os.Remove(filepath.Join(e.remote.cfg.CacheDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
