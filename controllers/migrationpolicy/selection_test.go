package migrationpolicy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
)

func policyWith(spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "migrations.kubevirt.io/v1alpha1", "kind": "MigrationPolicy",
		"metadata": map[string]any{"name": "p"}, "spec": spec,
	}}
}

func selectors(vmi, namespace any) map[string]any {
	return map[string]any{"selectors": map[string]any{"virtualMachineInstanceSelector": vmi, "namespaceSelector": namespace}}
}

func TestSelection(t *testing.T) {
	web := map[string]string{"app": "web"}
	prod := map[string]string{"env": "prod"}
	for _, tc := range []struct {
		name      string
		spec      map[string]any
		vmi       map[string]string
		namespace map[string]string // nil: unknown namespace
		want      bool
	}{
		{"no selectors", map[string]any{}, web, prod, false},
		{"null selectors", map[string]any{"selectors": nil}, web, prod, false},
		{"empty selectors select all", map[string]any{"selectors": map[string]any{}}, web, prod, true},
		{"plain map, matching", selectors(map[string]any{"app": "web"}, nil), web, prod, true},
		{"plain map, other value", selectors(map[string]any{"app": "db"}, nil), web, prod, false},
		{"plain map, missing key", selectors(map[string]any{"tier": "x"}, nil), web, prod, false},
		{"matchLabels, matching", selectors(map[string]any{"matchLabels": map[string]any{"app": "web"}}, nil), web, prod, true},
		{"matchLabels, other value", selectors(map[string]any{"matchLabels": map[string]any{"app": "db"}}, nil), web, prod, false},
		{"empty value: any value", selectors(map[string]any{"app": ""}, nil), web, prod, true},
		{"empty value: key required", selectors(map[string]any{"tier": ""}, nil), web, prod, false},
		{"namespace matching", selectors(nil, map[string]any{"env": "prod"}), web, prod, true},
		{"namespace other value", selectors(nil, map[string]any{"env": "dev"}), web, prod, false},
		{"namespace unknown", selectors(nil, map[string]any{"env": "prod"}), web, nil, false},
		{"namespace name label derived", selectors(nil, map[string]any{labelNamespaceName: "ns"}), web, nil, true},
		{"namespace name label other", selectors(nil, map[string]any{labelNamespaceName: "other"}), web, prod, false},
		{"both scopes", selectors(map[string]any{"app": "web"}, map[string]any{"matchLabels": map[string]any{"env": "prod"}}), web, prod, true},
		{"unlabelled VMI always", selectors(map[string]any{"app": "db"}, nil), nil, prod, true},
		{"unlabelled VMI, no selectors", map[string]any{}, nil, prod, false},
		{"matchExpressions: all", selectors(map[string]any{"matchExpressions": []any{}}, nil), web, prod, true},
		{"non-string value: all", selectors(map[string]any{"app": int64(1)}, nil), web, prod, true},
		{"matchLabels beside others: all", selectors(map[string]any{"matchLabels": map[string]any{}, "x": "y"}, nil), web, prod, true},
		{"selector not a map: all", selectors("app=web", nil), web, prod, true},
		{"selectors not a map: all", map[string]any{"selectors": "x"}, web, prod, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sel := selectionOf(policyWith(tc.spec))
			if got := sel.selects(tc.vmi, "ns", tc.namespace); got != tc.want {
				t.Errorf("selects = %v, want %v (selection %+v)", got, tc.want, sel)
			}
		})
	}
}

func TestSelectionNeedsNamespaces(t *testing.T) {
	if selectionOf(policyWith(selectors(map[string]any{"app": "web"}, nil))).needsNamespaces() {
		t.Error("a policy without namespace requirements needs no namespaces")
	}
	if !selectionOf(policyWith(selectors(nil, map[string]any{"env": "prod"}))).needsNamespaces() {
		t.Error("a policy with namespace requirements needs namespaces")
	}
}

// TestSelectionCoversEngineMatches checks the selection against the shipped rules: every
// policy the engine says a VMI matches selects that VMI, on random policies and VMIs drawn
// from few label keys and values (empty values included), so matches are frequent.
func TestSelectionCoversEngineMatches(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(17, 1))
	value := func() string { return []string{"", "a", "b"}[r.IntN(3)] }
	labels := func(keys []string, most int) map[string]string {
		out := map[string]string{}
		for range r.IntN(most + 1) {
			out[keys[r.IntN(len(keys))]] = value()
		}
		return out
	}
	anyMap := func(m map[string]string) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	vmiKeys, nsKeys := []string{"app", "tier", "os"}, []string{"env", "team", labelNamespaceName}
	policies := make([]*unstructured.Unstructured, 60)
	for i := range policies {
		var vmi, ns any = anyMap(labels(vmiKeys, 2)), anyMap(labels(nsKeys, 2))
		if r.IntN(2) == 0 {
			vmi = map[string]any{"matchLabels": vmi}
		}
		p := policyWith(selectors(vmi, ns))
		p.SetName(fmt.Sprintf("p-%02d", i))
		policies[i] = p
	}
	set, err := eng.MigrationPolicies(policies, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*unstructured.Unstructured{}
	for _, p := range policies {
		byName[p.GetName()] = p
	}
	matches := 0
	for i := range 200 {
		namespace := []string{"ns-a", "ns-b"}[r.IntN(2)]
		s := engine.MigrationPolicySubject{Namespace: namespace, Name: fmt.Sprintf("vmi-%d", i), Labels: labels(vmiKeys, 3)}
		if r.IntN(4) > 0 {
			s.NamespaceLabels = labels(nsKeys[:2], 2)
		}
		x, err := set.Explain(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range x.Candidates {
			if !c.Matched {
				continue
			}
			matches++
			if !selectionOf(byName[c.Policy]).selects(s.Labels, s.Namespace, s.NamespaceLabels) {
				t.Errorf("policy %s matches VMI %s (labels %v, namespace labels %v) but does not select it",
					c.Policy, s.Key(), s.Labels, s.NamespaceLabels)
			}
		}
	}
	if matches < 100 {
		t.Fatalf("only %d matches: the test exercises too little", matches)
	}
}
