package migrationpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/engine/enginetest"
)

// emptyCache is a cache that holds no object: no KubeVirt CR.
type emptyCache struct{ client.Reader }

func (emptyCache) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// emptyIndex holds no stored policy: every admission's policies are the ones the webhook
// admitted itself.
func emptyIndex(t testing.TB) *PolicyIndex {
	t.Helper()
	eng, err := engine.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &PolicyIndex{index: eng.NewMigrationPolicyIndex(), synced: func() bool { return true }}
}

// slowValidator keys each policy by its "key" label and takes a while to validate, counting the
// admissions of each key in flight at once. A policy is invalid when another of its key exists.
type slowValidator struct {
	mu                 sync.Mutex
	inFlight           map[string]int
	sameKeyOverlap     bool
	maxInFlight, total int
}

func (v *slowValidator) MigrationPolicyComparisonKey(_ context.Context, p *unstructured.Unstructured) (engine.MigrationPolicyComparisonKey, error) {
	return engine.MigrationPolicyComparisonKey{Key: p.GetLabels()["key"], Compared: true}, nil
}

func (v *slowValidator) ValidateMigrationPolicyAdmission(_ context.Context, a engine.MigrationPolicyAdmission, existing *engine.ExistingMigrationPolicies) ([]engine.Violation, error) {
	key := a.Policy.GetLabels()["key"]
	v.mu.Lock()
	v.inFlight[key]++
	v.total++
	if v.inFlight[key] > 1 {
		v.sameKeyOverlap = true
	}
	v.maxInFlight = max(v.maxInFlight, v.total)
	v.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	v.mu.Lock()
	v.inFlight[key]--
	v.total--
	v.mu.Unlock()
	for _, p := range existing.Policies() {
		if p.GetLabels()["key"] == key {
			return []engine.Violation{{Field: "spec.selectors", Message: "same key as " + p.GetName()}}, nil
		}
	}
	return nil, nil
}

// createRequest is the admission of a new policy named name, labelled and selecting key=<key>.
func createRequest(t testing.TB, name, key string) admission.Request {
	t.Helper()
	p := &unstructured.Unstructured{}
	p.SetGroupVersionKind(GVKMigrationPolicy)
	p.SetName(name)
	p.SetLabels(map[string]string{"key": key})
	p.Object["spec"] = map[string]any{"selectors": map[string]any{"virtualMachineInstanceSelector": map[string]any{"key": key}}}
	raw, err := json.Marshal(p.Object)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Name: name, Object: runtime.RawExtension{Raw: raw},
	}}
}

// TestValidatingWebhookSerialisesPerKey: admissions of one comparison key run one at a time,
// each seeing the ones admitted before it (one of them is admitted); those of different keys
// run side by side.
func TestValidatingWebhookSerialisesPerKey(t *testing.T) {
	v := &slowValidator{inFlight: map[string]int{}}
	w := &ValidatingWebhook{Client: emptyCache{}, Policies: emptyIndex(t), Engine: v}
	const perKey, keys = 4, 4
	allowed := make([]bool, perKey*keys)
	var wg sync.WaitGroup
	for k := range keys {
		for i := range perKey {
			wg.Go(func() {
				req := createRequest(t, fmt.Sprintf("p-%d-%d", k, i), fmt.Sprintf("key-%d", k))
				allowed[k*perKey+i] = w.Handle(context.Background(), req).Allowed
			})
		}
	}
	wg.Wait()
	if v.sameKeyOverlap {
		t.Error("two admissions of the same key ran at once")
	}
	if v.maxInFlight < 2 {
		t.Errorf("admissions of different keys never ran side by side (at most %d at once)", v.maxInFlight)
	}
	for k := range keys {
		n := 0
		for i := range perKey {
			if allowed[k*perKey+i] {
				n++
			}
		}
		if n != 1 {
			t.Errorf("key-%d: %d of %d policies admitted, want 1", k, n, perKey)
		}
	}
}

// TestValidatingWebhookKeysOnce: an admission evaluates the admitted policy's selector key once
// and the validation once, whether its key's bucket of stored policies is empty or not: the
// validation reuses the key the webhook locked on and the keys the index holds.
func TestValidatingWebhookKeysOnce(t *testing.T) {
	ctx := context.Background()
	counted := &enginetest.Evaluations{}
	eng, err := engine.New(ctx, engine.WithDecisionLogger(counted))
	if err != nil {
		t.Fatal(err)
	}
	index := eng.NewMigrationPolicyIndex()
	for i := range 20 {
		req := createRequest(t, fmt.Sprintf("stored-%d", i), fmt.Sprintf("k-%d", i))
		p := &unstructured.Unstructured{}
		if err := json.Unmarshal(req.Object.Raw, &p.Object); err != nil {
			t.Fatal(err)
		}
		p.SetUID(types.UID(fmt.Sprintf("uid-%d", i)))
		p.SetResourceVersion("1")
		index.Upsert(p)
	}
	w := &ValidatingWebhook{Client: emptyCache{}, Engine: eng, Policies: &PolicyIndex{index: index, synced: func() bool { return true }}}
	// The first admission keys the stored policies, in one evaluation.
	if resp := w.Handle(ctx, createRequest(t, "first", "k-first")); !resp.Allowed {
		t.Fatalf("first: refused: %v", resp.Result)
	}
	if got := counted.Take(); got[selectorKeys] != 2 || got[validation] != 1 {
		t.Errorf("first admission: %v, want 2 %s (the admitted policy, the index) and 1 %s", got, selectorKeys, validation)
	}
	for _, tc := range []struct {
		name, key string
		allowed   bool
	}{
		{"fresh", "k-fresh", true},     // no stored policy of its key
		{"duplicate", "k-3", false},    // stored-3 has its selectors
		{"duplicate-2", "k-17", false}, // stored-17 has its selectors
	} {
		resp := w.Handle(ctx, createRequest(t, tc.name, tc.key))
		if resp.Allowed != tc.allowed {
			t.Errorf("%s: allowed %v, want %v (%v)", tc.name, resp.Allowed, tc.allowed, resp.Result)
		}
		if got := counted.Take(); got[selectorKeys] != 1 || got[validation] != 1 || len(got) != 2 {
			t.Errorf("%s: evaluations %v, want 1 %s and 1 %s", tc.name, got, selectorKeys, validation)
		}
	}
	// "fresh" is admitted but not in the index (the cache behind): pending, it is compared,
	// its key evaluated again in case the bundle changed since its admission.
	if resp := w.Handle(ctx, createRequest(t, "fresh-again", "k-fresh")); resp.Allowed {
		t.Errorf("fresh-again: allowed beside the pending fresh of the same selectors")
	}
	if got := counted.Take(); got[selectorKeys] != 2 || got[validation] != 1 || len(got) != 2 {
		t.Errorf("fresh-again: evaluations %v, want 2 %s (its own, the pending policy's) and 1 %s", got, selectorKeys, validation)
	}
}

// The entrypoint names the decision log gives the validation's evaluations.
const (
	selectorKeys = "migration.policy.validation.selector_keys"
	validation   = "migration.policy.validation"
)
