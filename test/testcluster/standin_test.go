package testcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

var stepTime = time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC)

func vmi(status map[string]any) *unstructured.Unstructured {
	v := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "db", "namespace": "prod", "labels": map[string]any{"kubevirt.io/nodeName": "node-1"}},
		"spec":     map[string]any{"domain": map[string]any{"devices": map[string]any{"interfaces": []any{map[string]any{"name": "default"}}}}},
	}}
	if status != nil {
		v.Object["status"] = status
	}
	return v
}

// TestStepWalksAVMIThroughWhatVirtHandlerWrites follows one VMI from Scheduled through a
// migration, one write at a time, as the stand-in does.
func TestStepWalksAVMIThroughWhatVirtHandlerWrites(t *testing.T) {
	v := vmi(map[string]any{"phase": "Scheduled", "nodeName": "node-1", "conditions": []any{
		map[string]any{"type": "Ready", "status": "False"}, map[string]any{"type": "LiveMigratable", "status": "False"},
	}})
	next, step := Step(v, stepTime)
	if next == nil || step != "domain started on node-1: Running" {
		t.Fatalf("Scheduled: got step %q", step)
	}
	status := next.Object["status"].(map[string]any)
	if status["phase"] != "Running" || status["selinuxContext"] != "none" || status["machine"].(map[string]any)["type"] != MachineType {
		t.Errorf("Running status: %v", status)
	}
	if stamps := status["phaseTransitionTimestamps"].([]any); len(stamps) != 1 || stamps[0].(map[string]any)["phase"] != "Running" {
		t.Errorf("phaseTransitionTimestamps: virt-handler records entering Running (KubeVirt's VM controller reads it): %v", stamps)
	}
	conditions := map[string]any{}
	for _, c := range status["conditions"].([]any) {
		conditions[c.(map[string]any)["type"].(string)] = c.(map[string]any)["status"]
	}
	if conditions["Ready"] != "False" || conditions["LiveMigratable"] != "True" || conditions["AgentConnected"] != "True" {
		t.Errorf("conditions: Ready is virt-controller's, the rest virt-handler's: %v", conditions)
	}
	if ifaces := status["interfaces"].([]any); len(ifaces) != 1 || ifaces[0].(map[string]any)["name"] != "default" {
		t.Errorf("interfaces: %v", ifaces)
	}
	if again, _ := Step(next, stepTime); again != nil {
		t.Errorf("a Running VMI without a migration needs no write")
	}

	// virt-controller hands the migration off.
	status["migrationState"] = map[string]any{"targetNode": "node-2", "sourceNode": "node-1", "sourcePod": "virt-launcher-db-1"}
	next.SetLabels(map[string]string{"kubevirt.io/nodeName": "node-1", "kubevirt.io/migrationTargetNodeName": "node-2"})
	held := next.DeepCopy()
	held.SetAnnotations(map[string]string{AnnotationHoldMigration: "true"})
	if again, step := Step(held, stepTime); again != nil {
		t.Errorf("a held migration needs no write, got step %q", step)
	}
	for _, want := range []string{"migration target prepared on node-2", "migration to node-2 started", "migration to node-2 completed"} {
		if next, step = Step(next, stepTime); next == nil || step != want {
			t.Fatalf("got step %q, want %q", step, want)
		}
	}
	status = next.Object["status"].(map[string]any)
	m := status["migrationState"].(map[string]any)
	if status["nodeName"] != "node-2" || m["completed"] != true || m["targetNodeDomainDetected"] != true || m["mode"] != "PreCopy" {
		t.Errorf("completed migration: %v", status)
	}
	if labels := next.GetLabels(); labels["kubevirt.io/nodeName"] != "node-2" || labels["kubevirt.io/migrationTargetNodeName"] != "" {
		t.Errorf("labels after the migration: %v", labels)
	}
	if again, _ := Step(next, stepTime); again != nil {
		t.Errorf("a completed migration needs no write")
	}
}

func TestStepStopsDeletedVMIsAndFailsThoseAskedTo(t *testing.T) {
	deleting := vmi(map[string]any{"phase": "Running", "nodeName": "node-1"})
	now := metav1.NewTime(stepTime)
	deleting.SetDeletionTimestamp(&now)
	if next, step := Step(deleting, stepTime); next == nil || next.Object["status"].(map[string]any)["phase"] != "Succeeded" {
		t.Errorf("deleted Running VMI: %q", step)
	} else if stamps := next.Object["status"].(map[string]any)["phaseTransitionTimestamps"].([]any); len(stamps) != 1 || stamps[0].(map[string]any)["phase"] != "Succeeded" {
		t.Errorf("phaseTransitionTimestamps of a stopped VMI: %v", stamps)
	}
	unscheduled := vmi(map[string]any{"phase": "Pending"})
	unscheduled.SetDeletionTimestamp(&now)
	if next, _ := Step(unscheduled, stepTime); next != nil {
		t.Errorf("a VMI on no node is virt-controller's to finalize, not virt-handler's")
	}
	failing := vmi(map[string]any{"phase": "Scheduled", "nodeName": "node-1"})
	failing.SetAnnotations(map[string]string{AnnotationFailStart: "true"})
	if next, step := Step(failing, stepTime); next == nil || next.Object["status"].(map[string]any)["phase"] != "Failed" {
		t.Errorf("fail-start VMI: %q", step)
	}
	if next, _ := Step(vmi(nil), stepTime); next != nil {
		t.Errorf("a VMI without status needs no write")
	}
}

func TestKwokStagesAddImageIDToPodReady(t *testing.T) {
	assets := t.TempDir()
	stages := filepath.Join(assets, "kwok-stages")
	if err := os.MkdirAll(stages, 0o755); err != nil {
		t.Fatal(err)
	}
	podReady := "      containerStatuses:\n      {{ range .spec.containers }}\n      - image: {{ .image | Quote }}\n        name: {{ .name | Quote }}\n      {{ end }}\n"
	for _, name := range kwokStageFiles {
		body := "kind: Stage # " + name + "\n"
		if name == "pod-ready.yaml" {
			body += podReady
		}
		if err := os.WriteFile(filepath.Join(stages, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := kwokStages(assets)
	if err != nil {
		t.Fatal(err)
	}
	want := "      - image: {{ .image | Quote }}\n        imageID: {{ printf \"%s@" + ImageDigest + "\" .image | Quote }}\n        name:"
	if !strings.Contains(string(got), want) || strings.Count(string(got), "---") != len(kwokStageFiles) ||
		!strings.HasSuffix(string(got), "---\n"+kwokConfiguration) {
		t.Errorf("stages:\n%s", got)
	}

	// A kwok whose pod-ready stage no longer has that line is refused, not silently used.
	if err := os.WriteFile(filepath.Join(stages, "pod-ready.yaml"), []byte("kind: Stage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := kwokStages(assets); err == nil || !strings.Contains(err.Error(), "no line") {
		t.Errorf("pod-ready without the image line: err %v", err)
	}
}
