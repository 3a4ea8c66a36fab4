package engine

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
			// Each VM its own name and UIDs, as a pool's are (the captured VM is cap-1).
			own := bytes.ReplaceAll(data, []byte("cap-1"), fmt.Appendf(nil, "c%04d", i))
			own = capturedUID.ReplaceAllFunc(own, func(u []byte) []byte { return fmt.Appendf(nil, "%s%012d", u[:24], i) })
			obj, _, err := unstructured.UnstructuredJSONScheme.Decode(own, nil, nil)
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
		if _, err := newTermBuilder().objects(objs); err != nil {
			b.Fatal(err)
		}
	}
}

// capturedUID matches the UIDs of a captured object.
var capturedUID = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
