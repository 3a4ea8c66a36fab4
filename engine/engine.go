// Package engine evaluates the virt-rules decisions with an embedded OPA.
//
// An Engine serves one bundle generation at a time: the bundle compiled into the binary by
// default, or one loaded from a directory or tarball. Loading compiles strictly, checks that
// every decision exists, runs the bundle's own tests, prepares one query per decision and
// tries every decision on representative inputs within a budget (trial.go); only then does
// the new generation replace the serving one, atomically. A bundle that fails any step is
// refused and the previous one keeps serving. Every evaluation runs under a time and memory
// budget (budget.go); a bundle whose live decisions break it too often is refused and the
// previous one restored (revert.go).
//
// The engine knows nothing of Kubernetes clients: callers gather objects, call a typed
// method per decision (MigrationPolicies, ...), and apply the answer.
package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"

	virtrego "github.com/virt-rules/virt-rules/rego"
)

// SourceEmbedded names the bundle compiled into the binary.
const SourceEmbedded = "embedded"

// Engine evaluates decisions against the active bundle. It is safe for concurrent use.
type Engine struct {
	active    atomic.Pointer[generation]
	loadMu    sync.Mutex // serialises loads so the last successful one wins
	log       *slog.Logger
	verify    *bundle.VerificationConfig
	events    func(context.Context, BundleEvent)
	decisions DecisionLogger
	remote    *remote
	fileLimit int64 // of any file of a bundle, decompressed
	sizeLimit int64 // of all files of a bundle together, decompressed
	keyMemo   selectorKeyMemo
	// policyMemo is the per-policy work of the MigrationPolicy set prepared last, which the
	// next set reuses (migrationpolicyreuse.go).
	policyMemo atomic.Pointer[policyMemo]
	// policyTerms are the policies of the MigrationPolicy set prepared last as converted, by
	// name, which the next set takes instead of converting them again (convertPolicies).
	policyTerms atomic.Pointer[map[string]convertedPolicy]

	// live is the budget of decisions on activated generations, trialBudget the trial's.
	live        *budgetPolicy
	trialBudget Budget
	// previous is the generation active before the serving one, restored when the serving
	// one breaks its budget too often (revert.go); guarded by loadMu.
	previous *generation
	revert   revertPolicy
	// probation is the bundle from a server that serves but is not yet persisted as the last
	// good one, since probationSince (revert.go); guarded by loadMu.
	probation      *generation
	probationSince time.Time
	onBudget       func(context.Context, *BudgetError)
	// objects are the converted objects WithObjectCache keeps; nil without it.
	objects *objectCache
}

type options struct {
	fileLimit       int64
	sizeLimit       int64
	bundlePath      string
	remote          *RemoteBundle
	verificationKey string
	log             *slog.Logger
	events          func(context.Context, BundleEvent)
	decisions       DecisionLogger
	decisionBudget  Budget
	trialBudget     Budget
	revertErrors    int
	revertWindow    time.Duration
	budgetEvents    func(context.Context, *BudgetError)
	objectCache     int
}

// Option configures New.
type Option func(*options)

// WithBundlePath serves the bundle at path (a directory or a .tar.gz built by `opa build`)
// instead of the embedded one.
func WithBundlePath(path string) Option { return func(o *options) { o.bundlePath = path } }

// WithRemoteBundle serves the bundle a server publishes (see RemoteBundle and PollBundle)
// instead of the embedded one. Until one is active (downloaded, or the last good one
// persisted in r.CacheDir), Revision is "" and decisions fail with ErrNoBundle.
func WithRemoteBundle(r RemoteBundle) Option { return func(o *options) { o.remote = &r } }

// WithVerificationKey requires every bundle loaded from a path or a server to be signed
// (`opa build --signing-key`) by the private key of the PEM public key in file: an unsigned
// or tampered bundle is refused. The embedded bundle is part of the binary and not verified.
func WithVerificationKey(file string) Option {
	return func(o *options) { o.verificationKey = file }
}

// DefaultBundleFileLimit is the most one file of a bundle (a data.json, a policy) may hold,
// decompressed, unless WithBundleFileLimit says otherwise.
const DefaultBundleFileLimit int64 = 64 << 20

