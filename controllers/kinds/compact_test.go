package kinds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virt-rules/virt-rules/internal/heapsize"
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

// metadataVMI is VMI i as the manager's metadata-only cache gets it at scale: test/scale's
// vmiObject labels, KubeVirt's API-version annotations, and the migrationpolicy controller's
// policy and configuration annotations (one of 100 policies' here).
func metadataVMI(i int) []byte {
	size := "small"
	if i%3 == 0 {
		size = "large"
	}
	policy := i % 100
	m := metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("vmi-%05d", i), Namespace: fmt.Sprintf("scale-%02d", i%20),
			UID: types.UID(fmt.Sprintf("0b7c52e1-6a3d-4f0e-8d21-%012d", i)), ResourceVersion: fmt.Sprint(200000 + i),
			Generation: 1, CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 28, 9, 0, i%60, 0, time.UTC)),
			Labels:     map[string]string{"team": fmt.Sprintf("t%03d", i%250), "size": size},
			Finalizers: []string{"kubevirt.io/foregroundDeleteVirtualMachine"},
			Annotations: map[string]string{
				"kubevirt.io/latest-observed-api-version":  "v1",
				"kubevirt.io/storage-observed-api-version": "v1",
				"migrations.virt-rules.io/policy":          fmt.Sprintf("t%03d-policy-%d", policy%250, policy),
				"migrations.virt-rules.io/configuration": fmt.Sprintf(`{"allowAutoConverge":false,"allowPostCopy":false,`+
					`"bandwidthPerMigration":"%dMi","completionTimeoutPerGiB":150,"parallelMigrationsPerCluster":5,`+
					`"parallelOutboundMigrationsPerNode":2,"progressTimeout":150,"unsafeMigrationOverride":false}`, 64*(1+policy%4)),
			},
		},
	}
	data, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return data
}

// TestMetadataVMICacheHeap measures the live heap per VMI of the manager's metadata-only VMI
// cache, decoded as JSON, with managedFields stripped as before and with CacheTransform. Run
// with -v for figures.
func TestMetadataVMICacheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("heap measurement")
	}
	const n = 5000
	encoded := make([][]byte, n)
	for i := range encoded {
		encoded[i] = metadataVMI(i)
	}
	var results []int64
	for _, tc := range []struct {
		name string
		f    func(any) (any, error)
	}{{"strip managedFields:", stripManagedFields}, {"CacheTransform:", CacheTransform}} {
		before := heapsize.Live()
		kept := make([]*metav1.PartialObjectMetadata, n)
		for i, data := range encoded {
			m := &metav1.PartialObjectMetadata{}
			if err := json.Unmarshal(data, m); err != nil {
				t.Fatal(err)
			}
			obj, err := tc.f(m)
			if err != nil {
				t.Fatal(err)
			}
			kept[i] = obj.(*metav1.PartialObjectMetadata)
		}
		after := heapsize.Live()
		runtime.KeepAlive(kept)
		perObject := (int64(after) - int64(before)) / n
		t.Logf("metadata-only VMI %-21s %5d B/object (%d VMIs)", tc.name, perObject, n)
		results = append(results, perObject)
		if want := metadataVMI(7); !bytes.Equal(must(json.Marshal(kept[7])), want) {
			t.Errorf("%s changed VMI 7: %s", tc.name, must(json.Marshal(kept[7])))
		}
	}
	runtime.KeepAlive(encoded)
	if results[1] >= results[0] {
		t.Errorf("CacheTransform keeps %d B/VMI, no less than %d", results[1], results[0])
	}
}

func must(data []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return data
}
