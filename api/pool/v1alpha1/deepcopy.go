package v1alpha1

// Deep copies, written by hand: the package is small and its fields are pointers, maps,
// slices and types that bring their own DeepCopyInto, so a generator (controller-gen, a new
// tool dependency) would buy little. deepcopy_test.go checks every field is copied.

import (
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// DeepCopyInto copies in into out.
func (in *VirtualMachinePool) DeepCopyInto(out *VirtualMachinePool) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopy copies the pool.
func (in *VirtualMachinePool) DeepCopy() *VirtualMachinePool {
	if in == nil {
		return nil
	}
	out := new(VirtualMachinePool)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *VirtualMachinePool) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopyInto copies in into out.
func (in *VirtualMachinePoolList) DeepCopyInto(out *VirtualMachinePoolList) {
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]VirtualMachinePool, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy copies the list.
func (in *VirtualMachinePoolList) DeepCopy() *VirtualMachinePoolList {
	if in == nil {
		return nil
	}
	out := new(VirtualMachinePoolList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *VirtualMachinePoolList) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopyInto copies in into out.
func (in *VirtualMachinePoolSpec) DeepCopyInto(out *VirtualMachinePoolSpec) {
	*out = *in
	out.Replicas = ptrCopy(in.Replicas)
	if in.MaxUnavailable != nil {
		out.MaxUnavailable = new(intstr.IntOrString)
		*out.MaxUnavailable = *in.MaxUnavailable
	}
	if in.NameGeneration != nil {
		out.NameGeneration = &NameGeneration{
			AppendPostfixToSecretReferences:    ptrCopy(in.NameGeneration.AppendPostfixToSecretReferences),
			AppendPostfixToConfigMapReferences: ptrCopy(in.NameGeneration.AppendPostfixToConfigMapReferences),
		}
	}
	if in.UpdateStrategy != nil {
		s := in.UpdateStrategy
		out.UpdateStrategy = &UpdateStrategy{Unmanaged: ptrCopy(s.Unmanaged), Opportunistic: ptrCopy(s.Opportunistic)}
		if s.Proactive != nil {
			out.UpdateStrategy.Proactive = &ProactiveUpdate{SelectionPolicy: s.Proactive.SelectionPolicy.DeepCopy()}
		}
	}
	if in.ScaleInStrategy != nil {
		s := in.ScaleInStrategy
		out.ScaleInStrategy = &ScaleInStrategy{Unmanaged: ptrCopy(s.Unmanaged), Opportunistic: ptrCopy(s.Opportunistic)}
		if s.Proactive != nil {
			out.ScaleInStrategy.Proactive = &ProactiveScaleIn{
				SelectionPolicy:   s.Proactive.SelectionPolicy.DeepCopy(),
				StatePreservation: s.Proactive.StatePreservation,
			}
		}
	}
	if in.Autohealing != nil {
		out.Autohealing = &Autohealing{
			StartupFailureThreshold:   ptrCopy(in.Autohealing.StartupFailureThreshold),
			MinFailingToStartDuration: ptrCopy(in.Autohealing.MinFailingToStartDuration),
		}
	}
	out.Template.Metadata = TemplateMetadata{
		Labels:      maps.Clone(in.Template.Metadata.Labels),
		Annotations: maps.Clone(in.Template.Metadata.Annotations),
	}
	in.Template.Spec.DeepCopyInto(&out.Template.Spec)
}

// DeepCopy copies the selection policy.
func (in *SelectionPolicy) DeepCopy() *SelectionPolicy {
	if in == nil {
		return nil
	}
	out := &SelectionPolicy{BasePolicy: in.BasePolicy}
	if in.OrderedPolicies != nil {
		out.OrderedPolicies = make([]OrderedPolicy, len(in.OrderedPolicies))
		for i, p := range in.OrderedPolicies {
			out.OrderedPolicies[i] = OrderedPolicy{LabelSelector: p.LabelSelector.DeepCopy()}
		}
	}
	return out
}

// DeepCopyInto copies in into out.
func (in *VirtualMachinePoolStatus) DeepCopyInto(out *VirtualMachinePoolStatus) {
	*out = *in
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
	if in.Reprovisions != nil {
		out.Reprovisions = make([]Reprovision, len(in.Reprovisions))
		for i := range in.Reprovisions {
			out.Reprovisions[i] = in.Reprovisions[i]
			in.Reprovisions[i].LastTime.DeepCopyInto(&out.Reprovisions[i].LastTime)
		}
	}
}

// ptrCopy is a new pointer to a copy of *p, nil for nil; for pointers to plain values.
func ptrCopy[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
