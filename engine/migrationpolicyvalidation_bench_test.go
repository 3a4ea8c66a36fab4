package engine_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/test/reference"
)

// BenchmarkValidateMigrationPolicy measures one admission of a MigrationPolicy against n
// existing ones, half the candidates with the selectors of an existing policy:
//
//   - admission: the engine against a prepared set (ValidateMigrationPolicyIn), as `eval`
//     validates every policy; the Go side scans the converted policies for equal selectors.
//   - webhook: the engine given the policies as listed anew for each admission (stored
//     objects, whose selector keys the engine remembers from the call before); the Go side
//     the same scan.
//
// The Go side does only the same-selectors scan (there is no Go reference for the rest of the
// validation), so the ratio overstates the engine's cost; the point is that neither grows
// with n.
func BenchmarkValidateMigrationPolicy(b *testing.B) {
	ctx := context.Background()
	eng, settings := benchEngine(b)
	for _, n := range []int{100, 1_000, 10_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 2))
			existing, _ := sparsePolicies(r, n)
			for i, p := range existing {
				stored(p, fmt.Sprintf("uid-%d-%d", n, i), "1") // UIDs are unique per object
			}
			candidates := validationCandidates(r, existing, 64)
			policies, err := reference.PoliciesFromUnstructured(existing, settings.PolicyFields)
			if err != nil {
				b.Fatal(err)
			}
			prepared := eng.ExistingMigrationPolicies(existing)
			duplicates := 0
			for _, c := range candidates {
				violations, err := eng.ValidateMigrationPolicyIn(ctx, c, prepared)
				if err != nil {
					b.Fatal(err)
				}
				if got, want := len(violations), len(sameSelectors(b, policies, c, settings)); got != want {
					b.Fatalf("%s: %d violations, the scan finds %d duplicates", c.GetName(), got, want)
				}
				duplicates += len(violations)
			}
			if duplicates == 0 {
				b.Fatal("no candidate duplicates an existing policy")
			}
			scan := func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					sameSelectors(b, policies, candidates[i%len(candidates)], settings)
				}
			}
			b.Run("admission", func(b *testing.B) {
				b.Run("rego", func(b *testing.B) {
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						if _, err := eng.ValidateMigrationPolicyIn(ctx, candidates[i%len(candidates)], prepared); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.Run("go", scan)
			})
			b.Run("webhook", func(b *testing.B) {
				b.Run("rego", func(b *testing.B) {
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						listed := append([]*unstructured.Unstructured(nil), existing...)
						if _, err := eng.ValidateMigrationPolicy(ctx, candidates[i%len(candidates)], listed); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.Run("go", scan)
			})
		})
	}
}

// BenchmarkValidateMigrationPolicyPrepare measures the preparation of n existing policies no
// call has seen before (offline manifests, no UID), once per set: the engine computing every
// selector key, the Go side converting the policies.
func BenchmarkValidateMigrationPolicyPrepare(b *testing.B) {
	ctx := context.Background()
	eng, settings := benchEngine(b)
	for _, n := range []int{100, 1_000, 10_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			existing, _ := sparsePolicies(rand.New(rand.NewPCG(uint64(n), 2)), n)
			candidate := validationPolicy("candidate", nil)
			b.Run("rego", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := eng.ValidateMigrationPolicy(ctx, candidate, existing); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("go", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := reference.PoliciesFromUnstructured(existing, settings.PolicyFields); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// validationCandidates are k new policies: every other one with the selectors of a random
// existing policy (in the other shape), the rest with selectors no policy has.
func validationCandidates(r *rand.Rand, existing []*unstructured.Unstructured, k int) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, k)
	for i := range out {
		name := fmt.Sprintf("candidate-%d", i)
		if i%2 == 0 {
			selectors, _, _ := unstructured.NestedMap(existing[r.IntN(len(existing))].Object, "spec", "selectors")
			plain := map[string]any{}
			for field, selector := range selectors {
				if m, ok := selector.(map[string]any)["matchLabels"]; ok {
					plain[field] = m
				}
			}
			out[i] = validationPolicy(name, plain)
		} else {
			out[i] = validationPolicy(name, map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": name}})
		}
	}
	return out
}

// sameSelectors is the native same-selectors check: the existing policies with spec.selectors
// whose requirements equal the candidate's.
func sameSelectors(tb testing.TB, policies []reference.Policy, candidate *unstructured.Unstructured, settings reference.Settings) []string {
	converted, err := reference.PoliciesFromUnstructured([]*unstructured.Unstructured{candidate}, settings.PolicyFields)
	if err != nil {
		tb.Fatal(err)
	}
	c := converted[0]
	var names []string
	for i := range policies {
		p := &policies[i]
		if !p.NoSelectors && !c.NoSelectors && p.Name != c.Name && maps.Equal(p.VMI, c.VMI) && maps.Equal(p.Namespace, c.Namespace) {
			names = append(names, p.Name)
		}
	}
	return names
}
