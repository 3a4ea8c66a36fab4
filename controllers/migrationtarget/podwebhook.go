package migrationtarget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/engine"
)

const (
	// PodWebhookPath serves the mutation of migration target virt-launcher pods.
	PodWebhookPath = "/mutate-v1-pod-migrationtarget"

	// LabelApp and AppLauncher mark KubeVirt's virt-launcher pods.
	LabelApp    = "kubevirt.io"
	AppLauncher = "virt-launcher"
	// LabelMigrationJobUID marks a migration's target pod with the migration's UID.
	LabelMigrationJobUID = "kubevirt.io/migrationJobUID"
)

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
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode Pod: %w", err))
	}
	uid := pod.Labels[LabelMigrationJobUID]
	if pod.Labels[LabelApp] != AppLauncher || uid == "" {
		return admission.Allowed("not a migration target pod")
	}
	namespace := pod.Namespace
	if namespace == "" {
		namespace = req.Namespace
	}
	migration, err := w.migrationByUID(ctx, namespace, types.UID(uid))
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if migration == nil {
		return admission.Allowed("").WithWarnings(fmt.Sprintf(
			"virt-rules: no VirtualMachineInstanceMigration with UID %s in namespace %s; pod left as created", uid, namespace))
	}
	var own *corev1.NodeAffinity
	if pod.Spec.Affinity != nil {
		own = pod.Spec.Affinity.NodeAffinity
	}
	affinity, err := w.Engine.MigrationTargetPodAffinity(ctx, migration, own)
	var fe *engine.FieldError
	switch {
	case errors.As(err, &fe):
		return admission.Denied(fmt.Sprintf("%s: %v", engine.ReasonInvalidTerm, err))
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	case affinity == nil:
		return admission.Allowed("migration adds no node requirement")
	}
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	pod.Spec.Affinity.NodeAffinity = affinity
	mutated, err := json.Marshal(&pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encode Pod: %w", err))
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

// migrationByUID finds the migration in namespace with uid, or nil.
func (w *PodWebhook) migrationByUID(ctx context.Context, namespace string, uid types.UID) (*unstructured.Unstructured, error) {
	for _, r := range []client.Reader{w.Client, w.APIReader} {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(GVKMigration.GroupVersion().WithKind(GVKMigration.Kind + "List"))
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
