package pool

import (
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/pool/pooltest"
	"github.com/virt-rules/virt-rules/internal/heapsize"
)

// measuredObjects is how many VMs and VMIs the heap measurement holds.
const measuredObjects = 1000

// informerObjects decodes data n times as an unstructured informer does and runs each
// through transform.
func informerObjects(t *testing.T, data []byte, n int, transform func(any) (any, error)) []any {
	t.Helper()
	out := make([]any, n)
	for i := range out {
		obj, _, err := unstructured.UnstructuredJSONScheme.Decode(pooltest.Copy(data, i), nil, nil)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if out[i], err = transform(obj); err != nil {
			t.Fatalf("transform: %v", err)
		}
	}
	return out
}

// TestPoolCacheHeap measures the live heap per object of the pool controller's caches: a VM
// of a pool (the manager's unstructured cache, managedFields stripped) and its running VMI
// (NewVMICache, keepVMsVMIs), each as the test cluster's KubeVirt made it
// (testdata/capture-*.json: a pool VM and its VMI Running and Ready, as kube-apiserver served
// them, virt-controller's, virt-api's and the virt-handler stand-in's writes; captured from
// test/kubevirt's cluster), before and after kinds.Compact. Run with -v for figures.
func TestPoolCacheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("heap measurement")
	}
	strip := cache.TransformStripManagedFields()
	// Per kind, the first transform's bytes and object: the others must keep fewer bytes
	// and equal content.
	firstBytes, firstObject := map[string]int64{}, map[string]any{}
	for _, tc := range []struct {
		kind, file, transform string
		f                     func(any) (any, error)
	}{
		{"VirtualMachine", "capture-vm.json", "strip managedFields", strip},
		{"VirtualMachine", "capture-vm.json", "kinds.CacheTransform", kinds.CacheTransform},
		{"VirtualMachineInstance", "capture-vmi.json", "strip managedFields", strip},
		{"VirtualMachineInstance", "capture-vmi.json", "keepVMsVMIs", keepVMsVMIs},
	} {
		data, err := os.ReadFile(filepath.Join("testdata", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		before := heapsize.Live()
		kept := informerObjects(t, data, measuredObjects, tc.f)
		after := heapsize.Live()
		if u := kept[0].(*unstructured.Unstructured); u.GroupVersionKind() != (schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: tc.kind}) || isStub(u) {
			t.Fatalf("%s: kept %v", tc.file, u.GroupVersionKind())
		}
		runtime.KeepAlive(kept)
		perObject := (int64(after) - int64(before)) / measuredObjects
		t.Logf("%-22s %-20s %6d B/object (%d B of JSON)", tc.kind, tc.transform+":", perObject, len(data))
		if want, ok := firstObject[tc.kind]; !ok {
			firstBytes[tc.kind], firstObject[tc.kind] = perObject, kept[0]
		} else {
			if !reflect.DeepEqual(kept[0], want) {
				t.Errorf("%s: %s changed the content", tc.kind, tc.transform)
			}
			if perObject >= firstBytes[tc.kind] {
				t.Errorf("%s: %s keeps %d B/object, no less than %d", tc.kind, tc.transform, perObject, firstBytes[tc.kind])
			}
		}
	}
}

// BenchmarkVMICacheTransform is the informer's work per VMI event, decode and transform, with
// managedFields stripped alone and with keepVMsVMIs (which compacts): the CPU the heap saving
// costs.
func BenchmarkVMICacheTransform(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("testdata", "capture-vmi.json"))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		f    func(any) (any, error)
	}{{"strip", cache.TransformStripManagedFields()}, {"keepVMsVMIs", keepVMsVMIs}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				obj, _, err := unstructured.UnstructuredJSONScheme.Decode(data, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := bc.f(obj); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
