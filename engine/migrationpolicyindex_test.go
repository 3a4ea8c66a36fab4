package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/engine/enginetest"
	"github.com/virt-rules/virt-rules/test/reference"
)

// TestMigrationPolicyIndex changes an index one policy at a time (creates, updates, deletes)
// and after each change validates a policy against the index's policies of its key, with their
// keys and its own as asked, as the webhook does: the answer must be the one against every
// policy held, on an engine with and one without selector_keys (which puts every policy under
// one key), and the validation must evaluate no key again.
func TestMigrationPolicyIndex(t *testing.T) {
	ctx := context.Background()
	counted := &enginetest.Evaluations{}
	for _, tc := range []struct {
		name string
		eng  *engine.Engine
	}{
		{"keyed", func() *engine.Engine {
			e, _ := precedenceEngine(t, reference.ModeDefault, engine.WithDecisionLogger(counted))
			return e
		}()},
		{"unkeyed", unkeyedEngine(t, reference.ModeDefault, engine.WithDecisionLogger(counted))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := tc.eng
			index := eng.NewMigrationPolicyIndex()
			held := map[string]*unstructured.Unstructured{}
			r := rand.New(rand.NewPCG(23, 5))
			named := func(name string) *unstructured.Unstructured {
				p := randomValidationPolicy(r)
				p.SetName(name)
				return p
			}
			duplicates := 0
			for step := range 400 {
				name := fmt.Sprintf("p-%d", r.IntN(40))
				if _, ok := held[name]; ok && r.IntN(4) == 0 {
					index.Delete(name)
					delete(held, name)
				} else {
					p := named(name)
					index.Upsert(p)
					held[name] = p
				}
				if got := index.Len(); got != len(held) {
					t.Fatalf("step %d: index holds %d, want %d", step, got, len(held))
				}
				// A new policy, or an update of a held one (its old version then ignored).
				candidate := named(fmt.Sprintf("p-%d", r.IntN(60)))
				key, err := eng.MigrationPolicyComparisonKey(ctx, candidate)
				if err != nil {
					t.Fatal(err)
				}
				var same []engine.KeyedMigrationPolicy
				if key.Compared {
					if same, err = index.SameKey(ctx, key.Key); err != nil {
						t.Fatal(err)
					}
				}
				// As the webhook validates: with the key it asked and the keys the index holds,
				// neither evaluated again.
				counted.Take()
				got, err := eng.ValidateMigrationPolicyAdmission(ctx, engine.MigrationPolicyAdmission{Policy: candidate, Key: key}, engine.NewKeyedMigrationPolicies(same))
				if err != nil {
					t.Fatal(err)
				}
				if n := counted.Take()[selectorKeysEntry]; n != 0 {
					t.Fatalf("step %d: the validation evaluated %s %d times, want none", step, selectorKeysEntry, n)
				}
				all := make([]*unstructured.Unstructured, 0, len(held))
				for _, p := range held {
					all = append(all, p)
				}
				want, err := eng.ValidateMigrationPolicy(ctx, candidate, all)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d: %v against the %d of its key (of %d):\n got  %v\n want %v", step, candidate.Object, len(same), len(all), got, want)
				}
				for _, v := range got {
					if v.Field == "spec.selectors" {
						duplicates++
					}
				}
			}
			if duplicates < 20 {
				t.Errorf("only %d selector violations: the draws do not exercise the comparison", duplicates)
			}
		})
	}
}

// selectorKeysEntry is the entrypoint name the decision log gives the selector keys'
// evaluations.
const selectorKeysEntry = "migration.policy.validation.selector_keys"
