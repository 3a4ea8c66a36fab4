// Package migrationtarget applies the migration target decision (design 001) in a cluster.
// So far: the validating webhook that rejects a VirtualMachineInstanceMigration whose added
// node selector term is malformed, with the decision's field paths.
package migrationtarget

import (
	"context"
	"fmt"
	"net/http"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
)

// ValidatingWebhookPath serves the admission review of VirtualMachineInstanceMigrations.
const ValidatingWebhookPath = "/validate-kubevirt-io-v1-virtualmachineinstancemigration"

// Validator is what the webhook needs of the engine.
type Validator interface {
	ValidateMigration(ctx context.Context, migration *unstructured.Unstructured) ([]engine.Violation, error)
}

// ValidatingWebhook rejects a migration whose added constraint is invalid (InvalidTerm).
type ValidatingWebhook struct {
	Engine Validator
}

var _ admission.Handler = &ValidatingWebhook{}

// Handle validates one CREATE or UPDATE of a VirtualMachineInstanceMigration.
func (w *ValidatingWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	migration, resp := kinds.Admitted(req, kinds.VirtualMachineInstanceMigration)
	if resp != nil {
		return *resp
	}
	violations, err := w.Engine.ValidateMigration(ctx, migration)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if len(violations) == 0 {
		return admission.Allowed("")
	}
	return admission.Denied(fmt.Sprintf("%s: VirtualMachineInstanceMigration %s: %s",
		engine.ReasonInvalidTerm, migration.GetName(), engine.JoinViolations(violations)))
}