// WithBundleFileLimit refuses a bundle (from a path or a server) with a file of more than n
// bytes, decompressed. The limit holds while reading: a small .tar.gz that unpacks to a huge
// file is refused without the file ever being in memory.
func WithBundleFileLimit(n int64) Option { return func(o *options) { o.fileLimit = n } }

// DefaultBundleSizeLimit is the most all files of a bundle may hold together, decompressed,
// unless WithBundleSizeLimit says otherwise.
const DefaultBundleSizeLimit int64 = 128 << 20

// WithBundleSizeLimit refuses a bundle (from a path or a server) whose files hold more than n
// bytes together, decompressed (ErrBundleTooLarge). The limit holds while reading, to within
// one file: many files each under the file limit are refused before they are all in memory.
func WithBundleSizeLimit(n int64) Option { return func(o *options) { o.sizeLimit = n } }

// WithLogger sets the structured logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithBundleEvents calls f after every bundle activation and every refusal (including a
// failed download), in the goroutine that loaded it.
func WithBundleEvents(f func(context.Context, BundleEvent)) Option {
	return func(o *options) { o.events = f }
}

// WithDecisionLogger hands every evaluated decision to l. Without it the evaluation path
// pays one nil check.
func WithDecisionLogger(l DecisionLogger) Option { return func(o *options) { o.decisions = l } }

// BundleEvent is one bundle activated or refused.
type BundleEvent struct {
	Time   time.Time
	Source string
	// Revision is the activated revision; "" when refused.
	Revision string
	// PreviousRevision is the revision that served before the event, and still serves after
	// a refusal; "" when none did.
	PreviousRevision string
	// Err is why the bundle was refused, nil when it was activated. A persist failure
	// (Reason ReasonPersist) comes after the bundle's activation.
	Err    error
	Reason string
	// RefusedRevision is the revision refused while it served, for breaking its decision
	// budget too often (Reason ReasonBudget, see WithBundleRevert); "" for a bundle refused
	// before its activation.
	RefusedRevision string
	// Restored tells an activation that restored the revision that served before
	// RefusedRevision; the refusal event comes just before it.
	Restored bool
}

// New builds an engine serving the configured bundle. It fails when that bundle is refused,
// except for a remote bundle, which may arrive later.
func New(ctx context.Context, opts ...Option) (*Engine, error) {
	o := options{log: slog.New(slog.DiscardHandler), fileLimit: DefaultBundleFileLimit, sizeLimit: DefaultBundleSizeLimit,
		decisionBudget: DefaultDecisionBudget, trialBudget: DefaultTrialBudget,
		revertErrors: DefaultRevertErrors, revertWindow: DefaultRevertWindow}
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	e := &Engine{log: o.log, events: o.events, decisions: o.decisions, fileLimit: o.fileLimit, sizeLimit: o.sizeLimit,
		trialBudget: o.trialBudget, revert: revertPolicy{errors: o.revertErrors, window: o.revertWindow}, onBudget: o.budgetEvents,
		objects: newObjectCache(o.objectCache)}
	e.live = &budgetPolicy{Budget: o.decisionBudget, exceeded: e.budgetExceeded}
	if o.verificationKey != "" {
		vc, err := verificationConfig(o.verificationKey)
		if err != nil {
			return nil, err
		}
		e.verify = vc
	}
	var err error
	switch {
	case o.remote != nil && o.bundlePath != "":
		return nil, errors.New("serve a bundle from a path or from a server, not both")
	case o.remote != nil:
		err = e.startRemote(ctx, *o.remote)
	case o.bundlePath != "":
		err = e.LoadPath(ctx, o.bundlePath)
	default:
		err = e.loadEmbedded(ctx)
	}
	if err != nil {
		return nil, err
	}
	return e, nil
}

