package migrationpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// ValidatingWebhookPath serves the admission review of MigrationPolicies.
const ValidatingWebhookPath = "/validate-migrations-kubevirt-io-v1alpha1-migrationpolicy"

// ValidatingWebhook rejects MigrationPolicies the bundle's validation decision finds invalid
// (two policies with the same selectors, malformed selectors or label syntax, negative
// values, KubeVirt's ranges, maxDowntimeMs or a stall detector set or changed without the
// KubeVirt CR's MigrationStallDetection feature gate), with the decision's messages; the
// decision gets an UPDATE's old version and the cluster's KubeVirt CR. An UPDATE that leaves
// the spec as it was (labels, annotations: the status controller's among them) is admitted:
// it makes nothing invalid, and a policy stored invalid before virt-rules ran must still be
// annotated and relabelled. The policies compared are the stored ones of the admitted
// policy's selector key (Policies, fed by the manager's informer), with those this webhook
// admitted that the informer does not show yet (admitted.go): neither the Rego nor the Go
// work per admission grows with the number of policies. Client is the manager's cache, for the
// KubeVirt CR.
type ValidatingWebhook struct {
	Client client.Reader
	Engine AdmissionValidator
	// Shadow, when set, is asked each answer again with the candidate bundle, in the
	// background and never acted on.
	Shadow *shadow.Shadow

	// Policies holds the stored policies by selector key: an admission reads those of its own
	// key (WatchPolicies).
	Policies *PolicyIndex

	admitted admittedPolicies
}

var _ admission.Handler = &ValidatingWebhook{}

// AdmissionValidator is what the webhook needs of the engine: the validation, and which
// policies a policy is compared with (admissions of different keys run side by side). The
// validation is handed the key asked and the stored policies' keys, and evaluates neither again.
type AdmissionValidator interface {
	Validator
	MigrationPolicyComparisonKey(ctx context.Context, policy *unstructured.Unstructured) (engine.MigrationPolicyComparisonKey, error)
}

// Handle validates one CREATE or UPDATE of a MigrationPolicy.
func (w *ValidatingWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	policy, resp := kinds.Admitted(req, kinds.MigrationPolicy)
	if resp != nil {
		return *resp
	}
	a := engine.MigrationPolicyAdmission{Policy: policy}
	if req.Operation == admissionv1.Update {
		a.Old = &unstructured.Unstructured{}
		if err := json.Unmarshal(req.OldObject.Raw, &a.Old.Object); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode the MigrationPolicy before the update: %w", err))
		}
		if equality.Semantic.DeepEqual(a.Old.Object["spec"], policy.Object["spec"]) {
			return admission.Allowed("spec unchanged")
		}
	}
	kubevirt, err := kinds.ReadClusterKubeVirt(ctx, w.Client)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	a.KubeVirt = kubevirt
	// One admission at a time per comparison key: a policy admitted a moment ago counts for
	// the next one it could conflict with. The cache is read with the lock held.
	key, err := w.Engine.MigrationPolicyComparisonKey(ctx, policy)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	a.Key = key
	var cached []engine.KeyedMigrationPolicy
	if key.Compared {
		defer w.admitted.lockKey(key.Key)()
		if cached, err = w.Policies.SameKey(ctx, key.Key); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	others := keyedOthers(policy, w.admitted.merge(policiesOf(cached), key.Key), cached)
	violations, err := w.Engine.ValidateMigrationPolicyAdmission(ctx, a, engine.NewKeyedMigrationPolicies(others))
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if w.Shadow != nil {
		// The candidate bundle may key policies otherwise: it is asked against every policy.
		all, err := w.Policies.All(ctx)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		compareValidation(ctx, w.Shadow, a, othersThan(policy, w.admitted.merge(all, key.Key)), violations)
	}
	if len(violations) == 0 {
		w.admitted.remember(policy, key.Key)
		return admission.Allowed("")
	}
	log.FromContext(ctx).Info("MigrationPolicy rejected", "policy", policy.GetName(), "violations", len(violations))
	return admission.Denied(fmt.Sprintf("MigrationPolicy %s: %s", policy.GetName(), engine.JoinViolations(violations)))
}

// policiesOf is the policies of keyed, in order.
func policiesOf(keyed []engine.KeyedMigrationPolicy) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(keyed))
	for i, k := range keyed {
		out[i] = k.Policy
	}
	return out
}

// keyedOthers is merged (the policies of cached with the pending admissions merged in) but
// the one named as policy, each with its key from cached. A pending admission has none here
// (the zero key: the validation evaluates it), as the bundle may have changed since it was
// keyed; it is one only while the cache does not show it, and of the admitted policy's key, so
// by that key a duplicate in the making. merge keeps cached's order, which makes this one pass
// (another order would only cost more comparisons).
func keyedOthers(policy *unstructured.Unstructured, merged []*unstructured.Unstructured, cached []engine.KeyedMigrationPolicy) []engine.KeyedMigrationPolicy {
	out := make([]engine.KeyedMigrationPolicy, 0, len(merged))
	next := 0 // cached[next:] are the entries not matched yet
	for _, p := range merged {
		if p.GetName() == policy.GetName() {
			continue
		}
		k := engine.KeyedMigrationPolicy{Policy: p}
		for i := next; i < len(cached); i++ {
			if cached[i].Policy == p {
				k.Key, next = cached[i].Key, i+1
				break
			}
		}
		out = append(out, k)
	}
	return out
}

// validationAnswer is the validation decision as the shadow rollout compares it: whether the
// policy is valid (admitted, annotated valid) and why not (no violations and an empty list
// alike).
type validationAnswer struct {
	Allowed    bool               `json:"allowed"`
	Violations []engine.Violation `json:"violations,omitempty"`
}

// compareValidation asks the candidate bundle of s the validation of a, in the background,
// against the same other policies: the webhook's admission and the status controller's
// annotations alike.
func compareValidation(ctx context.Context, s *shadow.Shadow, a engine.MigrationPolicyAdmission, others []*unstructured.Unstructured, violations []engine.Violation) {
	active := validationAnswer{Allowed: len(violations) == 0, Violations: violations}
	object := shadow.Object{Name: a.Policy.GetName()}
	s.CompareAnswer(ctx, shadow.DecisionMigrationPolicyValidation, object, active, func(ctx context.Context) (any, error) {
		v, err := s.Candidate().ValidateMigrationPolicyAdmission(ctx, a, engine.NewExistingMigrationPolicies(others))
		if err != nil {
			return nil, fmt.Errorf("validate MigrationPolicy %s: %w", a.Policy.GetName(), err)
		}
		return validationAnswer{Allowed: len(v) == 0, Violations: v}, nil
	})
}
