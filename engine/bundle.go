package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
)

// generation is one activated bundle: compiled modules, its data and one prepared query per
// entrypoint. It is immutable once built, so a decision that holds a generation evaluates
// against exactly one bundle revision however many swaps happen meanwhile.
type generation struct {
	// id tells generations apart, even two activations of one revision.
	id       uint64
	revision string
	source   string
	digest   string // of the files at source when loaded from a path
	queries  map[string]rego.PreparedEvalQuery
	// modules are the served modules as parsed, compiler and store what the queries were
	// prepared with: partial evaluation (partial.go) prepares more queries from them.
	modules  map[string]*ast.Module
	compiler *ast.Compiler
	store    storage.Store
	// decisions receives every decision evaluated on this generation; nil when off.
	decisions DecisionLogger
	// budget bounds every evaluation: the trial's before activation, the live one after.
	budget *budgetPolicy
	// raw and etag are the tarball as served and its ETag, for a bundle from a server (or
	// persisted from one), to persist it again when it is restored; nil otherwise.
	raw  []byte
	etag string
}

// isTestFile tells the modules that hold Rego tests; they are run before activation and
// never served.
func isTestFile(path string) bool { return strings.HasSuffix(path, "_test.rego") }

// loadFS reads a bundle source tree (such as the one compiled into the binary).
func loadFS(fsys fs.FS, skipTests bool) (*bundle.Bundle, error) {
	l := loader.NewFileLoader().WithFS(fsys).WithProcessAnnotation(true)
	if skipTests {
		l = l.WithFilter(func(abspath string, info fs.FileInfo, _ int) bool {
			return !info.IsDir() && isTestFile(abspath)
		})
	}
	b, err := l.AsBundle(".")
	if err != nil {
		return nil, fmt.Errorf("load embedded bundle: %w", err)
	}
	return b, nil
}

// loadPath reads a bundle directory or a .tar.gz built by `opa build`, verifying its
// signature when vc is set (an unsigned bundle is then refused). A file of more than
// fileLimit bytes, or files of more than sizeLimit bytes together (decompressed), are
// refused before they are read whole.
func loadPath(path string, vc *bundle.VerificationConfig, fileLimit, sizeLimit int64) (*bundle.Bundle, error) {
	b, err := readPath(path, vc, fileLimit, sizeLimit)
	if err != nil {
		return nil, refusedLoad(path, vc, err)
	}
	return b, nil
}

// loadRaw reads a tarball held in memory (a bundle persisted from a server, raw as served)
// as loadPath reads one on disk; name is where it was kept. Compressed, it holds at most
// sizeLimit bytes, as it would decompressed.
func loadRaw(name string, raw []byte, vc *bundle.VerificationConfig, fileLimit, sizeLimit int64) (*bundle.Bundle, error) {
	if int64(len(raw)) > sizeLimit {
		return nil, refusedLoad(name, vc, fmt.Errorf("bundle %s: %w: more than the bundle size limit of %d bytes compressed", name, ErrBundleTooLarge, sizeLimit))
	}
	b, err := readTarball(name, bytes.NewReader(raw), vc, fileLimit, sizeLimit)
	if err != nil {
		return nil, refusedLoad(name, vc, err)
	}
	return b, nil
}

// refusedLoad is err, reading the bundle at name, as a refusal for its reason.
func refusedLoad(name string, vc *bundle.VerificationConfig, err error) error {
	reason := ReasonRead
	if vc != nil && isSignatureError(err) {
		reason = ReasonSignature
	}
	return refused(name, reason, "load", err)
}

func readPath(path string, vc *bundle.VerificationConfig, fileLimit, sizeLimit int64) (*bundle.Bundle, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		return readDir(path, vc, fileLimit, sizeLimit)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", info.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readTarball(path, f, vc, fileLimit, sizeLimit)
}

// readTarball reads a bundle tarball from in; name is where it comes from.
func readTarball(name string, in io.Reader, vc *bundle.VerificationConfig, fileLimit, sizeLimit int64) (*bundle.Bundle, error) {
	// OPA's tarball reader stops at the file limit while decompressing each file; the size
	// guard reads the same bytes and stops the reader once the files add up to the size limit.
	guard := newSizeGuard(in, sizeLimit)
	defer guard.Close()
	tarball := bundle.NewTarballLoaderWithBaseURL(guard, name).WithSizeLimitBytes(fileLimit)
	r := bundle.NewCustomReader(tarball).
		WithSizeLimitBytes(fileLimit).
		WithProcessAnnotations(true).
		WithRegoVersion(ast.RegoV1).
		WithBundleVerificationConfig(vc).
		WithBundleName(name)
	b, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", name, guard.cause(err))
	}
	return &b, nil
}

