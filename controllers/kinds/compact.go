package kinds

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/virt-rules/virt-rules/internal/intern"
)

// Compact makes u's content share its map keys and short string values with every other
// object compacted: a decoded unstructured object holds its own copy of each, boxed, and
// thousands of VMs repeat the same ones. The content is equal, field for field; u's maps and
// slices are fresh and its own, so it may be changed as before.
func Compact(u *unstructured.Unstructured) {
	if u.Object != nil {
		u.Object = intern.Default.JSON(u.Object, intern.Repeated).(map[string]any)
	}
}

var stripManagedFields = cache.TransformStripManagedFields()

// CacheTransform is the controllers' cache transform: no managedFields (no controller reads
// them, often the largest part of a stored object), unstructured objects compacted, and
// metadata-only objects (the 10,000 VMIs) sharing their label and annotation strings, however
// long: the migrationpolicy controller writes the same configuration on every VMI of a policy.
func CacheTransform(obj any) (any, error) {
	obj, err := stripManagedFields(obj)
	if err != nil {
		return nil, err
	}
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		Compact(o)
	case *metav1.PartialObjectMetadata:
		o.Labels = intern.Default.Strings(o.Labels)
		o.Annotations = intern.Default.Strings(o.Annotations)
	}
	return obj, nil
}
