package engine_test

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virt-rules/virt-rules/engine"
	virtrego "github.com/virt-rules/virt-rules/rego"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The validation passes `decision` only the existing policies whose selector key is the
// admitted one's (migrationpolicyvalidation.go). These tests hold it to the answers of a
// bundle without selector_keys, which gets every existing policy as the engine always did.

const validationRegoPath = "virtrules/migration/policy/validation/validation.rego"

// unkeyedEngine serves the bundle in mode without selector_keys: the engine then passes every
// existing policy to the validation, as before the keys.
func unkeyedEngine(t *testing.T, mode reference.Mode, opts ...engine.Option) *engine.Engine {
	t.Helper()
	raw, err := fs.ReadFile(virtrego.Bundle(), policyDataPath)
	if err != nil {
		t.Fatal(err)
	}
	dir := bundleDir(t, func(dir string) {
		setPrecedence(t, dir, raw, mode)
		replaceIn(t, filepath.Join(dir, filepath.FromSlash(validationRegoPath)), "\nselector_keys := ", "\nunused_selector_keys := ")
	})
	eng, err := engine.New(context.Background(), append(opts, engine.WithBundlePath(dir))...)
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// validationSelectors are spec.selectors values (nil: no field) that the same-selectors check
// finds the same or not in every way it can: both shapes, absent and empty selectors, either
// scope, key-only values, malformed ones.
var validationSelectors = []any{
	nil,
	"null",
	map[string]any{},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{}},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"matchLabels": map[string]any{}}, "namespaceSelector": nil},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": "db"}},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"matchLabels": map[string]any{"app": "db"}}, "namespaceSelector": map[string]any{}},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": ""}},
	map[string]any{"namespaceSelector": map[string]any{"app": "db"}},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": "db"}, "namespaceSelector": map[string]any{"team": "x"}},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"matchLabels": map[string]any{"app": "db"}}, "namespaceSelector": map[string]any{"matchLabels": map[string]any{"team": "x"}}},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"matchExpressions": []any{}}},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": int64(1)}},
	map[string]any{"virtualMachineInstanceSelector": map[string]any{"matchLabels": map[string]any{"app": "db"}, "tier": "web"}},
	"not an object",
}

// validationNames collide on purpose (an old version of the same policy); "" leaves the name
// out, and 7 is a name that is not a string.
var validationNames = []any{"a", "b", "c", "d", "e", "", int64(7)}

func validationPolicy(name, selectors any) *unstructured.Unstructured {
	metadata := map[string]any{}
	if name != "" {
		metadata["name"] = name
	}
	spec := map[string]any{"allowPostCopy": true}
	switch selectors {
	case nil:
	case "null":
		spec["selectors"] = nil
	default:
		spec["selectors"] = selectors
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": policyAPIVersion, "kind": "MigrationPolicy", "metadata": metadata, "spec": spec,
	}}
}

func randomValidationPolicy(r *rand.Rand) *unstructured.Unstructured {
	return validationPolicy(validationNames[r.IntN(len(validationNames))], validationSelectors[r.IntN(len(validationSelectors))])
}

// validateBoth validates policy on both engines and fails the test when they disagree; it
// returns the number of same-selectors violations.
func validateBoth(t *testing.T, keyed, unkeyed *engine.Engine, policy *unstructured.Unstructured, existing *engine.ExistingMigrationPolicies, others []*unstructured.Unstructured) int {
	t.Helper()
	ctx := context.Background()
	got, err := keyed.ValidateMigrationPolicyIn(ctx, policy, existing)
	if err != nil {
		t.Fatal(err)
	}
	want, err := unkeyed.ValidateMigrationPolicy(ctx, policy, others)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("policy %v against %d others:\n got  %v\n want %v", policy.Object, len(others), got, want)
	}
	same := 0
	for _, v := range got {
		if strings.HasPrefix(v.Message, "same selectors as") {
			same++
		}
	}
	return same
}

