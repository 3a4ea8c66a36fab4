package engine

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/controllers/pool/pooltest"
)

// BenchmarkTermBuilderCaptured converts a pool's input of 100 VMs and their VMIs as KubeVirt
// made them in the test cluster (controllers/pool/testdata/capture-*.json, without
// managedFields, as the pool controller's caches keep them): what a pool plan's input costs in
// a cluster, where objects carry KubeVirt's whole spec and status. The pool plan benchmarks'
// made-up VMs are far smaller.
func BenchmarkTermBuilderCaptured(b *testing.B) {
	var objs []*unstructured.Unstructured
	for _, file := range []string{"capture-vm.json", "capture-vmi.json"} {
		data, err := os.ReadFile(filepath.Join("..", "controllers", "pool", "testdata", file))
		if err != nil {
			b.Fatal(err)
		}
		for i := range 100 {
			// Each VM its own name and UIDs, as a pool's are.
			obj, _, err := unstructured.UnstructuredJSONScheme.Decode(pooltest.Copy(data, i), nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			u := obj.(*unstructured.Unstructured)
			u.SetManagedFields(nil)
			objs = append(objs, u)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := newTermBuilder(nil).objects(objs); err != nil {
			b.Fatal(err)
		}
	}
}
