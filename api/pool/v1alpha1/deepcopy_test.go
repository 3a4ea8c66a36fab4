package v1alpha1

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

func full() *VirtualMachinePool {
	yes, three, two := true, int32(3), int32(2)
	mu := intstr.FromString("25%")
	selection := &SelectionPolicy{
		OrderedPolicies: []OrderedPolicy{{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}}},
		BasePolicy:      BasePolicyOldest,
	}
	return &VirtualMachinePool{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"x": "y"}},
		Spec: VirtualMachinePoolSpec{
			Replicas:        &two,
			MaxUnavailable:  &mu,
			NameGeneration:  &NameGeneration{AppendPostfixToSecretReferences: &yes, AppendPostfixToConfigMapReferences: &yes},
			UpdateStrategy:  &UpdateStrategy{Proactive: &ProactiveUpdate{SelectionPolicy: selection}},
			ScaleInStrategy: &ScaleInStrategy{Proactive: &ProactiveScaleIn{SelectionPolicy: selection, StatePreservation: StatePreservationOffline}},
			Autohealing:     &Autohealing{StartupFailureThreshold: &three},
			Template: VirtualMachineTemplate{
				Metadata: TemplateMetadata{Labels: map[string]string{"app": "db"}, Annotations: map[string]string{"n": "1"}},
				Spec:     kubevirtv1.VirtualMachineSpec{Running: &yes},
			},
		},
		Status: VirtualMachinePoolStatus{
			Replicas:     2,
			Conditions:   []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}},
			Reprovisions: []Reprovision{{Name: "p-1", Count: 1}},
		},
	}
}

func TestDeepCopyIsEqualAndIndependent(t *testing.T) {
	in := full()
	out := in.DeepCopy()
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("copy differs:\n%#v\n%#v", in, out)
	}
	// Every pointer, map and slice of the copy is its own: changing the copy leaves in alone.
	*out.Spec.Replicas = 9
	out.Spec.MaxUnavailable.StrVal = "50%"
	*out.Spec.NameGeneration.AppendPostfixToSecretReferences = false
	out.Spec.UpdateStrategy.Proactive.SelectionPolicy.OrderedPolicies[0].LabelSelector.MatchLabels["a"] = "c"
	out.Spec.ScaleInStrategy.Proactive.SelectionPolicy.BasePolicy = BasePolicyNewest
	*out.Spec.Autohealing.StartupFailureThreshold = 7
	out.Spec.Template.Metadata.Labels["app"] = "web"
	*out.Spec.Template.Spec.Running = false
	out.Status.Conditions[0].Status = metav1.ConditionFalse
	out.Status.Reprovisions[0].Count = 5
	out.Labels["x"] = "z"
	if !reflect.DeepEqual(in, full()) {
		t.Fatalf("changing the copy changed the original: %#v", in)
	}
	list := &VirtualMachinePoolList{Items: []VirtualMachinePool{*full()}}
	if !reflect.DeepEqual(list.DeepCopyObject(), list) {
		t.Fatal("list copy differs")
	}
}
