// Package v1alpha1 is the pool.virt-rules.io/v1alpha1 API: the VirtualMachinePool of design
// 003, a group of similar stateful KubeVirt VirtualMachines made from one template, scaled,
// updated and healed by the virt-rules pool controller. It lives in its own group so that it
// can run beside KubeVirt's own pool controller.
//
// The CustomResourceDefinition (examples/deploy/crds/pool.virt-rules.io_virtualmachinepools.yaml)
// is written by hand beside these types: its defaults and CEL rules are the contract, and the
// pool decision (rego/virtrules/pool) reads pools as stored.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// VirtualMachinePool keeps Spec.Replicas VirtualMachines made from Spec.Template.
type VirtualMachinePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachinePoolSpec   `json:"spec"`
	Status VirtualMachinePoolStatus `json:"status,omitempty"`
}

// VirtualMachinePoolList is a list of pools.
type VirtualMachinePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachinePool `json:"items"`
}

// VirtualMachinePoolSpec is the design's spec.
type VirtualMachinePoolSpec struct {
	// Replicas is the number of VMs wanted.
	Replicas *int32 `json:"replicas"`
	// MaxUnavailable is how many VMs (a number, or a percentage of Replicas) may be unready
	// at once during a proactive update; default 25%.
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// NameGeneration makes Secret and ConfigMap references unique per VM.
	NameGeneration *NameGeneration `json:"nameGeneration,omitempty"`
	// UpdateStrategy is how VMs that differ from the template are updated; default proactive.
	UpdateStrategy *UpdateStrategy `json:"updateStrategy,omitempty"`
	// ScaleInStrategy is how VMs are removed when there are too many; default proactive.
	ScaleInStrategy *ScaleInStrategy `json:"scaleInStrategy,omitempty"`
	// Autohealing re-provisions VMs that keep failing to start; nil turns it off.
	Autohealing *Autohealing `json:"autohealing,omitempty"`
	// Template is the VMs' metadata and VirtualMachine spec.
	Template VirtualMachineTemplate `json:"template"`
}

// NameGeneration appends each VM's "-<n>" postfix to references in its volumes.
type NameGeneration struct {
	AppendPostfixToSecretReferences    *bool `json:"appendPostfixToSecretReferences,omitempty"`
	AppendPostfixToConfigMapReferences *bool `json:"appendPostfixToConfigMapReferences,omitempty"`
}

// UpdateStrategy sets exactly one strategy.
type UpdateStrategy struct {
	// Unmanaged never touches a VM after creating it.
	Unmanaged *Unmanaged `json:"unmanaged,omitempty"`
	// Opportunistic updates halted VMs only.
	Opportunistic *OpportunisticUpdate `json:"opportunistic,omitempty"`
	// Proactive updates and restarts running VMs within MaxUnavailable.
	Proactive *ProactiveUpdate `json:"proactive,omitempty"`
}

// ScaleInStrategy sets exactly one strategy.
type ScaleInStrategy struct {
	// Unmanaged never deletes a VM.
	Unmanaged *Unmanaged `json:"unmanaged,omitempty"`
	// Opportunistic deletes halted VMs only.
	Opportunistic *OpportunisticScaleIn `json:"opportunistic,omitempty"`
	// Proactive deletes the VMs SelectionPolicy picks.
	Proactive *ProactiveScaleIn `json:"proactive,omitempty"`
}

// Unmanaged leaves VMs to their users.
type Unmanaged struct{}

// OpportunisticUpdate has no settings.
type OpportunisticUpdate struct{}

// ProactiveUpdate picks the VMs to update by SelectionPolicy.
type ProactiveUpdate struct {
	SelectionPolicy *SelectionPolicy `json:"selectionPolicy,omitempty"`
}

// OpportunisticScaleIn keeps or deletes the state of the halted VMs it removes.
type OpportunisticScaleIn struct {
	StatePreservation StatePreservation `json:"statePreservation,omitempty"`
}

