package launcher

import (
	"encoding/json"
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func request(t *testing.T, op admissionv1.Operation, pod any) admission.Request {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: op, Namespace: "vms", Object: runtime.RawExtension{Raw: raw},
	}}
}

func launcherPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "virt-launcher-a", Labels: map[string]string{LabelApp: App}}}
}

func TestDecode(t *testing.T) {
	if _, resp := Decode(request(t, admissionv1.Update, launcherPod())); resp == nil || !resp.Allowed {
		t.Errorf("UPDATE: want allowed untouched, got %+v", resp)
	}
	other := launcherPod()
	other.Labels = map[string]string{"app": "web"}
	if _, resp := Decode(request(t, admissionv1.Create, other)); resp == nil || !resp.Allowed || len(resp.Patches) > 0 {
		t.Errorf("other pod: want allowed untouched, got %+v", resp)
	}
	if _, resp := Decode(request(t, admissionv1.Create, "not a pod")); resp == nil || resp.Result.Code != http.StatusBadRequest {
		t.Errorf("malformed pod: want 400, got %+v", resp)
	}
	pod, resp := Decode(request(t, admissionv1.Create, launcherPod()))
	if resp != nil || pod == nil || pod.Namespace != "vms" {
		t.Fatalf("launcher pod: want it decoded in the request's namespace, got %v, %+v", pod, resp)
	}
	if NodeAffinity(pod) != nil {
		t.Errorf("NodeAffinity of a pod without one: want nil")
	}
}

func TestWithNodeAffinity(t *testing.T) {
	req := request(t, admissionv1.Create, launcherPod())
	pod, _ := Decode(req)
	want := &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-2"}},
		}}},
	}}
	resp := WithNodeAffinity(req, pod, want)
	if !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("want an allowed patch, got %+v", resp)
	}
	found := false
	for _, p := range resp.Patches {
		if p.Path == "/spec/affinity" {
			found = true
		}
	}
	if !found {
		t.Errorf("want a patch of /spec/affinity, got %+v", resp.Patches)
	}
}