// TestValidateMigrationPolicyKeyedUnchanged draws sets of policies and validates each one
// against the rest (as `eval` does, with the whole set prepared once) and a new policy against
// the set (as admission does), with and without selector keys, in both precedences.
func TestValidateMigrationPolicyKeyedUnchanged(t *testing.T) {
	for _, mode := range []reference.Mode{reference.ModeDefault, reference.ModeKubeVirt} {
		t.Run(string(mode), func(t *testing.T) {
			keyed, _ := precedenceEngine(t, mode)
			unkeyed := unkeyedEngine(t, mode)
			r := rand.New(rand.NewPCG(16, uint64(len(mode))))
			duplicates := 0
			for range 150 {
				set := make([]*unstructured.Unstructured, 1+r.IntN(8))
				for i := range set {
					set[i] = randomValidationPolicy(r)
				}
				existing := keyed.ExistingMigrationPolicies(set)
				for i, p := range set {
					others := append(append([]*unstructured.Unstructured{}, set[:i]...), set[i+1:]...)
					duplicates += validateBoth(t, keyed, unkeyed, p, existing, others)
				}
				duplicates += validateBoth(t, keyed, unkeyed, randomValidationPolicy(r), existing, set)
			}
			// The draws must exercise the check: duplicates in the default precedence, none
			// where it is off.
			if mode == reference.ModeDefault && duplicates < 100 {
				t.Errorf("only %d same-selectors violations: the draws do not exercise the check", duplicates)
			}
			if mode == reference.ModeKubeVirt && duplicates != 0 {
				t.Errorf("%d same-selectors violations in the kubevirt precedence", duplicates)
			}
		})
	}
}

// TestValidateMigrationPolicyKeyedCases are the cases by name.
func TestValidateMigrationPolicyKeyedCases(t *testing.T) {
	db := map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": "db"}}
	dbMatchLabels := map[string]any{"virtualMachineInstanceSelector": map[string]any{"matchLabels": map[string]any{"app": "db"}}}
	malformed := map[string]any{"virtualMachineInstanceSelector": map[string]any{"matchExpressions": []any{}}}
	cases := []struct {
		name   string
		policy *unstructured.Unstructured
		others []*unstructured.Unstructured
		// same is the number of same-selectors violations in the default precedence (none in
		// the kubevirt one).
		same int
	}{
		{"duplicate across shapes", validationPolicy("new", dbMatchLabels),
			[]*unstructured.Unstructured{validationPolicy("old", db), validationPolicy("x", nil)}, 1},
		{"two duplicates", validationPolicy("new", db),
			[]*unstructured.Unstructured{validationPolicy("b", db), validationPolicy("a", dbMatchLabels)}, 2},
		{"malformed others", validationPolicy("new", db),
			[]*unstructured.Unstructured{validationPolicy("m", malformed), validationPolicy("s", "not an object")}, 0},
		{"malformed policy", validationPolicy("new", malformed),
			[]*unstructured.Unstructured{validationPolicy("m", malformed)}, 0},
		{"own old version", validationPolicy("same", dbMatchLabels),
			[]*unstructured.Unstructured{validationPolicy("same", db)}, 0},
		{"own old version and a duplicate", validationPolicy("same", dbMatchLabels),
			[]*unstructured.Unstructured{validationPolicy("same", db), validationPolicy("other", db)}, 1},
		{"without spec.selectors", validationPolicy("new", nil),
			[]*unstructured.Unstructured{validationPolicy("a", nil), validationPolicy("b", "null")}, 0},
		{"empty selectors", validationPolicy("new", map[string]any{}),
			[]*unstructured.Unstructured{validationPolicy("a", nil), validationPolicy("b", map[string]any{"namespaceSelector": map[string]any{}})}, 1},
	}
	for _, mode := range []reference.Mode{reference.ModeDefault, reference.ModeKubeVirt} {
		t.Run(string(mode), func(t *testing.T) {
			keyed, _ := precedenceEngine(t, mode)
			unkeyed := unkeyedEngine(t, mode)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					want := tc.same
					if mode == reference.ModeKubeVirt {
						want = 0
					}
					if got := validateBoth(t, keyed, unkeyed, tc.policy, keyed.ExistingMigrationPolicies(tc.others), tc.others); got != want {
						t.Errorf("%d same-selectors violations, want %d", got, want)
					}
				})
			}
		})
	}
}

// stored gives p the UID and resourceVersion of a stored object, whose keys the engine
// remembers between calls.
func stored(p *unstructured.Unstructured, uid, rv string) *unstructured.Unstructured {
	p.SetUID(types.UID(uid))
	p.SetResourceVersion(rv)
	return p
}

