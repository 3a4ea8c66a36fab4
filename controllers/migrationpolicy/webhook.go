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
// annotated and relabelled. Client is the manager's cache: the policies it lists, with those
// this webhook admitted that it does not show yet (admitted.go), and the KubeVirt CR. The
// engine remembers the selector keys of the listed policies by UID and resourceVersion, so
// the Rego work per admission does not grow with the number of policies.
type ValidatingWebhook struct {
	Client client.Reader
	Engine Validator

	admitted admittedPolicies
}

var _ admission.Handler = &ValidatingWebhook{}

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
	cached, err := cachedPolicies(ctx, w.Client)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	// One admission at a time: a policy admitted a moment ago counts for the next one.
	w.admitted.mu.Lock()
	defer w.admitted.mu.Unlock()
	existing := engine.NewExistingMigrationPolicies(othersThan(policy, w.admitted.merge(cached)))
	violations, err := w.Engine.ValidateMigrationPolicyAdmission(ctx, a, existing)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if len(violations) == 0 {
		w.admitted.remember(policy)
		return admission.Allowed("")
	}
	log.FromContext(ctx).Info("MigrationPolicy rejected", "policy", policy.GetName(), "violations", len(violations))
	return admission.Denied(fmt.Sprintf("MigrationPolicy %s: %s", policy.GetName(), engine.JoinViolations(violations)))
}
