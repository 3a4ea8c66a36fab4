package nodetrim_test

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/virt-rules/virt-rules/internal/nodetrim"
)

// fullNode is a node as a kubelet and the node labeller leave it, every field of its status and
// its metadata's managedFields set: whatever a trim keeps or drops shows.
func fullNode() *corev1.Node {
	at := metav1.NewTime(time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC))
	quantities := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi")}
	return &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "worker-7", UID: "4f6c1a52-0d3e-4b7a-9c1e-000000000007", ResourceVersion: "100007", Generation: 1,
			CreationTimestamp: at,
			Labels:            map[string]string{"cpu-feature.node.kubevirt.io/avx2": "true", "topology.kubernetes.io/zone": "zone-3"},
			Annotations:       map[string]string{"kubevirt.io/heartbeat": "2026-11-28T09:00:00Z"},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &at,
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:allocatable":{}}}`)}, Subresource: "status",
			}},
		},
		Spec: corev1.NodeSpec{
			PodCIDR: "10.244.7.0/24", ProviderID: "kind://worker-7", Unschedulable: true,
			Taints: []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Capacity: quantities, Allocatable: quantities,
			Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
				LastHeartbeatTime: at, LastTransitionTime: at,
			}},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.18.0.7"}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo: corev1.NodeSystemInfo{
				MachineID: "m7", KernelVersion: "6.8.0", OSImage: "Debian GNU/Linux 12", ContainerRuntimeVersion: "containerd://1.7.13",
				KubeletVersion: "v1.35.4", OperatingSystem: "linux", Architecture: "amd64",
			},
			Images:           []corev1.ContainerImage{{Names: []string{"quay.io/kubevirt/virt-launcher:v1.6.0"}, SizeBytes: 400 << 20}},
			VolumesInUse:     []corev1.UniqueVolumeName{"kubernetes.io/csi/disk-7"},
			VolumesAttached:  []corev1.AttachedVolume{{Name: "kubernetes.io/csi/disk-7", DevicePath: "/dev/vdb"}},
			Config:           &corev1.NodeConfigStatus{Error: "none"},
			RuntimeHandlers:  []corev1.NodeRuntimeHandler{{Name: "runc"}},
			Features:         &corev1.NodeFeatures{SupplementalGroupsPolicy: new(bool)},
			DeclaredFeatures: []string{"SupplementalGroupsPolicy"},
		},
	}
}

// TestTypedAndUnstructuredAlike trims one node both ways, typed (the manager's cache) and
// unstructured (eval's manifests), and compares the typed result converted to unstructured with
// the unstructured one: a field either keeps and the other drops fails it.
func TestTypedAndUnstructuredAlike(t *testing.T) {
	node := fullNode()
	status := reflect.ValueOf(node.Status)
	for i := range status.NumField() {
		if status.Field(i).IsZero() {
			t.Fatalf("the test node leaves status.%s unset: set it, so that the trims are compared on it", status.Type().Field(i).Name)
		}
	}

	typed := node.DeepCopy()
	nodetrim.Typed(typed)
	fromTyped, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := runtime.DefaultUnstructuredConverter.ToUnstructured(node)
	if err != nil {
		t.Fatal(err)
	}
	untouched, err := runtime.DefaultUnstructuredConverter.ToUnstructured(node)
	if err != nil {
		t.Fatal(err)
	}
	unstructured := make(map[string]any, len(whole))
	for k, v := range whole {
		unstructured[k] = v
	}
	nodetrim.Unstructured(unstructured)
	if !reflect.DeepEqual(whole, untouched) {
		t.Errorf("Unstructured changed the maps of the object it was given a shallow copy of")
	}

	// A typed node cannot omit a struct field without omitempty (status.nodeInfo,
	// status.daemonEndpoints): converted, it holds the zero value's fields where the
	// unstructured trim holds none. Anything else either keeps and the other does not fails.
	zero, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range differences("", fromTyped, unstructured, zero) {
		t.Error(d)
	}
	// What both keep is the rule's: not everything, not nothing.
	meta := unstructured["metadata"].(map[string]any)
	if _, ok := meta["managedFields"]; ok {
		t.Errorf("managedFields kept")
	}
	for _, k := range []string{"name", "uid", "resourceVersion", "labels", "annotations"} {
		if _, ok := meta[k]; !ok {
			t.Errorf("metadata.%s dropped", k)
		}
	}
	if !reflect.DeepEqual(unstructured["spec"], whole["spec"]) {
		t.Errorf("spec changed")
	}
	kept := slices.Sorted(func(yield func(string) bool) {
		for k := range unstructured["status"].(map[string]any) {
			if !yield(k) {
				return
			}
		}
	})
	if !slices.Equal(kept, []string{"allocatable", "conditions"}) {
		t.Errorf("status keeps %v, want allocatable and conditions", kept)
	}
}

// A node without status or metadata is left as it is.
func TestUnstructuredPartial(t *testing.T) {
	node := map[string]any{"apiVersion": "v1", "kind": "Node", "spec": map[string]any{"unschedulable": true}}
	nodetrim.Unstructured(node)
	if len(node) != 3 || node["spec"].(map[string]any)["unschedulable"] != true {
		t.Errorf("got %v", node)
	}
}

// differences says where typed (a typed trim, converted) and unstructured (the unstructured
// trim) differ, under path: a field one keeps and the other drops, or a value not the same. A
// field only typed keeps, with the value zero (a zero node, converted) has there, counts as
// dropped.
func differences(path string, typed, unstructured, zero any) []string {
	tm, tok := typed.(map[string]any)
	um, uok := unstructured.(map[string]any)
	if !tok || !uok {
		if !reflect.DeepEqual(typed, unstructured) {
			return []string{fmt.Sprintf("%s: typed trim %v, unstructured trim %v", path, typed, unstructured)}
		}
		return nil
	}
	zm, _ := zero.(map[string]any)
	var out []string
	for k, tv := range tm {
		uv, ok := um[k]
		if !ok {
			if zv, isZero := zm[k]; isZero && reflect.DeepEqual(tv, zv) {
				continue
			}
			out = append(out, fmt.Sprintf("%s.%s: the typed trim keeps it (%v), the unstructured trim drops it", path, k, tv))
			continue
		}
		out = append(out, differences(path+"."+k, tv, uv, zm[k])...)
	}
	for k, uv := range um {
		if _, ok := tm[k]; !ok {
			out = append(out, fmt.Sprintf("%s.%s: the unstructured trim keeps it (%v), the typed trim drops it", path, k, uv))
		}
	}
	return out
}
