// Package engine evaluates the virt-rules decisions with an embedded OPA.
//
// An Engine serves one bundle generation at a time: the bundle compiled into the binary by
// default, or one loaded from a directory or tarball. Loading compiles strictly, checks that
// every decision exists, runs the bundle's own tests and prepares one query per decision;
// only then does the new generation replace the serving one, atomically. A bundle that fails
// any step is refused and the previous one keeps serving.
//
// The engine knows nothing of Kubernetes clients: callers gather objects, call a typed
// method per decision (MigrationPolicies, ...), and apply the answer.
package engine

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"

	virtrego "github.com/virt-rules/virt-rules/rego"
)

// SourceEmbedded names the bundle compiled into the binary.
const SourceEmbedded = "embedded"

// Engine evaluates decisions against the active bundle. It is safe for concurrent use.
type Engine struct {
	active atomic.Pointer[generation]
	loadMu sync.Mutex // serialises loads so the last successful one wins
	log    *slog.Logger
}

type options struct {
	bundlePath string
	log        *slog.Logger
}

// Option configures New.
type Option func(*options)

// WithBundlePath serves the bundle at path (a directory or a .tar.gz built by `opa build`)
// instead of the embedded one.
func WithBundlePath(path string) Option { return func(o *options) { o.bundlePath = path } }

// WithLogger sets the structured logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// New builds an engine serving the configured bundle. It fails when that bundle is refused.
func New(ctx context.Context, opts ...Option) (*Engine, error) {
	o := options{log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	e := &Engine{log: o.log}
	var err error
	if o.bundlePath != "" {
		err = e.LoadPath(ctx, o.bundlePath)
	} else {
		err = e.loadEmbedded(ctx)
	}
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Revision is the revision of the bundle being served.
func (e *Engine) Revision() string { return e.active.Load().revision }

// Source tells where the bundle being served came from: SourceEmbedded or its path.
func (e *Engine) Source() string { return e.active.Load().source }

// loadEmbedded activates the bundle compiled into the binary. Its tests ran when the binary
// was built (`make test`), so they are not run again on every start.
func (e *Engine) loadEmbedded(ctx context.Context) error {
	return e.loadFS(ctx, virtrego.Bundle(), SourceEmbedded, true)
}

func (e *Engine) loadFS(ctx context.Context, fsys fs.FS, source string, skipTests bool) error {
	b, err := loadFS(fsys, skipTests)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBundleRefused, source, err)
	}
	return e.activate(ctx, func() (*generation, error) { return build(ctx, b, source) })
}

// LoadPath loads, validates and activates the bundle at path (a directory or a .tar.gz). On
// any error the bundle being served stays active and the error says why the new one was
// refused, naming the file and line where known.
func (e *Engine) LoadPath(ctx context.Context, path string) error {
	// Digest before reading: if the path changes in between, the watcher sees a newer digest
	// and loads again.
	digest, _ := digestPath(path)
	b, err := loadPath(path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBundleRefused, err)
	}
	return e.activate(ctx, func() (*generation, error) {
		g, err := build(ctx, b, path)
		if g != nil {
			g.digest = digest
		}
		return g, err
	})
}

func (e *Engine) activate(ctx context.Context, build func() (*generation, error)) error {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	g, err := build()
	if err != nil {
		e.log.ErrorContext(ctx, "bundle refused", "error", err)
		return err
	}
	old := e.active.Swap(g)
	attrs := []any{"revision", g.revision, "source", g.source}
	if old != nil {
		attrs = append(attrs, "previousRevision", old.revision)
	}
	e.log.InfoContext(ctx, "bundle activated", attrs...)
	return nil
}

// eval runs one entrypoint of generation g on input and returns its value.
func (g *generation) eval(ctx context.Context, entry string, input ast.Value) (*ast.Term, error) {
	rs, err := g.queries[entry].Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return nil, fmt.Errorf("evaluate %s (bundle %s): %w", entry, g.revision, err)
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return nil, fmt.Errorf("evaluate %s (bundle %s): %w", entry, g.revision, ErrUndefined)
	}
	return rs[0].Expressions[0].Value.(*ast.Term), nil
}
