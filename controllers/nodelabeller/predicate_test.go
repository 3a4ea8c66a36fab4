package nodelabeller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

func TestLevelInputsChanged(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"cpu-model-migration.node.kubevirt.io/Haswell": "true"}}}
	heartbeat := node.DeepCopy()
	heartbeat.ResourceVersion = "2"
	heartbeat.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	relabelled := node.DeepCopy()
	relabelled.Labels["cpu-feature.node.kubevirt.io/avx2"] = "true"
	cordoned := node.DeepCopy()
	cordoned.Spec.Unschedulable = true
	for _, c := range []struct {
		name string
		new  *corev1.Node
		want bool
	}{
		{"status only", heartbeat, false},
		{"a label added", relabelled, true},
		{"cordoned", cordoned, true},
	} {
		if got := levelInputsChanged.Update(event.UpdateEvent{ObjectOld: node, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if !levelInputsChanged.Create(event.CreateEvent{Object: node}) || !levelInputsChanged.Delete(event.DeleteEvent{Object: node}) {
		t.Error("a node's creation and deletion must reach the labeller")
	}
}
