package migrationtarget

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// ValidatingWebhookPath serves the admission review of VirtualMachineInstanceMigrations.
const ValidatingWebhookPath = "/validate-kubevirt-io-v1-virtualmachineinstancemigration"

// LabelConstrainedMigration marks a VMI whose migration adds a node constraint only virt-rules
// enforces: its value is that migration's UID. virt-controller copies the VMI's labels onto
// the migration's target pod beside kubevirt.io/migrationJobUID, so the target pod of that
// very migration, and no other, carries both with the same value, and the pod webhook entry
// that fails closed (examples/deploy/webhooks/mutating.yaml) selects exactly those pods. A
// label left from an earlier migration matches no later target pod, so it is left in place.
const LabelConstrainedMigration = "migrations.virt-rules.io/constrained-migration-uid"

// Validator is what the webhook needs of the engine.
type Validator interface {
	ValidateMigration(ctx context.Context, migration *unstructured.Unstructured) ([]engine.Violation, error)
	MigrationTargetPodAffinity(ctx context.Context, migration *unstructured.Unstructured, podAffinity *corev1.NodeAffinity) (*corev1.NodeAffinity, error)
}

// ValidatingWebhook rejects a migration whose added constraint is invalid (InvalidTerm) and,
// on the creation of one whose constraint is valid and adds a requirement, labels its VMI
// with LabelConstrainedMigration before the migration exists (so before virt-controller
// renders the target pod). The webhook entry that calls it for such migrations fails closed:
// with virt-rules down, a migration only virt-rules could constrain is not created at all.
type ValidatingWebhook struct {
	Engine Validator
	// Client patches the VMI's label; nil leaves VMIs unlabelled (validation only).
	Client client.Client
	// Shadow, when set, is asked each answer again with the candidate bundle, in the
	// background and never acted on.
	Shadow *shadow.Shadow
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
	if len(violations) > 0 {
		w.compareCandidate(ctx, migration, migrationAnswer{Violations: violations})
		return admission.Denied(fmt.Sprintf("%s: VirtualMachineInstanceMigration %s: %s",
			engine.ReasonInvalidTerm, migration.GetName(), engine.JoinViolations(violations)))
	}
	if w.Client == nil || req.Operation != admissionv1.Create || (req.DryRun != nil && *req.DryRun) {
		w.compareCandidate(ctx, migration, migrationAnswer{Allowed: true})
		return admission.Allowed("")
	}
	affinity, err := w.Engine.MigrationTargetPodAffinity(ctx, migration, nil)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	adds := affinity != nil
	w.compareCandidate(ctx, migration, migrationAnswer{Allowed: true, AddsNodeRequirement: &adds})
	if !adds {
		return admission.Allowed("migration adds no node requirement")
	}
	return w.markVMI(ctx, migration)
}

// migrationAnswer is the webhook's answer as the shadow rollout compares it: whether the
// migration is admitted, why not, and, when the webhook asked (a CREATE it labels VMIs for),
// whether the migration adds a node requirement (its VMI is then labelled). No violations and
// an empty list are alike.
type migrationAnswer struct {
	Allowed             bool               `json:"allowed"`
	Violations          []engine.Violation `json:"violations,omitempty"`
	AddsNodeRequirement *bool              `json:"addsNodeRequirement,omitempty"`
}

// compareCandidate asks the candidate bundle what active answers, in the background; nothing
// without a Shadow.
func (w *ValidatingWebhook) compareCandidate(ctx context.Context, migration *unstructured.Unstructured, active migrationAnswer) {
	if w.Shadow == nil {
		return
	}
	object := shadow.Object{Namespace: migration.GetNamespace(), Name: migration.GetName()}
	w.Shadow.CompareAnswer(ctx, shadow.DecisionMigrationValidation, object, active, func(ctx context.Context) (any, error) {
		candidate := w.Shadow.Candidate()
		v, err := candidate.ValidateMigration(ctx, migration)
		if err != nil {
			return nil, fmt.Errorf("validate migration %s: %w", object.Key(), err)
		}
		ans := migrationAnswer{Allowed: len(v) == 0, Violations: v}
		if ans.Allowed && active.AddsNodeRequirement != nil {
			affinity, err := candidate.MigrationTargetPodAffinity(ctx, migration, nil)
			if err != nil {
				return nil, fmt.Errorf("decide the target pod affinity of migration %s: %w", object.Key(), err)
			}
			adds := affinity != nil
			ans.AddsNodeRequirement = &adds
		}
		return ans, nil
	})
}

// markVMI labels the migration's VMI with the migration's UID. Without it the target pod
// would not reach the webhook entry that fails closed, so a failure refuses the migration.
func (w *ValidatingWebhook) markVMI(ctx context.Context, migration *unstructured.Unstructured) admission.Response {
	vmiName, _, _ := unstructured.NestedString(migration.Object, "spec", "vmiName")
	if vmiName == "" || migration.GetUID() == "" {
		// KubeVirt's own admission refuses a migration without vmiName; a CREATE reaches a
		// validating webhook with its UID set.
		return admission.Allowed("")
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{
		LabelConstrainedMigration: string(migration.GetUID()),
	}}})
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encode VMI label patch: %w", err))
	}
	vmi := kinds.NewObject(GVKVirtualMachineInstance)
	vmi.SetNamespace(migration.GetNamespace())
	vmi.SetName(vmiName)
	err = w.Client.Patch(ctx, vmi, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager))
	switch {
	case apierrors.IsNotFound(err):
		// KubeVirt fails a migration of a VMI that does not exist; nothing to constrain.
		return admission.Allowed("")
	case err != nil:
		return admission.Errored(http.StatusInternalServerError,
			fmt.Errorf("label VirtualMachineInstance %s/%s for the added node constraint of migration %s: %w",
				migration.GetNamespace(), vmiName, migration.GetName(), err))
	}
	return admission.Allowed("")
}
