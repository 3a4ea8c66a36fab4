package pool

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/controllers/kinds"
)

func TestKeepVMsVMIs(t *testing.T) {
	vmi := func(owner *metav1.OwnerReference) *unstructured.Unstructured {
		u := kinds.NewObject(GVKVMI)
		u.SetNamespace("ns")
		u.SetName("vm-1")
		u.SetUID("uid-1")
		u.SetResourceVersion("7")
		u.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "virt-controller"}})
		if owner != nil {
			u.SetOwnerReferences([]metav1.OwnerReference{*owner})
		}
		_ = unstructured.SetNestedField(u.Object, "Running", "status", "phase")
		return u
	}
	yes := true
	for _, tc := range []struct {
		name  string
		owner *metav1.OwnerReference
		whole bool
	}{
		{"controlled by a VirtualMachine", &metav1.OwnerReference{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "vm-1", Controller: &yes}, true},
		{"standalone", nil, false},
		{"owned but not controlled by a VirtualMachine", &metav1.OwnerReference{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "vm-1"}, false},
		{"controlled by another kind", &metav1.OwnerReference{APIVersion: "example.io/v1", Kind: "VirtualMachine", Name: "vm-1", Controller: &yes}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := keepVMsVMIs(vmi(tc.owner))
			if err != nil {
				t.Fatal(err)
			}
			got := out.(*unstructured.Unstructured)
			if got.GetManagedFields() != nil {
				t.Errorf("managedFields kept: %v", got.GetManagedFields())
			}
			phase, _, _ := unstructured.NestedString(got.Object, "status", "phase")
			if tc.whole {
				if isStub(got) || phase != "Running" {
					t.Errorf("want the whole VMI, got %v", got.Object)
				}
				return
			}
			if !isStub(got) || phase != "" {
				t.Errorf("want a stub, got %v", got.Object)
			}
			if got.GetName() != "vm-1" || got.GetNamespace() != "ns" || got.GetUID() != "uid-1" || got.GetResourceVersion() != "7" || got.GroupVersionKind() != GVKVMI {
				t.Errorf("stub lost the VMI's identity: %v", got.Object)
			}
		})
	}
}
