package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	migrationsv1alpha1 "kubevirt.io/api/migrations/v1alpha1"
)

// Validating a MigrationPolicy compares its selectors with every existing policy's. The
// validation package's `selector_keys` says, per policy, the key that comparison looks at
// (null: never compared), so the engine keys the existing policies once, buckets them by key,
// and passes `decision` only the bucket of the admitted policy: O(1) Rego work per validation
// after an O(N) preparation. A bundle without `selector_keys` gets every existing policy, as
// before.

// ExistingMigrationPolicies is a set of existing MigrationPolicies prepared for validating
// MigrationPolicies against it (ValidateMigrationPolicyIn). The keys are computed once per
// bundle generation, on first use. Safe for concurrent use; the caller must not modify the
// policies while the set is in use. Build a new one when the policies change.
type ExistingMigrationPolicies struct {
	policies []*unstructured.Unstructured
	// keys are the policies' comparison keys as a MigrationPolicyIndex or an earlier keying
	// gave them (NewKeyedMigrationPolicies), position for position; nil when not known. A key
	// of another generation than the validation's is evaluated again.
	keys []MigrationPolicyComparisonKey

	mu    sync.Mutex
	cache *selectorBuckets
}

// selectorBuckets are the existing policies by selector key, for one generation.
type selectorBuckets struct {
	gen *generation
	// buckets maps a key to the positions of the policies that have it; nil when the bundle
	// has no selector_keys, and every policy (all) is passed instead.
	buckets map[string][]int
	all     *ast.Term
}

// selectorKey is one entry of selector_keys: ok is false for null.
type selectorKey struct {
	key string
	ok  bool
}

// selectorKeyMemo remembers the keys of stored policies (those with a UID and a
// resourceVersion, whose content that pair identifies) from one preparation to the next, so
// that a controller listing the policies anew for each call evaluates only the policies that
// changed since. A set less than half the size of the one remembered does not replace it.
type selectorKeyMemo struct {
	mu   sync.Mutex
	gen  *generation
	keys map[string]selectorKey // "<uid>/<resourceVersion>" -> key; replaced, never modified
}

// ExistingMigrationPolicies prepares policies (migrations.kubevirt.io/v1alpha1 MigrationPolicy,
// as stored) for validating MigrationPolicies against them. A policy in the set with the name
// of the one validated is its old version, and is ignored.
func (e *Engine) ExistingMigrationPolicies(policies []*unstructured.Unstructured) *ExistingMigrationPolicies {
	return NewExistingMigrationPolicies(policies)
}

// NewExistingMigrationPolicies is (*Engine).ExistingMigrationPolicies, for callers that hold
// only an interface of the engine: the set is tied to no engine until its first use.
func NewExistingMigrationPolicies(policies []*unstructured.Unstructured) *ExistingMigrationPolicies {
	return &ExistingMigrationPolicies{policies: policies}
}

// KeyedMigrationPolicy is a MigrationPolicy with its comparison key, as a MigrationPolicyIndex
// holds it.
type KeyedMigrationPolicy struct {
	Policy *unstructured.Unstructured
	Key    MigrationPolicyComparisonKey
}

// NewKeyedMigrationPolicies is NewExistingMigrationPolicies for policies whose comparison keys
// the caller has (MigrationPolicyIndex.SameKey): the validation buckets them by these keys
// instead of evaluating them again, but for a key of another bundle generation than the one
// validating (the bundle changed since, or the key is the zero value), which it evaluates.
func NewKeyedMigrationPolicies(policies []KeyedMigrationPolicy) *ExistingMigrationPolicies {
	s := &ExistingMigrationPolicies{
		policies: make([]*unstructured.Unstructured, len(policies)),
		keys:     make([]MigrationPolicyComparisonKey, len(policies)),
	}
	for i, p := range policies {
		s.policies[i], s.keys[i] = p.Policy, p.Key
	}
	return s
}

// Len is the number of policies in the set.
func (s *ExistingMigrationPolicies) Len() int { return len(s.policies) }

// Policies are the policies of the set, not to be modified.
func (s *ExistingMigrationPolicies) Policies() []*unstructured.Unstructured { return s.policies }

// ValidateMigrationPolicy checks policy as an admission webhook would, against the existing
// policies (an existing policy of the same name is its old version). It returns the
// violations, sorted; none means the policy is valid. To validate several policies against
// the same existing ones, prepare them once and use ValidateMigrationPolicyIn.
func (e *Engine) ValidateMigrationPolicy(ctx context.Context, policy *unstructured.Unstructured, existing []*unstructured.Unstructured) ([]Violation, error) {
	return e.ValidateMigrationPolicyIn(ctx, policy, e.ExistingMigrationPolicies(existing))
}

