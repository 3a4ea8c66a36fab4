package kinds

import (
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func TestClusterKubeVirt(t *testing.T) {
	if ClusterKubeVirt(nil) != nil {
		t.Error("no KubeVirt CR: want nil")
	}
	at := func(name string, created time.Time) unstructured.Unstructured {
		kv := NewObject(KubeVirt)
		kv.SetName(name)
		kv.SetCreationTimestamp(metav1.NewTime(created))
		return *kv
	}
	now := time.Now()
	items := []unstructured.Unstructured{at("second", now), at("first", now.Add(-time.Hour)), at("third", now.Add(time.Hour))}
	if got := ClusterKubeVirt(items); got == nil || got.GetName() != "first" {
		t.Errorf("several KubeVirt CRs: want the oldest, got %v", got)
	}
}

func TestNewList(t *testing.T) {
	if got := NewList(VirtualMachineInstanceMigration).GetKind(); got != "VirtualMachineInstanceMigrationList" {
		t.Errorf("list kind %q", got)
	}
}

func TestAdmitted(t *testing.T) {
	req := func(op admissionv1.Operation, raw string) admission.Request {
		return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Object: runtime.RawExtension{Raw: []byte(raw)}}}
	}
	if _, resp := Admitted(req(admissionv1.Delete, `{}`), MigrationPolicy); resp == nil || !resp.Allowed {
		t.Errorf("DELETE: want allowed untouched, got %+v", resp)
	}
	if _, resp := Admitted(req(admissionv1.Create, `[`), MigrationPolicy); resp == nil || resp.Result.Code != http.StatusBadRequest ||
		!strings.Contains(resp.Result.Message, "decode MigrationPolicy") {
		t.Errorf("malformed object: want 400 naming the kind, got %+v", resp)
	}
	obj, resp := Admitted(req(admissionv1.Update, `{"metadata":{"name":"db"}}`), MigrationPolicy)
	if resp != nil || obj.GetName() != "db" {
		t.Errorf("UPDATE: want the object, got %v, %+v", obj, resp)
	}
}

func TestCondition(t *testing.T) {
	obj := NewObject(VirtualMachineInstanceMigration)
	if Condition(obj, "Ready") != nil {
		t.Error("no status: want no condition")
	}
	obj.Object["status"] = map[string]any{"conditions": []any{
		"not a condition",
		map[string]any{"type": "Other", "status": "True"},
		map[string]any{"type": "Ready", "status": "False"},
	}}
	if c := Condition(obj, "Ready"); c == nil || c["status"] != "False" {
		t.Errorf("want the Ready condition, got %v", c)
	}
}
