package kinds

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// CacheTransform drops managedFields of any object and keeps an unstructured object's content
// otherwise equal.
func TestCacheTransform(t *testing.T) {
	u := NewObject(VirtualMachine)
	u.SetName("vm-1")
	u.SetLabels(map[string]string{"pool": "web"})
	u.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "virt-controller"}})
	if err := unstructured.SetNestedField(u.Object, "Always", "spec", "runStrategy"); err != nil {
		t.Fatal(err)
	}
	want := u.DeepCopy()
	want.SetManagedFields(nil)
	got, err := CacheTransform(u)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.(*unstructured.Unstructured).Object, want.Object) {
		t.Errorf("got %v, want %v", got, want)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}}}
	if got, err := CacheTransform(pod); err != nil || got.(*corev1.Pod).ManagedFields != nil || got.(*corev1.Pod).Name != "p" {
		t.Errorf("a typed object: got %v, %v", got, err)
	}
}