// ValidateMigrationPolicyIn is ValidateMigrationPolicy against a prepared set of existing
// policies: after the set's first use on a bundle, its cost does not grow with the set.
func (e *Engine) ValidateMigrationPolicyIn(ctx context.Context, policy *unstructured.Unstructured, existing *ExistingMigrationPolicies) ([]Violation, error) {
	return e.ValidateMigrationPolicyAdmission(ctx, MigrationPolicyAdmission{Policy: policy}, existing)
}

// MigrationPolicyAdmission is a MigrationPolicy to validate and what else its admission may
// read besides the existing policies.
type MigrationPolicyAdmission struct {
	// Policy is the MigrationPolicy created or updated, as it would be stored.
	Policy *unstructured.Unstructured
	// Old is the version an update replaces, as stored; nil for a create (or offline). A
	// feature-gated field (maxDowntimeMs, the stall detector) left as it was passes.
	Old *unstructured.Unstructured
	// KubeVirt is the cluster's KubeVirt CR; nil when unknown, and then the checks that read
	// it (feature gates) are not made.
	KubeVirt *unstructured.Unstructured
	// Key is Policy's comparison key when the caller has it (MigrationPolicyComparisonKey, as
	// a webhook asks it to serialise admissions): the validation then does not evaluate it
	// again. The zero value, or a key of another bundle generation, is evaluated.
	Key MigrationPolicyComparisonKey
}

// ValidateMigrationPolicyAdmission is ValidateMigrationPolicyIn for an admission that carries
// the version it replaces and the cluster's KubeVirt CR.
func (e *Engine) ValidateMigrationPolicyAdmission(ctx context.Context, a MigrationPolicyAdmission, existing *ExistingMigrationPolicies) ([]Violation, error) {
	policy := a.Policy
	p, err := objectTerm(policy)
	if err != nil {
		return nil, fmt.Errorf("validate MigrationPolicy %s: %w", policy.GetName(), err)
	}
	input := ast.NewObject(item("policy", p))
	for _, o := range []struct {
		key string
		obj *unstructured.Unstructured
	}{{"oldPolicy", a.Old}, {"kubevirt", a.KubeVirt}} {
		if o.obj == nil {
			continue
		}
		t, err := objectTerm(o.obj)
		if err != nil {
			return nil, fmt.Errorf("validate MigrationPolicy %s: %s: %w", policy.GetName(), o.key, err)
		}
		input.Insert(ast.StringTerm(o.key), t)
	}
	g := e.active.Load()
	b, err := existing.prepare(ctx, e, g)
	if err != nil {
		return nil, fmt.Errorf("validate MigrationPolicy %s: %w", policy.GetName(), err)
	}
	others := b.all
	if b.buckets != nil {
		own, ok := a.Key.of(g)
		if !ok {
			keys, err := evalSelectorKeys(ctx, g, []*ast.Term{p})
			if err != nil {
				return nil, fmt.Errorf("validate MigrationPolicy %s: %w", policy.GetName(), err)
			}
			own = keys[0]
		}
		var same []*ast.Term
		if own.ok {
			for _, i := range b.buckets[own.key] {
				t, err := objectTerm(existing.policies[i])
				if err != nil {
					return nil, fmt.Errorf("validate MigrationPolicy %s: %w", policy.GetName(), err)
				}
				same = append(same, t)
			}
		}
		others = ast.ArrayTerm(same...)
	}
	input.Insert(ast.StringTerm("policies"), others)
	t, err := g.eval(ctx, entryMigrationPolicyValidation, input)
	if err != nil {
		return nil, fmt.Errorf("validate MigrationPolicy %s: %w", policy.GetName(), err)
	}
	var out struct {
		Violations []Violation `json:"violations"`
	}
	if err := decode(t, &out); err != nil {
		return nil, fmt.Errorf("validate MigrationPolicy %s: decode: %w", policy.GetName(), err)
	}
	out.Violations = append(out.Violations, typeViolations(policy, out.Violations)...)
	sort.Slice(out.Violations, func(i, j int) bool {
		return strings.Compare(out.Violations[i].String(), out.Violations[j].String()) < 0
	})
	return out.Violations, nil
}

// MigrationPolicyComparisonKey says which existing policies the validation of a policy compares
// it with, under one bundle generation: Compared is false when none (the bundle's
// selector_keys gives it null), and otherwise it is compared with every policy of the same Key.
// A bundle without selector_keys compares every policy with every other: Key is then "" for
// all. Two admissions with different keys cannot make each other invalid, so a webhook need
// serialise only admissions with the same key. The generation that keyed it travels with it,
// so that a validation under the same generation takes it as it is (MigrationPolicyAdmission.Key,
// NewKeyedMigrationPolicies) and one under another evaluates it again.
type MigrationPolicyComparisonKey struct {
	Key      string
	Compared bool

	gen *generation // nil: not known
}