// TestValidateMigrationPolicyRemembersStoredKeys validates as the webhook does, listing the
// policies anew for each admission: a policy changed or created since counts, and a bundle
// change is seen.
func TestValidateMigrationPolicyRemembersStoredKeys(t *testing.T) {
	ctx := context.Background()
	eng, _ := precedenceEngine(t, reference.ModeDefault)
	db := map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": "db"}}
	web := map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": "web"}}
	same := func(list []*unstructured.Unstructured, policy *unstructured.Unstructured) []string {
		t.Helper()
		violations, err := eng.ValidateMigrationPolicy(ctx, policy, list)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, v := range violations {
			names = append(names, v.Message)
		}
		return names
	}
	others := make([]*unstructured.Unstructured, 50)
	for i := range others {
		others[i] = stored(validationPolicy(fmt.Sprintf("p%d", i), map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": fmt.Sprint(i)}}), fmt.Sprint("uid-", i), "1")
	}
	list := append(others, stored(validationPolicy("x", db), "uid-x", "1"))
	if got := same(list, validationPolicy("new", db)); len(got) != 1 || !strings.Contains(got[0], `"x"`) {
		t.Fatalf("first admission: %v, want x's selectors", got)
	}
	// x changed its selectors (a new resourceVersion): no longer the same.
	list = append(others, stored(validationPolicy("x", web), "uid-x", "2"))
	if got := same(list, validationPolicy("new", db)); len(got) != 0 {
		t.Fatalf("after x changed: %v, want none", got)
	}
	if got := same(list, validationPolicy("new", web)); len(got) != 1 {
		t.Fatalf("after x changed: %v, want x's new selectors", got)
	}
	// A policy created a moment ago counts.
	list = append(list, stored(validationPolicy("y", db), "uid-y", "3"))
	if got := same(list, validationPolicy("new", db)); len(got) != 1 || !strings.Contains(got[0], `"y"`) {
		t.Fatalf("after y was created: %v, want y's selectors", got)
	}
	// A new bundle (the kubevirt precedence, where the check is off) is not answered with the
	// keys of the old one.
	raw, err := fs.ReadFile(virtrego.Bundle(), policyDataPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.LoadPath(ctx, bundleDir(t, func(dir string) { setPrecedence(t, dir, raw, reference.ModeKubeVirt) })); err != nil {
		t.Fatal(err)
	}
	if got := same(list, validationPolicy("new", db)); len(got) != 0 {
		t.Fatalf("kubevirt precedence: %v, want none", got)
	}
}

// TestMigrationPolicyComparisonKey: a webhook serialises only the admissions of one comparison
// key, so two policies either of which the validation finds a duplicate of the other must
// share their key; a bundle without selector_keys puts every policy under one key.
func TestMigrationPolicyComparisonKey(t *testing.T) {
	ctx := context.Background()
	keyed, _ := precedenceEngine(t, reference.ModeDefault)
	unkeyed := unkeyedEngine(t, reference.ModeDefault)
	r := rand.New(rand.NewPCG(17, 1))
	pairs := 0
	for range 300 {
		p, q := randomValidationPolicy(r), randomValidationPolicy(r)
		violations, err := unkeyed.ValidateMigrationPolicy(ctx, p, []*unstructured.Unstructured{q})
		if err != nil {
			t.Fatal(err)
		}
		pk, err := keyed.MigrationPolicyComparisonKey(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		qk, err := keyed.MigrationPolicyComparisonKey(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range violations {
			if strings.HasPrefix(v.Message, "same selectors as") {
				pairs++
				if !pk.Compared || !qk.Compared || pk.Key != qk.Key {
					t.Fatalf("%v duplicates %v, keys %q (%v) and %q (%v)", p.Object, q.Object, pk.Key, pk.Compared, qk.Key, qk.Compared)
				}
			}
		}
		if k, err := unkeyed.MigrationPolicyComparisonKey(ctx, p); err != nil || !k.Compared || k.Key != "" {
			t.Fatalf("without selector_keys: key %q, compared %v, error %v; want \"\", true", k.Key, k.Compared, err)
		}
	}
	if pairs < 20 {
		t.Errorf("only %d duplicate pairs drawn: the draws do not exercise the keys", pairs)
	}
}
