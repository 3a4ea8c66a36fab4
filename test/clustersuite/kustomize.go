package clustersuite

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Kustomize is `kubectl kustomize DIR` (kustomize's library with kubectl's defaults: files
// only under the kustomization's root, no plugins), in kustomize's order.
func Kustomize(dir string) []*unstructured.Unstructured {
	GinkgoHelper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	Expect(err).NotTo(HaveOccurred(), "kustomize build %s", dir)
	var objs []*unstructured.Unstructured
	for _, r := range resources.Resources() {
		data, err := r.MarshalJSON()
		Expect(err).NotTo(HaveOccurred())
		o := &unstructured.Unstructured{}
		Expect(o.UnmarshalJSON(data)).To(Succeed())
		objs = append(objs, o)
	}
	return objs
}