// of is k as the selector key of generation g: ok is false when k is of another generation
// (or unknown) and must be evaluated again.
func (k MigrationPolicyComparisonKey) of(g *generation) (key selectorKey, ok bool) {
	if k.gen == nil || k.gen != g {
		return selectorKey{}, false
	}
	return selectorKey{key: k.Key, ok: k.Compared}, true
}

// comparisonKey is key, of generation g, as a MigrationPolicyComparisonKey.
func comparisonKey(g *generation, key selectorKey) MigrationPolicyComparisonKey {
	return MigrationPolicyComparisonKey{Key: key.key, Compared: key.ok, gen: g}
}

// MigrationPolicyComparisonKey is policy's comparison key under the active bundle: one
// evaluation of selector_keys, none under a bundle without it.
func (e *Engine) MigrationPolicyComparisonKey(ctx context.Context, policy *unstructured.Unstructured) (MigrationPolicyComparisonKey, error) {
	g := e.active.Load()
	if _, ok := g.queries[entryMigrationPolicySelectorKeys]; !ok {
		return comparisonKey(g, selectorKey{ok: true}), nil
	}
	p, err := objectTerm(policy)
	if err != nil {
		return MigrationPolicyComparisonKey{}, fmt.Errorf("key MigrationPolicy %s: %w", policy.GetName(), err)
	}
	keys, err := evalSelectorKeys(ctx, g, []*ast.Term{p})
	if err != nil {
		return MigrationPolicyComparisonKey{}, fmt.Errorf("key MigrationPolicy %s: %w", policy.GetName(), err)
	}
	return comparisonKey(g, keys[0]), nil
}

// prepare returns the set's buckets for generation g, computing them when g is new to it.
func (s *ExistingMigrationPolicies) prepare(ctx context.Context, e *Engine, g *generation) (*selectorBuckets, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache != nil && s.cache.gen == g {
		return s.cache, nil
	}
	b := &selectorBuckets{gen: g}
	if _, ok := g.queries[entryMigrationPolicySelectorKeys]; !ok {
		all, err := objectsTerm(s.policies)
		if err != nil {
			return nil, err
		}
		b.all = all
	} else {
		keys, err := s.selectorKeys(ctx, e, g)
		if err != nil {
			return nil, err
		}
		b.buckets = map[string][]int{}
		for i, k := range keys {
			if k.ok {
				b.buckets[k.key] = append(b.buckets[k.key], i)
			}
		}
	}
	s.cache = b
	return b, nil
}

// selectorKeys returns the selector key of each policy of the set for generation g: those it
// was given keyed for g as they are, the others from the engine (its memo, or evaluated).
func (s *ExistingMigrationPolicies) selectorKeys(ctx context.Context, e *Engine, g *generation) ([]selectorKey, error) {
	if s.keys == nil {
		return e.selectorKeys(ctx, g, s.policies)
	}
	keys := make([]selectorKey, len(s.policies))
	var missing []int
	var unkeyed []*unstructured.Unstructured
	for i, k := range s.keys {
		if key, ok := k.of(g); ok {
			keys[i] = key
			continue
		}
		missing = append(missing, i)
		unkeyed = append(unkeyed, s.policies[i])
	}
	if len(missing) == 0 {
		return keys, nil
	}
	found, err := e.selectorKeys(ctx, g, unkeyed)
	if err != nil {
		return nil, fmt.Errorf("key %d MigrationPolicies: %w", len(unkeyed), err)
	}
	for j, i := range missing {
		keys[i] = found[j]
	}
	return keys, nil
}

// selectorKeys returns the selector key of each policy, evaluating only those the engine's
// memo does not hold for g, and remembers the keys of these policies for the next call.
func (e *Engine) selectorKeys(ctx context.Context, g *generation, policies []*unstructured.Unstructured) ([]selectorKey, error) {
	e.keyMemo.mu.Lock()
	memo := e.keyMemo.keys
	if e.keyMemo.gen != g {
		memo = nil
	}
	e.keyMemo.mu.Unlock()

	keys := make([]selectorKey, len(policies))
	ids := make([]string, len(policies))
	stored := 0
	var missing []int
	var terms []*ast.Term
	for i, p := range policies {
		if uid, rv := p.GetUID(), p.GetResourceVersion(); uid != "" && rv != "" {
			ids[i] = string(uid) + "/" + rv
			stored++
			if k, ok := memo[ids[i]]; ok {
				keys[i] = k
				continue
			}
		}
		t, err := objectTerm(p)
		if err != nil {
			return nil, err
		}
		missing = append(missing, i)
		terms = append(terms, t)
	}
	if len(missing) > 0 {
		found, err := evalSelectorKeys(ctx, g, terms)
		if err != nil {
			return nil, err
		}
		for j, i := range missing {
			keys[i] = found[j]
		}
	}
	if stored == 0 || len(missing) == 0 || 2*stored < len(memo) {
		// Nothing to remember, nothing new, or a few policies that must not replace the keys
		// of every policy.
		return keys, nil
	}
	next := make(map[string]selectorKey, stored)
	for i, id := range ids {
		if id != "" {
			next[id] = keys[i]
		}
	}
	e.keyMemo.mu.Lock()
	e.keyMemo.gen, e.keyMemo.keys = g, next
	e.keyMemo.mu.Unlock()
	return keys, nil
}

