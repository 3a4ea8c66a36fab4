// Package launcher is what the webhooks on KubeVirt's virt-launcher pods share: the labels
// that mark them, decoding the pod under admission, and answering with its mutation.
package launcher

import (
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	// LabelApp and App mark KubeVirt's virt-launcher pods.
	LabelApp = "kubevirt.io"
	App      = "virt-launcher"
	// LabelMigrationJobUID marks a migration's target pod with the migration's UID.
	LabelMigrationJobUID = "kubevirt.io/migrationJobUID"
)

// Decode returns the virt-launcher pod a CREATE admits, with its namespace set, or the
// response to give instead: allowed for other operations and other pods, an error for a
// pod that does not decode.
func Decode(req admission.Request) (*corev1.Pod, *admission.Response) {
	if req.Operation != admissionv1.Create {
		resp := admission.Allowed("")
		return nil, &resp
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		resp := admission.Errored(http.StatusBadRequest, fmt.Errorf("decode Pod: %w", err))
		return nil, &resp
	}
	if pod.Labels[LabelApp] != App {
		resp := admission.Allowed("not a virt-launcher pod")
		return nil, &resp
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	return &pod, nil
}

// WithNodeAffinity answers req with pod's node affinity set to affinity, as a JSON patch.
func WithNodeAffinity(req admission.Request, pod *corev1.Pod, affinity *corev1.NodeAffinity) admission.Response {
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	pod.Spec.Affinity.NodeAffinity = affinity
	mutated, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encode Pod: %w", err))
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

// NodeAffinity is pod's own node affinity, or nil.
func NodeAffinity(pod *corev1.Pod) *corev1.NodeAffinity {
	if pod.Spec.Affinity == nil {
		return nil
	}
	return pod.Spec.Affinity.NodeAffinity
}

// UnstructuredPods converts pods as the engine's decisions read them.
func UnstructuredPods(items []corev1.Pod) ([]*unstructured.Unstructured, error) {
	pods := make([]*unstructured.Unstructured, 0, len(items))
	for i := range items {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&items[i])
		if err != nil {
			return nil, fmt.Errorf("convert pod %s/%s: %w", items[i].Namespace, items[i].Name, err)
		}
		pods = append(pods, &unstructured.Unstructured{Object: obj})
	}
	return pods, nil
}
