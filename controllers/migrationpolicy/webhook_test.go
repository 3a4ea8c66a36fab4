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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/engine"
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

func (v *slowValidator) MigrationPolicyComparisonKey(_ context.Context, p *unstructured.Unstructured) (string, bool, error) {
	return p.GetLabels()["key"], true, nil
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
