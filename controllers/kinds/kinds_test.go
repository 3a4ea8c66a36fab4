package kinds

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
