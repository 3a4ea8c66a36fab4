package eval_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

func ptr(s string) *string { return &s }

// Compare reports each object whose decision differs, names the fields, ignores explanations,
// and reports an object only one side decides for with every field.
func TestCompare(t *testing.T) {
	base := &eval.Report{
		MigrationPolicies: []eval.MigrationPolicyResult{{VMI: "a/x", Policy: ptr("p1"), MatchingLabels: 2}, {VMI: "a/y", Policy: ptr("p1")}},
		NodeMigratability: []eval.NodeMigratabilityResult{{Node: "n1", Level: 50}, {Node: "n2", Level: 100}},
	}
	next := &eval.Report{
		MigrationPolicies: []eval.MigrationPolicyResult{{VMI: "a/x", Policy: ptr("p2"), MatchingLabels: 2}, {VMI: "a/y", Policy: ptr("p1"),
			Explanation: &engine.MigrationPolicyExplanation{Precedence: "kubevirt"}}},
		NodeMigratability: []eval.NodeMigratabilityResult{{Node: "n1", Level: 50}, {Node: "n3", Level: 0}},
	}
	changes, err := eval.Compare(base, next)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.Decision+" "+c.Object+" "+strings.Join(c.Fields, ",")+" "+string(c.Base)+" "+string(c.New))
	}
	want := []string{
		`migrationPolicies a/x policy {"configuration":{},"matchingLabels":2,"policy":"p1","vmi":"a/x"} {"configuration":{},"matchingLabels":2,"policy":"p2","vmi":"a/x"}`,
		`nodeMigratability n2 level,node {"level":100,"node":"n2"} null`,
		`nodeMigratability n3 level,node null {"level":0,"node":"n3"}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if same, err := eval.Compare(base, base); err != nil || len(same) != 0 {
		t.Errorf("a report against itself: %v, %v", same, err)
	}
}

// Drift compares what the objects store with the decisions: absent and stale values drift,
// values the controllers would write do not.
func TestDrift(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const stream = `apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: p}
spec: {selectors: {virtualMachineInstanceSelector: {a: b}}}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: fresh, namespace: ns, labels: {a: b}, annotations: {migrations.virt-rules.io/policy: p}}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: stale, namespace: ns, labels: {a: b}, annotations: {migrations.virt-rules.io/policy: old}}
status: {migrationState: {migrationPolicyName: old, completed: true}}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns}
`
	objs, err := manifest.Parse("in.yaml", strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	r, err := eval.Run(ctx, eng, objs, eval.Options{Drift: true})
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, d := range r.Drift {
		stored, _ := json.Marshal(d.Stored)
		decided, _ := json.Marshal(d.Decided)
		fields[d.Object+" "+d.Field] = string(stored) + " -> " + string(decided)
	}
	for key, want := range map[string]string{
		"ns/stale metadata.annotations.migrations.virt-rules.io/policy": `"old" -> "p"`,
		"ns/stale status.migrationState.migrationPolicyName":            `"old" -> "p"`,
	} {
		if fields[key] != want {
			t.Errorf("%s: %q, want %q (all: %v)", key, fields[key], want, fields)
		}
	}
	if _, ok := fields["ns/fresh metadata.annotations.migrations.virt-rules.io/policy"]; ok {
		t.Errorf("a policy annotation equal to the decision drifts: %v", fields)
	}
	if got := fields["ns/fresh metadata.annotations.migrations.virt-rules.io/configuration"]; !strings.HasPrefix(got, "null -> {") {
		t.Errorf("an absent configuration annotation: %q, want null -> the configuration", got)
	}
	if plain, err := eval.Run(ctx, eng, objs, eval.Options{}); err != nil || plain.Drift != nil {
		t.Errorf("without Options.Drift: %v, %v", plain.Drift, err)
	}
}

// CompareAnswers names the fields of two answers that differ, explanations aside, carries both
// sides, says nothing of answers alike, and refuses an answer that is no JSON object.
func TestCompareAnswers(t *testing.T) {
	type answer struct {
		Allowed     bool     `json:"allowed"`
		Violations  []string `json:"violations,omitempty"`
		Explanation string   `json:"explanation,omitempty"`
	}
	for _, tc := range []struct {
		name       string
		base, next any
		fields     []string
	}{
		{"alike", answer{Allowed: true}, answer{Allowed: true, Violations: []string{}}, nil},
		{"explanations aside", answer{Allowed: true, Explanation: "a"}, answer{Allowed: true, Explanation: "b"}, nil},
		{"refused", answer{Allowed: true}, answer{Violations: []string{"spec: bad"}}, []string{"allowed", "violations"}},
		{"no answer", answer{Allowed: true}, nil, []string{"allowed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := eval.CompareAnswers("d", "ns/o", tc.base, tc.next)
			if err != nil {
				t.Fatal(err)
			}
			if tc.fields == nil {
				if c != nil {
					t.Fatalf("change %+v, want none", c)
				}
				return
			}
			if c == nil || strings.Join(c.Fields, ",") != strings.Join(tc.fields, ",") || c.Decision != "d" || c.Object != "ns/o" {
				t.Fatalf("change %+v, want fields %v of d ns/o", c, tc.fields)
			}
			want, _ := json.Marshal(tc.next)
			if string(c.New) != string(want) {
				t.Errorf("new side %s, want %s", c.New, want)
			}
		})
	}
	if _, err := eval.CompareAnswers("d", "o", []string{"x"}, answer{}); err == nil {
		t.Error("a list compared as an answer")
	}
}
