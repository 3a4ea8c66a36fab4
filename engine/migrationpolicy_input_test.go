package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
)

func migrationPolicy(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "migrations.kubevirt.io/v1alpha1", "kind": "MigrationPolicy",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

// Two policies of one name (a cluster has one; manifests or a careless caller may give two)
// are an error naming the policy and both places, not a Rego eval_conflict_error.
func TestMigrationPoliciesOfOneNameAreAnError(t *testing.T) {
	eng, err := engine.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	selects := func(k, v string) map[string]any {
		return map[string]any{"selectors": map[string]any{"virtualMachineInstanceSelector": map[string]any{k: v}}}
	}
	policies := []*unstructured.Unstructured{migrationPolicy("p", selects("a", "b")), migrationPolicy("q", selects("a", "b")), migrationPolicy("p", selects("c", "d"))}
	_, err = eng.MigrationPolicies(policies, nil)
	if !errors.Is(err, engine.ErrMalformedInput) || !strings.Contains(err.Error(), `MigrationPolicy "p" given twice (policies 0 and 2)`) {
		t.Fatalf("error %v: want ErrMalformedInput naming p at 0 and 2", err)
	}
	if _, err := eng.MigrationPolicies(policies[:2], nil); err != nil {
		t.Fatalf("distinct names: %v", err)
	}
}

// A value KubeVirt's MigrationPolicySpec cannot hold as given is a violation naming its field:
// a quantity beyond int64 (resource.Quantity would silently read 2^63-1 bytes) or a number
// beyond its Go type.
func TestValidateMigrationPolicyValuesBeyondTheirType(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		value any
		want  string // the violation's message; "" for none on field
	}{
		{"bandwidthPerMigration", "8Ei", `"8Ei" is beyond int64: KubeVirt would read 9223372036854775807`},
		{"bandwidthPerMigration", "99999999999999999999999Ei", `is beyond int64`},
		{"bandwidthPerMigration", 1e30, `1e+30 is beyond int64`},
		{"bandwidthPerMigration", "7Ei", ""},
		{"bandwidthPerMigration", "9223372036854775807", ""},
		{"bandwidthPerMigration", int64(9223372036854775807), ""},
		{"completionTimeoutPerGiB", 1e23, "want int64, got a number 1e+23"},
		{"completionTimeoutPerGiB", int64(800), ""},
	} {
		spec := map[string]any{"selectors": map[string]any{"virtualMachineInstanceSelector": map[string]any{"matchLabels": map[string]any{"a": "b"}}}, tc.field: tc.value}
		violations, err := eng.ValidateMigrationPolicy(ctx, migrationPolicy("p", spec), nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, v := range violations {
			if v.Field == "spec."+tc.field {
				got = append(got, v.Message)
			}
		}
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%s %v: violations %q, want none", tc.field, tc.value, got)
		case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
			t.Errorf("%s %v: violations %q, want one with %q", tc.field, tc.value, got, tc.want)
		}
		if tc.want == "" && len(violations) > 0 {
			t.Errorf("%s %v: violations %v, want none", tc.field, tc.value, violations)
		}
	}
}
