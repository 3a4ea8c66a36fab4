package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// Partial evaluation.
//
// Some decisions are asked many times with most of their input fixed: the MigrationPolicy
// decision for every VMI of one policy set. For those the engine partially evaluates one rule
// of the decision (OPA's partial evaluation, as `opa eval --partial` does) with the fixed input
// known and the rest unknown. What comes out are rules in package partial.<the rule's package>,
// as OPA names them, whose bodies test only the unknown input. The engine prepares the decision
// again with them beside the modules it depends on. The decision reads data.partial.<rule> when
// it is there and the rule itself otherwise; the two are the same set. OPA's rule index then
// finds the partially evaluated rules that apply by the values of the unknown input, rather
// than trying every one.

// partialRule is a rule the engine partially evaluates, and the decision that reads it.
type partialRule struct {
	// rule is the rule to partially evaluate.
	rule string
	// unknowns are the parts of input that change between decisions.
	unknowns []*ast.Term
	// decision is the entrypoint prepared again beside the partial evaluation.
	decision string
}

// partialMatching partially evaluates `matching`, the policies a VMI matches, for one policy
// set: each policy becomes one rule comparing the VMI's and its namespace's labels with the
// values the policy requires.
var partialMatching = partialRule{
	rule:     "data.virtrules.migration.policy.matching",
	unknowns: []*ast.Term{ast.MustParseTerm("input.vmi"), ast.MustParseTerm("input.namespace")},
	decision: entryMigrationPolicy,
}

// partialDecision partially evaluates r with input known and prepares r.decision with the
// result. It returns nil, and no error, when the bundle has no rule r.rule or the partial
// evaluation is not a set of rules (as for an empty policy set): the generation's own query
// then decides, with the same answer.
func (g *generation) partialDecision(ctx context.Context, r partialRule, input ast.Value) (*rego.PreparedEvalQuery, error) {
	support, err := g.partialSupport(ctx, r, input)
	if err != nil || support == nil {
		return nil, err
	}
	return g.preparePartial(ctx, r, support)
}

// partialSupport partially evaluates r with input known and returns the modules that define
// its partial evaluation; nil, and no error, when the bundle has no rule r.rule or the
// partial evaluation is not a set of rules.
func (g *generation) partialSupport(ctx context.Context, r partialRule, input ast.Value) ([]*ast.Module, error) {
	if len(g.compiler.GetRulesExact(ast.MustParseRef(r.rule))) == 0 {
		return nil, nil
	}
	// The partial evaluation is an evaluation of the decision: under its budget.
	var pq *rego.PartialQueries
	err := g.budget.run(ctx, r.decision, func(ctx context.Context) error {
		var err error
		pq, err = rego.New(
			rego.Query(r.rule),
			rego.Compiler(g.compiler),
			rego.Store(g.store),
			rego.ParsedInput(input),
			rego.ParsedUnknowns(r.unknowns),
			rego.DisableInlining([]string{r.rule}),
			rego.Metrics(noMetrics),
		).Partial(ctx)
		return err
	})
	if berr := (*BudgetError)(nil); errors.As(err, &berr) {
		g.budget.report(ctx, g, berr)
	}
	if err != nil {
		return nil, fmt.Errorf("partially evaluate %s: %w", r.rule, err)
	}
	// With inlining disabled for the rule, the residual query is a reference to its partial
	// evaluation, which the support modules define. Anything else (no query, an empty one) is
	// used as no partial evaluation at all.
	if len(pq.Queries) != 1 || len(pq.Queries[0]) != 1 || !pq.Queries[0][0].Equal(ast.NewExpr(ast.NewTerm(r.partialRef()))) {
		return nil, nil
	}
	return pq.Support, nil
}

// partialRef is where the partial evaluation of r is: data.partial.<r.rule without data.>.
func (r partialRule) partialRef() ast.Ref {
	return append(ast.MustParseRef("data.partial"), ast.MustParseRef(r.rule)[1:]...)
}

