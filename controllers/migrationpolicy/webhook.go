package migrationpolicy

import (
	"context"
	"fmt"
	"net/http"

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
// values), with the decision's messages. Client must read the API server, not a cache: a
// duplicate created a moment ago must be seen (policies are written rarely, so one live
// LIST per admission is cheap).
type ValidatingWebhook struct {
	Client client.Reader
	Engine Validator
}

var _ admission.Handler = &ValidatingWebhook{}

// Handle validates one CREATE or UPDATE of a MigrationPolicy.
func (w *ValidatingWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	policy, resp := kinds.Admitted(req, kinds.MigrationPolicy)
	if resp != nil {
		return *resp
	}
	violations, err := validate(ctx, w.Client, w.Engine, policy)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if len(violations) == 0 {
		return admission.Allowed("")
	}
	log.FromContext(ctx).Info("MigrationPolicy rejected", "policy", policy.GetName(), "violations", len(violations))
	return admission.Denied(fmt.Sprintf("MigrationPolicy %s: %s", policy.GetName(), engine.JoinViolations(violations)))
}