// evalSelectorKeys evaluates selector_keys for policies.
func evalSelectorKeys(ctx context.Context, g *generation, policies []*ast.Term) ([]selectorKey, error) {
	t, err := g.eval(ctx, entryMigrationPolicySelectorKeys, ast.NewObject(item("policies", ast.ArrayTerm(policies...))))
	if err != nil {
		return nil, err
	}
	arr, ok := t.Value.(*ast.Array)
	if !ok || arr.Len() != len(policies) {
		return nil, fmt.Errorf("%s: want an array of %d keys, got %v", entryMigrationPolicySelectorKeys, len(policies), t)
	}
	keys := make([]selectorKey, len(policies))
	for i := range keys {
		switch v := arr.Elem(i).Value.(type) {
		case ast.String:
			keys[i] = selectorKey{key: string(v), ok: true}
		case ast.Null:
		default:
			return nil, fmt.Errorf("%s: key %d: want a string or null, got %v", entryMigrationPolicySelectorKeys, i, ast.ValueName(v))
		}
	}
	return keys, nil
}

// typeViolations are the policy's values KubeVirt's own MigrationPolicySpec cannot hold as
// given, for fields the rules did not already report: a number beyond its Go type
// (completionTimeoutPerGiB: 1e23 is no int64) and a quantity beyond int64 (KubeVirt, as
// resource.Quantity, would silently read 9223372036854775807 bytes). The selectors are left to
// the rules, which also read the design's {matchLabels: ...} shape.
func typeViolations(policy *unstructured.Unstructured, reported []Violation) []Violation {
	spec, ok := policy.Object["spec"].(map[string]any)
	if !ok {
		return nil
	}
	flagged := map[string]bool{}
	for _, v := range reported {
		flagged[v.Field] = true
	}
	var out []Violation
	add := func(field, msg string) {
		if !flagged[field] {
			flagged[field] = true
			out = append(out, Violation{Field: field, Message: msg})
		}
	}
	if msg := Int64QuantityProblem(spec["bandwidthPerMigration"]); msg != "" {
		add("spec.bandwidthPerMigration", msg)
	}
	rest := make(map[string]any, len(spec))
	for k, v := range spec {
		if k != "selectors" {
			rest[k] = v
		}
	}
	raw, err := json.Marshal(rest)
	if err != nil {
		return out
	}
	var typed migrationsv1alpha1.MigrationPolicySpec
	if te := (*json.UnmarshalTypeError)(nil); errors.As(json.Unmarshal(raw, &typed), &te) && te.Field != "" {
		add("spec."+te.Field, fmt.Sprintf("want %s, got a %s", te.Type, te.Value))
	}
	return out
}

// maxInt64Quantity is the largest quantity KubeVirt reads as it is written.
var maxInt64Quantity = resource.NewQuantity(math.MaxInt64, resource.DecimalSI)

// Int64QuantityProblem says what is wrong with value, a quantity KubeVirt reads as an int64
// (such as bandwidthPerMigration), when it is beyond int64: resource.Quantity would silently
// read 9223372036854775807 instead. "" for anything else, left to the other checks.
func Int64QuantityProblem(value any) string {
	var q resource.Quantity
	switch v := value.(type) {
	case string:
		parsed, err := resource.ParseQuantity(v)
		if err != nil {
			return ""
		}
		q = parsed
	case float64:
		if v < math.MaxInt64 && v >= math.MinInt64 {
			return ""
		}
		return fmt.Sprintf("%g is beyond int64: KubeVirt would read %d", v, int64(math.MaxInt64))
	default:
		return ""
	}
	// ParseQuantity itself clamps: compare the digits written with the largest int64.
	s, _ := value.(string)
	if q.Cmp(*maxInt64Quantity) < 0 {
		return ""
	}
	if exact, ok := new(big.Float).SetString(strings.TrimSpace(s)); ok && exact.IsInt() {
		if i, _ := exact.Int(nil); i.IsInt64() {
			return ""
		}
	}
	return fmt.Sprintf("%s is beyond int64: KubeVirt would read %d", shownQuantity(s), int64(math.MaxInt64))
}

// shownQuantity cuts a long quantity for a message.
func shownQuantity(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q... (%d characters)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}
