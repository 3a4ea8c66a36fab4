//go:build virtrules_oracle

package main

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"

	instancetypev1beta1api "kubevirt.io/api/instancetype/v1beta1"
)

// addReferences puts the instancetypes, preferences (instancetype.kubevirt.io/v1beta1) and
// ControllerRevisions among docs into the offline cluster, so that KubeVirt's own lookups find
// what a VM refers to (its VM mutating and validating webhooks, and virt-controller's
// instancetype handler when it starts the VM), as in a cluster holding them. A namespaced one
// without a namespace is in "default", as kubectl would create it.
func (c *cluster) addReferences(docs []document) error {
	for _, d := range docs {
		gvk := d.obj.GroupVersionKind()
		var obj runtime.Object
		tracker := c.client.kubevirt.Tracker()
		namespaced := true
		switch {
		case gvk.Group == instancetypev1beta1api.SchemeGroupVersion.Group && gvk.Version == "v1beta1":
			switch gvk.Kind {
			case "VirtualMachineInstancetype":
				obj = &instancetypev1beta1api.VirtualMachineInstancetype{}
			case "VirtualMachineClusterInstancetype":
				obj, namespaced = &instancetypev1beta1api.VirtualMachineClusterInstancetype{}, false
			case "VirtualMachinePreference":
				obj = &instancetypev1beta1api.VirtualMachinePreference{}
			case "VirtualMachineClusterPreference":
				obj, namespaced = &instancetypev1beta1api.VirtualMachineClusterPreference{}, false
			default:
				continue
			}
		case gvk.Group == appsv1.GroupName && gvk.Kind == "ControllerRevision":
			obj, tracker = &appsv1.ControllerRevision{}, c.client.Clientset.Tracker()
		default:
			continue
		}
		if namespaced && d.obj.GetNamespace() == "" {
			d.obj.SetNamespace("default")
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.obj.Object, obj); err != nil {
			return fmt.Errorf("%s: decode the %s: %w", d.source, gvk.Kind, err)
		}
		if err := tracker.Add(obj); err != nil {
			return fmt.Errorf("%s: add the %s to the offline cluster: %w", d.source, gvk.Kind, err)
		}
	}
	return nil
}