// ProactiveScaleIn picks the VMs to remove by SelectionPolicy.
type ProactiveScaleIn struct {
	SelectionPolicy   *SelectionPolicy  `json:"selectionPolicy,omitempty"`
	StatePreservation StatePreservation `json:"statePreservation,omitempty"`
}

// SelectionPolicy orders VMs: those matching the first ordered policy first, ..., the rest
// last; within each group by BasePolicy.
type SelectionPolicy struct {
	OrderedPolicies []OrderedPolicy `json:"orderedPolicies,omitempty"`
	BasePolicy      BasePolicy      `json:"basePolicy,omitempty"`
}

// OrderedPolicy is one selection criterion.
type OrderedPolicy struct {
	LabelSelector *metav1.LabelSelector `json:"labelSelector"`
}

// BasePolicy is the catch-all order.
type BasePolicy string

// The base policies.
const (
	BasePolicyOldest BasePolicy = "Oldest"
	BasePolicyNewest BasePolicy = "Newest"
	// BasePolicyAscendingOrder and BasePolicyDescendingOrder order VMs by the number in their
	// name (KubeVirt's pool sort policies of the same names).
	BasePolicyAscendingOrder  BasePolicy = "AscendingOrder"
	BasePolicyDescendingOrder BasePolicy = "DescendingOrder"
	// BasePolicyRandom is a stable pseudo-random order that takes stopped, then not ready
	// VMs first (bundle data can change that order).
	BasePolicyRandom BasePolicy = "Random"
)

// StatePreservation is what happens to a removed VM's volumes.
type StatePreservation string

// The state preservation modes.
const (
	// StatePreservationDisabled deletes the volumes with the VM.
	StatePreservationDisabled StatePreservation = "Disabled"
	// StatePreservationOffline keeps the volumes for the next VM of the same name.
	StatePreservationOffline StatePreservation = "Offline"
	// StatePreservationOnline would keep memory too; refused until that can be done.
	StatePreservationOnline StatePreservation = "Online"
)

// Autohealing re-provisions a VM that failed to start StartupFailureThreshold times in a row.
type Autohealing struct {
	StartupFailureThreshold *int32 `json:"startupFailureThreshold,omitempty"`
	// MinFailingToStartDuration is how long a VM must have been failing (CrashLoopBackOff,
	// ErrorUnschedulable, image pull or volume errors, its Ready condition False) before it is
	// re-provisioned; default 5m. Read only with the bundle setting semantics: kubevirt.
	MinFailingToStartDuration *metav1.Duration `json:"minFailingToStartDuration,omitempty"`
}

// VirtualMachineTemplate is the metadata and spec of every VM of the pool.
type VirtualMachineTemplate struct {
	Metadata TemplateMetadata              `json:"metadata,omitempty"`
	Spec     kubevirtv1.VirtualMachineSpec `json:"spec"`
}

// TemplateMetadata is what a VM inherits from the pool besides its spec.
type TemplateMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// VirtualMachinePoolStatus is what the controller observed and did.
type VirtualMachinePoolStatus struct {
	// Replicas is the number of VMs the pool owns (the scale subresource's status).
	Replicas int32 `json:"replicas"`
	// ReadyReplicas is the number of those that are ready.
	ReadyReplicas int32 `json:"readyReplicas"`
	// UpdatedReplicas is the number of those made from the current template.
	UpdatedReplicas int32 `json:"updatedReplicas"`
	// ObservedGeneration is the pool generation the status describes.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// LabelSelector selects the pool's VMs (the scale subresource's selector).
	LabelSelector string `json:"labelSelector,omitempty"`
	// Conditions: Scaled, Updated, Ready.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Reprovisions are the autohealing records: how often each VM was re-provisioned in a
	// row and when last, for the backoff.
	Reprovisions []Reprovision `json:"reprovisions,omitempty"`
}

// Reprovision is the autohealing record of one VM name.
type Reprovision struct {
	Name     string      `json:"name"`
	Count    int32       `json:"count"`
	LastTime metav1.Time `json:"lastTime"`
}
