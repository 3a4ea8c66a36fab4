// Package kinds names the KubeVirt (and CDI) kinds the controllers read and write as stored,
// through unstructured objects that keep every field for the rules, and the helpers every
// controller package needs for them.
package kinds

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// The kinds, one name each.
var (
	VirtualMachine                  = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"}
	VirtualMachineInstance          = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachineInstance"}
	VirtualMachineInstanceMigration = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachineInstanceMigration"}
	KubeVirt                        = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "KubeVirt"}
	MigrationPolicy                 = schema.GroupVersionKind{Group: "migrations.kubevirt.io", Version: "v1alpha1", Kind: "MigrationPolicy"}
	DataVolume                      = schema.GroupVersionKind{Group: "cdi.kubevirt.io", Version: "v1beta1", Kind: "DataVolume"}
)

// NewObject is an empty object of kind gvk, to read into.
func NewObject(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

// NewMetadata is an empty metadata-only object of kind gvk, to read into: what the cache keeps
// of VMIs (see VMIs).
func NewMetadata(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	return m
}

// NewMetadataList is an empty list of metadata-only objects of kind gvk, to list into.
func NewMetadataList(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadataList {
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	return l
}

// NewList is an empty list of objects of kind gvk, to list into.
func NewList(gvk schema.GroupVersionKind) *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	return l
}

// ClusterKubeVirt is the KubeVirt CR that rules among items: a cluster has one; with several
// (a broken install), the oldest. Nil when there is none. It sorts items.
func ClusterKubeVirt(items []unstructured.Unstructured) *unstructured.Unstructured {
	if len(items) == 0 {
		return nil
	}
	slices.SortFunc(items, func(a, b unstructured.Unstructured) int {
		return a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time)
	})
	return &items[0]
}

// ReadClusterKubeVirt lists the KubeVirt CRs c reads and returns the one that rules
// (ClusterKubeVirt), or nil when there is none.
func ReadClusterKubeVirt(ctx context.Context, c client.Reader) (*unstructured.Unstructured, error) {
	list := NewList(KubeVirt)
	if err := c.List(ctx, list); err != nil {
		return nil, fmt.Errorf("list KubeVirt: %w", err)
	}
	return ClusterKubeVirt(list.Items), nil
}

// Admitted returns the object of kind gvk a CREATE or UPDATE admits, or the response to give
// instead: allowed for any other operation, an error naming the kind for an object that does
// not decode.
func Admitted(req admission.Request, gvk schema.GroupVersionKind) (*unstructured.Unstructured, *admission.Response) {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		resp := admission.Allowed("")
		return nil, &resp
	}
	obj := &unstructured.Unstructured{}
	if err := json.Unmarshal(req.Object.Raw, &obj.Object); err != nil {
		resp := admission.Errored(http.StatusBadRequest, fmt.Errorf("decode %s: %w", gvk.Kind, err))
		return nil, &resp
	}
	return obj, nil
}

// Condition is obj's status condition of type conditionType, or nil.
func Condition(obj *unstructured.Unstructured, conditionType string) map[string]any {
	conditions, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conditions {
		if m, ok := c.(map[string]any); ok && m["type"] == conditionType {
			return m
		}
	}
	return nil
}
