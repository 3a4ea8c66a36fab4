package engine

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	virtrego "github.com/virt-rules/virt-rules/rego"
)

// partialTestPolicies cover what partial evaluation turns into rule bodies: labelled values
// and keys in both scopes, the namespace's derived name label, empty and malformed selectors.
func partialTestPolicies() []*unstructured.Unstructured {
	policy := func(name string, vmi, ns any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "migrations.kubevirt.io/v1alpha1", "kind": "MigrationPolicy",
			"metadata": map[string]any{"name": name},
			"spec": map[string]any{"selectors": map[string]any{
				"virtualMachineInstanceSelector": vmi, "namespaceSelector": ns,
			}},
		}}
	}
	return []*unstructured.Unstructured{
		policy("db", map[string]any{"app": "db"}, map[string]any{}),
		policy("db-tiered", map[string]any{"matchLabels": map[string]any{"app": "db", "tier": ""}}, map[string]any{}),
		policy("team-x", map[string]any{}, map[string]any{"team": "x"}),
		policy("any-team", map[string]any{}, map[string]any{"team": ""}),
		policy("in-prod", map[string]any{}, map[string]any{"kubernetes.io/metadata.name": "prod"}),
		policy("db-in-prod", map[string]any{"app": "db"}, map[string]any{"kubernetes.io/metadata.name": "prod", "team": ""}),
		policy("everything", map[string]any{}, map[string]any{}),
		policy("malformed", map[string]any{"app": true}, map[string]any{}),
	}
}

func partialTestSubjects() []MigrationPolicySubject {
	return []MigrationPolicySubject{
		{Namespace: "prod", Name: "a", Labels: map[string]string{"app": "db", "tier": "1"}, NamespaceLabels: map[string]string{"team": "x"}},
		{Namespace: "prod", Name: "b", Labels: map[string]string{"app": "db"}},
		{Namespace: "prod", Name: "c", Labels: map[string]string{"app": "db"}, NamespaceLabels: map[string]string{"team": "y"}},
		{Namespace: "dev", Name: "d", Labels: map[string]string{"app": "db"}, NamespaceLabels: map[string]string{"team": "x", "kubernetes.io/metadata.name": "prod"}},
		{Namespace: "dev", Name: "e", Labels: map[string]string{"app": "web"}, NamespaceLabels: map[string]string{}},
		{Namespace: "prod", Name: "f", Labels: map[string]string{"app": "db", "tier": ""}, NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "dev", "team": ""}},
		{Namespace: "", Name: "g"},
		{Namespace: "prod", Name: "h"},
		{Namespace: "dev", Name: "i", NamespaceLabels: map[string]string{"team": "x"}},
	}
}