// check refuses options that make no sense, naming them as the CLI's flags do.
func (o *options) check() error {
	var errs []error
	for _, l := range []struct {
		what string
		n    int64
	}{{"bundle file limit", o.fileLimit}, {"bundle size limit", o.sizeLimit}} {
		if l.n < 1 {
			errs = append(errs, fmt.Errorf("%s %d: want at least 1 byte", l.what, l.n))
		}
	}
	for _, b := range []struct {
		what string
		b    Budget
	}{{"decision", o.decisionBudget}, {"trial", o.trialBudget}} {
		if b.b.Timeout < 0 || b.b.Memory < 0 {
			errs = append(errs, fmt.Errorf("%s budget %v, %d bytes: want 0 (no bound) or more", b.what, b.b.Timeout, b.b.Memory))
		}
	}
	if o.revertErrors < 0 || (o.revertErrors > 0 && o.revertWindow <= 0) {
		errs = append(errs, fmt.Errorf("bundle revert after %d budget errors within %v: want 0 (never), or errors and a window above 0", o.revertErrors, o.revertWindow))
	}
	return errors.Join(errs...)
}

// Revision is the revision of the bundle being served, "" while none is (WithRemoteBundle
// before the first bundle).
func (e *Engine) Revision() string {
	if g := e.active.Load(); g != nil {
		return g.revision
	}
	return ""
}

// Source tells where the bundle being served came from: SourceEmbedded, its path or its URL.
func (e *Engine) Source() string {
	if g := e.active.Load(); g != nil {
		return g.source
	}
	return ""
}

// loadEmbedded activates the bundle compiled into the binary. Its tests ran when the binary
// was built (`make test`), so they are not run again on every start.
func (e *Engine) loadEmbedded(ctx context.Context) error {
	return e.loadFS(ctx, virtrego.Bundle(), SourceEmbedded, true)
}

func (e *Engine) loadFS(ctx context.Context, fsys fs.FS, source string, skipTests bool) error {
	b, err := loadFS(fsys, skipTests)
	if err != nil {
		return refused(source, ReasonRead, "load", err)
	}
	return e.activate(ctx, source, func() (*generation, error) { return e.build(ctx, b, source) })
}

// LoadPath loads, validates and activates the bundle at path (a directory or a .tar.gz). On
// any error the bundle being served stays active and the error says why the new one was
// refused, naming the file and line where known.
func (e *Engine) LoadPath(ctx context.Context, path string) error {
	// Digest before reading: if the path changes in between, the watcher sees a newer digest
	// and loads again.
	digest, _ := digestPath(path)
	b, err := loadPath(path, e.verify, e.fileLimit, e.sizeLimit)
	if err != nil {
		e.refuse(ctx, path, err)
		return err
	}
	return e.activate(ctx, path, func() (*generation, error) {
		g, err := e.build(ctx, b, path)
		if g != nil {
			g.digest = digest
		}
		return g, err
	})
}

// loadRaw loads, validates and activates raw, a tarball persisted from a server with its
// ETag, kept at source.
func (e *Engine) loadRaw(ctx context.Context, source string, raw []byte, etag string) error {
	b, err := loadRaw(source, raw, e.verify, e.fileLimit, e.sizeLimit)
	if err != nil {
		e.refuse(ctx, source, err)
		return err
	}
	return e.activate(ctx, source, func() (*generation, error) {
		g, err := e.build(ctx, b, source)
		if g != nil {
			g.raw, g.etag = raw, etag
		}
		return g, err
	})
}

// activate builds a generation, tries it on the trial's inputs and makes it the serving one.
func (e *Engine) activate(ctx context.Context, source string, build func() (*generation, error)) error {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	g, err := build()
	if err == nil {
		err = e.trial(ctx, g)
	}
	if err != nil {
		e.refuse(ctx, source, err)
		return err
	}
	g.decisions = e.decisions
	g.budget = e.live
	old := e.active.Swap(g)
	e.previous = nil
	if old != nil && old.revision != "" {
		e.previous = old
	}
	attrs := []any{"revision", g.revision, "source", g.source}
	ev := BundleEvent{Time: time.Now(), Source: g.source, Revision: g.revision}
	if old != nil && old.revision != "" {
		attrs = append(attrs, "previousRevision", old.revision)
		ev.PreviousRevision = old.revision
	}
	e.log.InfoContext(ctx, "bundle activated", attrs...)
	if e.events != nil {
		e.events(ctx, ev)
	}
	return nil
}

