package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is pool.virt-rules.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "pool.virt-rules.io", Version: "v1alpha1"}

// Kind names.
const (
	Kind     = "VirtualMachinePool"
	ListKind = "VirtualMachinePoolList"
)

var (
	// SchemeBuilder registers the pool kinds.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the pool kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &VirtualMachinePool{}, &VirtualMachinePoolList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
