package migrationtarget

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/engine"
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
	affinity, err := w.Engine.MigrationTargetPodAffinity(ctx, migration, launcher.NodeAffinity(pod))
	var fe *engine.FieldError
	switch {
	case errors.As(err, &fe):
		return admission.Denied(fmt.Sprintf("%s: %v", engine.ReasonInvalidTerm, err))
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	case affinity == nil:
		return admission.Allowed("migration adds no node requirement")
	}
	return launcher.WithNodeAffinity(req, pod, affinity)
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