// preparePartial prepares r.decision beside support, the modules of r's partial evaluation.
func (g *generation) preparePartial(ctx context.Context, r partialRule, support []*ast.Module) (*rego.PreparedEvalQuery, error) {
	modules := g.modulesOf(entrypoints[r.decision])
	metadata := callsRegoMetadata(modules) // the support modules are OPA's, without such calls
	for i, m := range support {
		modules[fmt.Sprintf("partial/%s/%d.rego", r.rule, i)] = m
	}
	// Not strict, and without the stages that only check: the modules passed the bundle's
	// strict compilation, and the support modules are OPA's own output. Compiling a partial
	// evaluation of thousands of rules is most of what preparing a policy set costs; the
	// checks were a third of it, and the dependency graph they read (StageSetGraph) half of
	// what remained.
	skip := checkOnlyStages
	if !metadata {
		skip = append(slices.Clip(skip), metadataStages...)
	}
	c := ast.NewCompiler().WithEnablePrintStatements(false).WithSkipStages(skip...)
	if c.Compile(modules); c.Failed() {
		return nil, fmt.Errorf("compile the partial evaluation of %s: %w", r.rule, c.Errors)
	}
	prepared, err := prepare(ctx, c, g.store, entrypoints[r.decision])
	if err != nil {
		return nil, fmt.Errorf("prepare %s with the partial evaluation of %s: %w", r.decision, r.rule, err)
	}
	return &prepared, nil
}

// checkOnlyStages are the compiler stages that only report errors, and change nothing that
// evaluation reads; and StageSetGraph, the rule dependency graph that only the checks of
// recursion and types read.
var checkOnlyStages = []ast.StageID{
	ast.StageCheckTypes, ast.StageCheckRecursion, ast.StageCheckRuleConflicts, ast.StageCheckUndefinedFuncs,
	ast.StageCheckUnusedImports, ast.StageCheckDeprecatedBuiltins, ast.StageCheckUnsafeBuiltins,
	ast.StageBuildRequiredCapabilities, ast.StageCheckKeywordOverrides, ast.StageCheckDuplicateImports, ast.StageCheckVoidCalls,
	ast.StageSetGraph,
}

// metadataStages read METADATA comments for rego.metadata.rule and rego.metadata.chain: not
// needed when no module calls them.
var metadataStages = []ast.StageID{ast.StageParseMetadataBlocks, ast.StageRewriteRegoMetadataCalls}

// callsRegoMetadata tells whether a module calls rego.metadata.rule or rego.metadata.chain.
func callsRegoMetadata(modules map[string]*ast.Module) bool {
	calls := false
	for _, m := range modules {
		ast.WalkRefs(m, func(ref ast.Ref) bool {
			calls = calls || ref.HasPrefix(regoMetadataRef)
			return calls
		})
		if calls {
			return true
		}
	}
	return false
}

var regoMetadataRef = ast.MustParseRef("rego.metadata")

// modulesOf returns the served modules, as parsed, that hold the rules of query and every rule
// they depend on.
func (g *generation) modulesOf(query string) map[string]*ast.Module {
	files := make(map[*ast.Module]string, len(g.compiler.Modules))
	for name, m := range g.compiler.Modules {
		files[m] = name
	}
	out := map[string]*ast.Module{}
	seen := map[*ast.Rule]bool{}
	var visit func(*ast.Rule)
	visit = func(r *ast.Rule) {
		if seen[r] {
			return
		}
		seen[r] = true
		if name, ok := files[r.Module]; ok {
			out[name] = g.modules[name]
		}
		for dep := range g.compiler.Graph.Dependencies(r) {
			visit(dep.(*ast.Rule))
		}
	}
	for _, r := range g.compiler.GetRules(ast.MustParseRef(query)) {
		visit(r)
	}
	return out
}