// readDir reads a bundle directory. Its files are on disk, so their sizes are known before
// they are read.
func readDir(path string, vc *bundle.VerificationConfig, fileLimit, sizeLimit int64) (*bundle.Bundle, error) {
	var total int64
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file (%s)", p, fi.Mode().Type())
		}
		if fi.Size() > fileLimit {
			return fmt.Errorf("%s: %d bytes, over the bundle file limit of %d", p, fi.Size(), fileLimit)
		}
		if total += fi.Size(); total > sizeLimit {
			return fmt.Errorf("%w: the files up to %s hold %d bytes, over the bundle size limit of %d", ErrBundleTooLarge, p, total, sizeLimit)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	l := loader.NewFileLoader().WithProcessAnnotation(true)
	if vc != nil {
		l = l.WithBundleVerificationConfig(vc)
	}
	return l.AsBundle(path)
}

// build turns a loaded bundle into a generation: compile strictly, check every entrypoint
// exists and the bundle's settings are valid, run the bundle's own tests (with the same
// semantics as `opa test`: builtin errors make an expression undefined, as they do in
// decisions), then prepare one query per entrypoint.
// Any failure is wrapped in ErrBundleRefused and names the file and line where known.
// The settings checks and the tests run under the trial budget (the tests each also under
// OPA's own 5 s test timeout).
func (e *Engine) build(ctx context.Context, b *bundle.Bundle, source string) (*generation, error) {
	served, tests := splitModules(b)
	compiler := ast.NewCompiler().WithStrict(true).WithEnablePrintStatements(false)
	if compiler.Compile(served); compiler.Failed() {
		return nil, refused(source, ReasonCompile, "compile", compiler.Errors)
	}
	if err := checkEntrypoints(compiler); err != nil {
		return nil, refused(source, ReasonDecisions, "check decisions", err)
	}
	store := inmem.NewFromObjectWithOpts(b.Data,
		inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true))
	trial := &budgetPolicy{Budget: e.trialBudget}
	err := trial.run(ctx, "settings_errors", func(ctx context.Context) error { return checkSettings(ctx, compiler, store) })
	if err != nil {
		return nil, refused(source, budgetOr(err, ReasonSettings), "check settings", err)
	}
	if len(tests) > 0 {
		// The tests are many evaluations: the memory budget bounds them all together.
		tb := &budgetPolicy{Budget: Budget{Memory: e.trialBudget.Memory}}
		err := tb.run(ctx, "tests", func(ctx context.Context) error { return runTests(ctx, b, served, tests) })
		if err != nil {
			return nil, refused(source, budgetOr(err, ReasonTest), "test", err)
		}
	}
	g := &generation{
		id: generations.Add(1), revision: revision(b), source: source, queries: map[string]rego.PreparedEvalQuery{},
		modules: served, compiler: compiler, store: store,
	}
	for name, query := range entrypoints {
		pq, err := prepare(ctx, compiler, store, query)
		if err != nil {
			return nil, refused(source, ReasonPrepare, "prepare "+name, err)
		}
		g.queries[name] = pq
	}
	for name, query := range optionalEntrypoints {
		if len(compiler.GetRulesExact(ast.MustParseRef(query))) == 0 {
			continue
		}
		pq, err := prepare(ctx, compiler, store, query)
		if err != nil {
			return nil, refused(source, ReasonPrepare, "prepare "+name, err)
		}
		g.queries[name] = pq
	}
	return g, nil
}

// budgetOr is ReasonBudget when err is a broken budget, reason otherwise.
func budgetOr(err error, reason string) string {
	if errors.Is(err, ErrBudgetExceeded) {
		return ReasonBudget
	}
	return reason
}

// generations counts the generations built, to number them.
var generations atomic.Uint64

func refused(source, reason, step string, err error) error {
	return &BundleError{Source: source, Reason: reason, Step: step, Err: err}
}

