package migrationtarget

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// PodWebhookPath serves the mutation of migration target virt-launcher pods.
const PodWebhookPath = "/mutate-v1-pod-migrationtarget"

// PodWebhook writes a migration's added constraint into its target virt-launcher pod: the
// pod's own node affinity (KubeVirt's copy of the VMI's) with the added term ANDed into every
// required term, as the engine decides. Pods without the labels, and migrations that add no
// requirement, are left as they are.
type PodWebhook struct {
	// Client finds the migration by UID: the informer cache first, then the API server (the
	// migration may be younger than the cache's view).
	Client    client.Reader
	APIReader client.Reader
	Engine    Decider
	// Shadow, when set, is asked each affinity again with the candidate bundle, in the
	// background and never acted on.
	Shadow *shadow.Shadow
}

var _ admission.Handler = &PodWebhook{}

// Handle mutates one CREATE of a pod.
func (w *PodWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	pod, resp := launcher.Decode(req)
	if resp != nil {
		return *resp
	}
	uid := pod.Labels[launcher.LabelMigrationJobUID]
	if uid == "" {
		return admission.Allowed("not a migration target pod")
	}
	namespace := pod.Namespace
	migration, err := w.migrationByUID(ctx, namespace, types.UID(uid))
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if migration == nil {
		return admission.Allowed("").WithWarnings(fmt.Sprintf(
			"virt-rules: no VirtualMachineInstanceMigration with UID %s in namespace %s; pod left as created", uid, namespace))
	}
	own := launcher.NodeAffinity(pod)
	affinity, err := w.Engine.MigrationTargetPodAffinity(ctx, migration, own)
	var fe *engine.FieldError
	switch {
	case errors.As(err, &fe):
		w.compareCandidate(ctx, migration, own, podAnswerOf(nil, fe))
		return admission.Denied(fmt.Sprintf("%s: %v", engine.ReasonInvalidTerm, err))
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	}
	w.compareCandidate(ctx, migration, own, podAnswerOf(affinity, nil))
	if affinity == nil {
		return admission.Allowed("migration adds no node requirement")
	}
	return launcher.WithNodeAffinity(req, pod, affinity)
}

// podAnswer is the webhook's answer as the shadow rollout compares it: the target pod's node
// affinity (null: left as created), or why the pod is refused (an invalid added term).
type podAnswer struct {
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity"`
	Denied       string               `json:"denied,omitempty"`
}

func podAnswerOf(affinity *corev1.NodeAffinity, invalid error) podAnswer {
	if invalid != nil {
		return podAnswer{Denied: invalid.Error()}
	}
	return podAnswer{NodeAffinity: affinity}
}

// compareCandidate asks the candidate bundle the target pod's affinity, in the background;
// nothing without a Shadow. The migration is named, not the pod: a target pod is created
// with a generated name, unknown at admission.
func (w *PodWebhook) compareCandidate(ctx context.Context, migration *unstructured.Unstructured, own *corev1.NodeAffinity, active podAnswer) {
	if w.Shadow == nil {
		return
	}
	own = own.DeepCopy() // the pod is patched meanwhile
	object := shadow.Object{Namespace: migration.GetNamespace(), Name: migration.GetName()}
	w.Shadow.CompareAnswer(ctx, shadow.DecisionMigrationTargetPodAffinity, object, active, func(ctx context.Context) (any, error) {
		affinity, err := w.Shadow.Candidate().MigrationTargetPodAffinity(ctx, migration, own)
		var fe *engine.FieldError
		switch {
		case errors.As(err, &fe):
			return podAnswerOf(nil, fe), nil
		case err != nil:
			return nil, fmt.Errorf("decide the target pod affinity of migration %s: %w", object.Key(), err)
		}
		return podAnswerOf(affinity, nil), nil
	})
}

// migrationByUID finds the migration in namespace with uid, or nil.
func (w *PodWebhook) migrationByUID(ctx context.Context, namespace string, uid types.UID) (*unstructured.Unstructured, error) {
	for _, r := range []client.Reader{w.Client, w.APIReader} {
		list := kinds.NewList(GVKMigration)
		if err := r.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return nil, fmt.Errorf("list migrations in %s: %w", namespace, err)
		}
		for i := range list.Items {
			if list.Items[i].GetUID() == uid {
				return &list.Items[i], nil
			}
		}
	}
	return nil, nil
}
