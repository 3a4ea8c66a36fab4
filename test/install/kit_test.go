package install_test

import (
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// fieldManager is kubectl's, as `kubectl apply --server-side` writes.
const fieldManager = "kubectl"

// render is `kubectl kustomize DIR` of the repository's DIR.
func render(dir string) []*unstructured.Unstructured {
	GinkgoHelper()
	return clustersuite.Kustomize(filepath.Join(repoRoot, dir))
}

// applyAll is `kubectl apply --server-side`: each object in order.
func applyAll(objs []*unstructured.Unstructured) {
	GinkgoHelper()
	for _, o := range objs {
		Expect(k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner(fieldManager), client.ForceOwnership)).
			To(Succeed(), "apply %s %s", o.GetKind(), o.GetName())
	}
}

// kinds lists the objects' kinds in order.
func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind())
	}
	return out
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	GinkgoHelper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	Fail("no " + kind + " " + name + " in the kit")
	return nil
}
