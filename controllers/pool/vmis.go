package pool

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
)

// NewVMICache is the pool controller's own cache of VMIs, in namespaces (none: every
// namespace). The manager's cache keeps VMIs as metadata only (controllers.ManagerOptions):
// the migrationpolicy controller reads nothing else, and at 10,000 VMIs whole objects would be
// most of the controller's memory. A plan reads its VMs' VMIs whole (status, conditions), and
// those are the VMIs a VirtualMachine controls; this cache keeps them whole (without
// managedFields) and every other VMI as its identity only (stubVMI), which the controller
// never hands to a plan (isStub). Run it with the manager (mgr.Add).
func NewVMICache(cfg *rest.Config, o cache.Options, namespaces []string) (cache.Cache, error) {
	if len(namespaces) > 0 {
		o.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			o.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	o.ByObject = map[client.Object]cache.ByObject{kinds.NewObject(GVKVMI): {Transform: keepVMsVMIs}}
	c, err := cache.New(cfg, o)
	if err != nil {
		return nil, fmt.Errorf("pool controller's VMI cache: %w", err)
	}
	return c, nil
}

// stubAnnotation marks a VMI this cache keeps as its identity only.
const stubAnnotation = "pool.virt-rules.io/cache-stub"

// keepVMsVMIs is the cache's transform: a VMI a VirtualMachine controls, without its
// managedFields and compacted (kinds.Compact); any other VMI, its identity only.
func keepVMsVMIs(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	if ref := metav1.GetControllerOfNoCopy(u); ref != nil && ref.Kind == GVKVirtualMachine.Kind && ref.APIVersion == GVKVirtualMachine.GroupVersion().String() {
		u.SetManagedFields(nil)
		kinds.Compact(u)
		return u, nil
	}
	return stubVMI(u), nil
}

// stubVMI is u's identity: kind, name, namespace, UID and resourceVersion, marked as a stub.
func stubVMI(u *unstructured.Unstructured) *unstructured.Unstructured {
	s := &unstructured.Unstructured{}
	s.SetGroupVersionKind(u.GroupVersionKind())
	s.SetNamespace(u.GetNamespace())
	s.SetName(u.GetName())
	s.SetUID(u.GetUID())
	s.SetResourceVersion(u.GetResourceVersion())
	s.SetAnnotations(map[string]string{stubAnnotation: "true"})
	return s
}

// isStub tells a VMI this cache kept as its identity only: one no VirtualMachine controls.
func isStub(u *unstructured.Unstructured) bool {
	_, ok := u.GetAnnotations()[stubAnnotation]
	return ok
}

// Whole tells a VMI this cache (NewVMICache) keeps whole, as a VirtualMachine's, from the
// identity it keeps of any other VMI.
func Whole(u *unstructured.Unstructured) bool { return !isStub(u) }