// refuse logs and reports a bundle that was not activated.
func (e *Engine) refuse(ctx context.Context, source string, err error) {
	reason := RefusalReason(err)
	e.log.ErrorContext(ctx, "bundle refused", "source", source, "reason", reason, "revision", e.Revision(), "error", err)
	if e.events != nil {
		e.events(ctx, BundleEvent{Time: time.Now(), Source: source, PreviousRevision: e.Revision(), Err: err, Reason: reason})
	}
}

// eval runs one entrypoint of generation g on input and returns its value.
func (g *generation) eval(ctx context.Context, entry string, input ast.Value) (*ast.Term, error) {
	return g.evalWith(ctx, entry, nil, input)
}

// evalWith runs entry with pq, a query prepared for it beside a partial evaluation (see
// partial.go), or with the generation's own query when pq is nil. Every decision goes through
// here, so this is where the decision log sees them all.
func (g *generation) evalWith(ctx context.Context, entry string, pq *rego.PreparedEvalQuery, input ast.Value) (*ast.Term, error) {
	if g.decisions != nil {
		return g.evalLogged(ctx, entry, pq, input)
	}
	return g.evalQuery(ctx, entry, pq, input)
}

// queryOf is the query of entry, required or optional.
func queryOf(entry string) string {
	if q, ok := entrypoints[entry]; ok {
		return q
	}
	return optionalEntrypoints[entry]
}

// noMetrics discards OPA's per-evaluation timers.
var noMetrics = metrics.NoOp()

func (g *generation) evalQuery(ctx context.Context, entry string, pq *rego.PreparedEvalQuery, input ast.Value) (*ast.Term, error) {
	if pq != nil {
		return g.run(ctx, entry, *pq, input)
	}
	own, ok := g.queries[entry]
	if !ok {
		if _, optional := optionalEntrypoints[entry]; optional && g.revision != "" {
			return nil, fmt.Errorf("evaluate %s (bundle %s): %w", entry, g.revision, ErrMissingDecision)
		}
		return nil, fmt.Errorf("evaluate %s: %w", entry, ErrNoBundle)
	}
	return g.run(ctx, entry, own, input)
}

// run evaluates pq, prepared for entry, on input, under the generation's budget.
func (g *generation) run(ctx context.Context, entry string, pq rego.PreparedEvalQuery, input ast.Value) (*ast.Term, error) {
	// The watch is the evaluation's cancellation: without an external one OPA starts a
	// goroutine per evaluation to watch ctx, and without the metrics option it collects
	// timers nobody reads; a decision costs tens of microseconds less without them.
	w := g.budget.watch(nil)
	stop := context.AfterFunc(ctx, w.Cancel)
	rs, err := pq.Eval(ctx, rego.EvalParsedInput(input), rego.EvalExternalCancel(w), rego.EvalMetrics(noMetrics))
	stop()
	if berr := w.finish(entry); berr != nil {
		g.budget.report(ctx, g, berr)
		return nil, fmt.Errorf("evaluate %s (bundle %s): %w", entry, g.revision, berr)
	}
	if err != nil {
		return nil, fmt.Errorf("evaluate %s (bundle %s): %w", entry, g.revision, err)
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return nil, fmt.Errorf("evaluate %s (bundle %s): %w", entry, g.revision, ErrUndefined)
	}
	return rs[0].Expressions[0].Value.(*ast.Term), nil
}

func (g *generation) evalLogged(ctx context.Context, entry string, pq *rego.PreparedEvalQuery, input ast.Value) (*ast.Term, error) {
	start := time.Now()
	t, err := g.evalQuery(ctx, entry, pq, input)
	g.decisions.LogDecision(ctx, &Decision{
		Name:      entry,
		Query:     queryOf(entry),
		Revision:  g.revision,
		Input:     input,
		Result:    t,
		Err:       err,
		Timestamp: start,
		Duration:  time.Since(start),
	})
	return t, err
}