// The partial evaluation of `matching` decides as the bundle's own decision query does, for
// every subject, and is what Decide uses.
func TestPartialDecisionAgreesWithTheBundlesOwn(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set, err := e.MigrationPolicies(partialTestPolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	g := e.active.Load()
	idx, err := set.index(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if idx.decision == nil {
		t.Fatal("no partial evaluation of matching for the policy set")
	}
	decided := map[string]bool{}
	for _, s := range partialTestSubjects() {
		input := set.input(idx, s)
		own, err := g.eval(ctx, entryMigrationPolicy, input)
		if err != nil {
			t.Fatal(err)
		}
		partial, err := g.evalWith(ctx, entryMigrationPolicy, idx.decision, input)
		if err != nil {
			t.Fatal(err)
		}
		if !own.Equal(partial) {
			t.Errorf("%s: the bundle's own decision is %v, the partial evaluation's %v", s.Key(), own, partial)
		}
		d, err := set.Decide(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		decided[d.Policy] = true
	}
	// The subjects reach most policies, so the comparison above is not of nulls alone.
	want := []string{"any-team", "db", "db-in-prod", "db-tiered", "everything", "in-prod"}
	if got := slices.Sorted(maps.Keys(decided)); !slices.Equal(got, want) {
		t.Errorf("winners %v, want %v", got, want)
	}
}

// An empty policy set has nothing to partially evaluate: the bundle's own query decides.
func TestPartialDecisionNoneForNoPolicies(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set, err := e.MigrationPolicies(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := set.index(ctx, e.active.Load())
	if err != nil {
		t.Fatal(err)
	}
	if idx.decision != nil {
		t.Error("a partial evaluation for no policies")
	}
	d, err := set.Decide(ctx, partialTestSubjects()[0])
	if err != nil || d.Policy != "" {
		t.Errorf("decision %+v, %v; want no policy", d, err)
	}
}

// A bundle whose decision has no rule `matching` (here: renamed) is not partially evaluated,
// and decides as before.
func TestPartialDecisionNoneWithoutTheRule(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.CopyFS(dir, virtrego.Bundle()); err != nil {
		t.Fatal(err)
	}
	word := regexp.MustCompile(`\bmatching\b`)
	for _, name := range []string{"policy.rego", "policy_test.rego"} {
		path := filepath.Join(dir, "virtrules", "migration", "policy", name)
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, word.ReplaceAll(src, []byte("matched")), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	renamed, err := New(ctx, WithBundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	policies := partialTestPolicies()
	without, err := renamed.MigrationPolicies(policies, nil)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := without.index(ctx, renamed.active.Load())
	if err != nil {
		t.Fatal(err)
	}
	if idx.decision != nil {
		t.Fatal("a partial evaluation for a bundle without the rule")
	}
	with, err := embedded.MigrationPolicies(policies, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range partialTestSubjects() {
		got, err := without.Decide(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		want, err := with.Decide(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if got.Policy != want.Policy || got.MatchingLabels != want.MatchingLabels {
			t.Errorf("%s: %s (%d labels) without the partial evaluation, %s (%d) with it",
				s.Key(), got.Policy, got.MatchingLabels, want.Policy, want.MatchingLabels)
		}
	}
}

// modulesOf keeps the modules a query depends on, through imports and calls into other
// packages, and leaves out the rest.
func TestModulesOf(t *testing.T) {
	modules := map[string]*ast.Module{
		"decision.rego": ast.MustParseModule("package app.decision\n\nimport data.lib.numbers\n\nanswer := numbers.double(input.x)\n"),
		"numbers.rego":  ast.MustParseModule("package lib.numbers\n\ndouble(x) := y if y := x + data.lib.offset.value\n"),
		"offset.rego":   ast.MustParseModule("package lib.offset\n\nvalue := 0\n"),
		"other.rego":    ast.MustParseModule("package other\n\nunrelated := 1\n"),
	}
	c := ast.NewCompiler()
	if c.Compile(modules); c.Failed() {
		t.Fatal(c.Errors)
	}
	g := &generation{modules: modules, compiler: c}
	got := slices.Sorted(maps.Keys(g.modulesOf("data.app.decision.answer")))
	if want := []string{"decision.rego", "numbers.rego", "offset.rego"}; !slices.Equal(got, want) {
		t.Errorf("modules %v, want %v", got, want)
	}
	if m := g.modulesOf("data.app.decision.answer")["numbers.rego"]; m != modules["numbers.rego"] {
		t.Error("modulesOf returned a compiled module, not the parsed one")
	}
}

// A decision that calls rego.metadata.rule still reads its METADATA when prepared beside the
// partial evaluation: the compiler skips the metadata stages only for modules without such
// calls.
func TestPartialDecisionKeepsRegoMetadata(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.CopyFS(dir, virtrego.Bundle()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "virtrules", "migration", "policy", "policy.rego")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const winner = `{"policy": _winner.name,`
	if !strings.Contains(string(src), winner) {
		t.Fatalf("policy.rego has no %s", winner)
	}
	src = []byte(strings.Replace(string(src), winner, `{"policy": _winner.name, "described": _described,`, 1) +
		"\n# METADATA\n# title: read through rego.metadata.rule\n_described := rego.metadata.rule().title\n")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	// Its tests expect decisions without the added key.
	if err := os.Remove(filepath.Join(dir, "virtrules", "migration", "policy", "policy_test.rego")); err != nil {
		t.Fatal(err)
	}
	e, err := New(ctx, WithBundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	set, err := e.MigrationPolicies(partialTestPolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	g := e.active.Load()
	idx, err := set.index(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if idx.decision == nil {
		t.Fatal("no partial evaluation of matching for the policy set")
	}
	got, err := g.evalWith(ctx, entryMigrationPolicy, idx.decision, set.input(idx, partialTestSubjects()[0]))
	if err != nil {
		t.Fatal(err)
	}
	var described ast.String
	if obj, ok := got.Value.(ast.Object); ok {
		if v := obj.Get(ast.StringTerm("described")); v != nil {
			described, _ = v.Value.(ast.String)
		}
	}
	if described != "read through rego.metadata.rule" {
		t.Errorf("described %q, want the rule's METADATA title", described)
	}
}
