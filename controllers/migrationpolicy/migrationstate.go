package migrationpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// MigrationStateWebhookPath serves the mutation of VirtualMachineInstance writes.
const MigrationStateWebhookPath = "/mutate-kubevirt-io-v1-virtualmachineinstance-migrationstate"

// MigrationStateWebhook is where the decision reaches KubeVirt: whenever a write of a
// VirtualMachineInstance carries status.migrationState (KubeVirt writes it when a migration
// starts), it sets status.migrationState.migrationPolicyName and migrationConfiguration to the
// engine's decision, so the migration runs with the policy virt-rules chose.
type MigrationStateWebhook struct {
	Client client.Reader
	Sets   *PolicySets
	// Shadow, when set, is asked each decision again with the candidate bundle's policy sets
	// (CandidateSets), in the background and never acted on.
	Shadow        *shadow.Shadow
	CandidateSets *PolicySets
}

var _ admission.Handler = &MigrationStateWebhook{}

// Handle mutates one CREATE or UPDATE of a VirtualMachineInstance.
func (w *MigrationStateWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	vmi, resp := kinds.Admitted(req, kinds.VirtualMachineInstance)
	if resp != nil {
		return *resp
	}
	state, ok, _ := unstructured.NestedMap(vmi.Object, "status", "migrationState")
	if !ok || state == nil {
		return admission.Allowed("no migration state")
	}
	if vmi.GetNamespace() == "" {
		vmi.SetNamespace(req.Namespace)
	}
	set, err := w.Sets.Current(ctx)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	subject, err := subjectOf(ctx, w.Client, vmi)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	d, err := set.Decide(ctx, subject)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	cfg, err := toMap(d.Configuration)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if w.Shadow != nil {
		w.compareCandidate(ctx, subject, d)
	}
	state["migrationConfiguration"] = cfg
	delete(state, "migrationPolicyName")
	if d.Policy != "" {
		state["migrationPolicyName"] = d.Policy
	}
	if err := unstructured.SetNestedMap(vmi.Object, state, "status", "migrationState"); err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	mutated, err := json.Marshal(vmi.Object)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

func toMap(v any) (map[string]any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(raw, &m)
}

// compareCandidate asks the candidate bundle the same decision, in the background.
func (w *MigrationStateWebhook) compareCandidate(ctx context.Context, subject engine.MigrationPolicySubject, d *engine.MigrationPolicyDecision) {
	key := subject.Key()
	object := shadow.Object{Namespace: subject.Namespace, Name: subject.Name}
	w.Shadow.CompareAnswer(ctx, shadow.DecisionMigrationState, object, eval.MigrationPolicyResultOf(key, d), func(ctx context.Context) (any, error) {
		set, err := w.CandidateSets.Current(ctx)
		if err != nil {
			return nil, err
		}
		cd, err := set.Decide(ctx, subject)
		if err != nil {
			return nil, fmt.Errorf("decide %s: %w", key, err)
		}
		return eval.MigrationPolicyResultOf(key, cd), nil
	})
}