func splitModules(b *bundle.Bundle) (served, tests map[string]*ast.Module) {
	served, tests = map[string]*ast.Module{}, map[string]*ast.Module{}
	for _, m := range b.Modules {
		if isTestFile(m.Path) {
			tests[m.Path] = m.Parsed
		} else {
			served[m.Path] = m.Parsed
		}
	}
	return served, tests
}

func checkEntrypoints(c *ast.Compiler) error {
	var missing []error
	for _, name := range slices.Sorted(maps.Keys(entrypoints)) {
		ref := ast.MustParseRef(entrypoints[name])
		if len(c.GetRulesExact(ref)) == 0 {
			pkg, rule := ref[:len(ref)-1], ref[len(ref)-1].Value.(ast.String)
			missing = append(missing, fmt.Errorf("%w %s: no rule %q in package %s",
				ErrMissingDecision, name, string(rule), strings.TrimPrefix(pkg.String(), "data.")))
		}
	}
	return errors.Join(missing...)
}

// runTests runs the bundle's Rego tests against its own modules and data, as `opa test` would.
func runTests(ctx context.Context, b *bundle.Bundle, served, tests map[string]*ast.Module) error {
	modules := maps.Clone(served)
	maps.Copy(modules, tests)
	store := inmem.NewFromObjectWithOpts(b.Data, inmem.OptRoundTripOnWrite(false))
	txn, err := store.NewTransaction(ctx)
	if err != nil {
		return fmt.Errorf("open transaction: %w", err)
	}
	defer store.Abort(ctx, txn)
	ch, err := tester.NewRunner().SetStore(store).SetModules(modules).RunTests(ctx, txn)
	if err != nil {
		return fmt.Errorf("compile tests: %w", err)
	}
	var failed []string
	passed := 0
	for r := range ch {
		switch {
		case r.Error != nil:
			failed = append(failed, fmt.Sprintf("%s: %s.%s: error: %v", r.Location, r.Package, r.Name, r.Error))
		case r.Fail:
			failed = append(failed, fmt.Sprintf("%s: %s.%s: failed", r.Location, r.Package, r.Name))
		case !r.Skip:
			passed++
		}
	}
	if len(failed) > 0 {
		sort.Strings(failed)
		return fmt.Errorf("%w: %d failed, %d passed:\n  %s", ErrBundleTestsFailed, len(failed), passed, strings.Join(failed, "\n  "))
	}
	return nil
}

func prepare(ctx context.Context, c *ast.Compiler, store storage.Store, query string) (rego.PreparedEvalQuery, error) {
	return rego.New(
		rego.Query(query),
		rego.Compiler(c),
		rego.Store(store),
		rego.GenerateJSON(keepAST),
	).PrepareForEval(ctx)
}

// keepAST hands results back as AST terms; the typed decoders read them without a JSON trip.
func keepAST(t *ast.Term, _ *rego.EvalContext) (any, error) { return t, nil }

func checkSettings(ctx context.Context, c *ast.Compiler, store storage.Store) error {
	var errs []error
	for _, query := range settingsChecks {
		rs, err := rego.New(rego.Query(query), rego.Compiler(c), rego.Store(store)).Eval(ctx)
		if err != nil {
			return fmt.Errorf("evaluate %s: %w", query, err)
		}
		for _, r := range rs {
			for _, e := range r.Expressions {
				msgs, _ := e.Value.([]any)
				for _, m := range msgs {
					errs = append(errs, fmt.Errorf("%s: %v", strings.TrimSuffix(query, ".settings_errors"), m))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// revision is the manifest's revision, or a digest of the bundle's contents when it has none,
// so every generation can be told apart.
func revision(b *bundle.Bundle) string {
	if b.Manifest.Revision != "" {
		return b.Manifest.Revision
	}
	h := sha256.New()
	mods := slices.Clone(b.Modules)
	slices.SortFunc(mods, func(a, b bundle.ModuleFile) int { return strings.Compare(a.Path, b.Path) })
	for _, m := range mods {
		fmt.Fprintf(h, "%s\x00%d\x00", m.Path, len(m.Raw))
		h.Write(m.Raw)
	}
	fmt.Fprintf(h, "%v", ast.MustInterfaceToValue(b.Data))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))[:16]
}
