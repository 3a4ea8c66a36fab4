package controllers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"maps"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/heapsize"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/internal/nodetrim"
	"github.com/virt-rules/virt-rules/test/reference"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// measuredNodes is how many nodes the heap measurement holds; per-node bytes hardly move
// between 1,000 and 5,000.
const measuredNodes = 2000

// cpuGenerations are the scale harness's node generations (test/scale/nodes_test.go
// generations): model and newest feature, oldest first; a generation runs the older ones'
// models and has their features.
var cpuGenerations = [][2]string{
	{"Haswell-noTSX-IBRS", "avx2"}, {"Broadwell-noTSX-IBRS", "adx"}, {"Skylake-Client-IBRS", "clflushopt"},
	{"Cascadelake-Server", "avx512vnni"}, {"Icelake-Server", "avx512vbmi2"},
}

// scaleLikeNode is node i as the scale harness creates it (scaleNode: testcluster.Node with its
// generation's labels and a zone), then as kube-apiserver, kwok (node-initialize stage) and the
// node labeller leave it: identity and managedFields, Ready and the pressure conditions,
// addresses, daemon endpoints, nodeInfo, phase, and the migratability level label.
func scaleLikeNode(i int) *corev1.Node {
	g := i % len(cpuGenerations)
	cpu := testcluster.CPU{Vendor: "Intel", HostModel: cpuGenerations[g][0]}
	labels := map[string]string{
		"topology.kubernetes.io/zone":       fmt.Sprintf("zone-%d", i%4),
		"migratability.virt-rules.io/level": "100",
	}
	for j := g; j >= 0; j-- {
		cpu.Models = append(cpu.Models, cpuGenerations[j][0])
	}
	for j := 0; j <= g; j++ {
		labels[reference.CPUFeatureLabelPrefix+cpuGenerations[j][1]] = "true"
	}
	labels[reference.HostModelRequiredFeaturesPrefix+cpuGenerations[g][1]] = "true"
	name := fmt.Sprintf("scale-node-%05d", i)
	n := testcluster.Node(name, cpu, labels)

	created := metav1.NewTime(time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC))
	heartbeat := metav1.NewTime(created.Add(time.Duration(i) * time.Second))
	n.UID = types.UID(fmt.Sprintf("4f6c1a52-0d3e-4b7a-9c1e-%012d", i))
	n.ResourceVersion = fmt.Sprint(100000 + i)
	n.CreationTimestamp = created
	for _, m := range []struct{ manager, op, sub string }{
		{"scale.test", "Update", ""}, {"kwok", "Update", "status"}, {"virt-rules-nodelabeller", "Update", ""},
	} {
		n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{
			Manager: m.manager, Operation: metav1.ManagedFieldsOperationType(m.op), APIVersion: "v1",
			Time: &created, FieldsType: "FieldsV1", Subresource: m.sub,
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:topology.kubernetes.io/zone":{},"f:cpu-feature.node.kubevirt.io/avx2":{}}},"f:status":{"f:allocatable":{"f:cpu":{},"f:memory":{}},"f:capacity":{"f:cpu":{},"f:memory":{}}}}`)},
		})
	}
	condition := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, message string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: message, LastHeartbeatTime: heartbeat, LastTransitionTime: created}
	}
	n.Status.Conditions = []corev1.NodeCondition{
		condition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
		condition(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
		condition(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
		condition(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
		condition(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "RouteCreated", "RouteController created a route"),
	}
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)},
		{Type: corev1.NodeHostName, Address: name},
	}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		Architecture: "amd64", ContainerRuntimeVersion: "kwok-v0.8.0", KernelVersion: "kwok-v0.8.0",
		KubeProxyVersion: "kwok-v0.8.0", KubeletVersion: "kwok-v0.8.0", OperatingSystem: "linux",
	}
	n.Status.Phase = corev1.NodeRunning
	return n
}

// informerNodes encodes nodes as kube-apiserver serves them to the manager's informer
// (protobuf, controller-runtime's choice for built-in kinds), decodes each as the informer
// does and runs it through transform.
func informerNodes(t testing.TB, nodes []*corev1.Node, transform toolscache.TransformFunc) []corev1.Node {
	t.Helper()
	codec := protobuf.NewSerializer(clientgoscheme.Scheme, clientgoscheme.Scheme)
	encoded := make([][]byte, len(nodes))
	for i, n := range nodes {
		n.APIVersion, n.Kind = "v1", "Node"
		data, err := kruntime.Encode(codec, n)
		if err != nil {
			t.Fatalf("encode node %s: %v", n.Name, err)
		}
		encoded[i] = data
	}
	out := make([]corev1.Node, len(nodes))
	for i, data := range encoded {
		var n corev1.Node
		if _, _, err := codec.Decode(data, nil, &n); err != nil {
			t.Fatalf("decode node %d: %v", i, err)
		}
		got, err := transform(&n)
		if err != nil {
			t.Fatalf("transform node %s: %v", n.Name, err)
		}
		out[i] = *got.(*corev1.Node)
	}
	return out
}

// perObject is the live heap build's result holds, per object.
func perObject(n int, build func() any) (bytes int64, kept any) {
	before := heapsize.Live()
	kept = build()
	after := heapsize.Live()
	runtime.KeepAlive(kept)
	return (int64(after) - int64(before)) / int64(n), kept
}

// TestNodeCacheHeap measures the live heap per node of the manager's Node cache (decoded as its
// informer does, through its transform), of the node labeller's level view synced from it, and
// of a whole-node view (the migrationtarget controller's and the candidates handler's, synced on
// their first decision), with the managedFields-only transform of before and with TrimNode. Run with -v for figures.
func TestNodeCacheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("heap measurement")
	}
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]*corev1.Node, measuredNodes)
	for i := range nodes {
		nodes[i] = scaleLikeNode(i)
	}
	measure := func(name string, transform toolscache.TransformFunc) (cached, level int64) {
		cached, kept := perObject(len(nodes), func() any { return informerNodes(t, nodes, transform) })
		typed := kept.([]corev1.Node)
		synced := func(view *engine.Nodes) func() any {
			return func() any {
				if err := view.Sync(typed); err != nil {
					t.Fatal(err)
				}
				return view
			}
		}
		level, _ = perObject(len(nodes), synced(eng.NewLevelNodes()))
		whole, _ := perObject(len(nodes), synced(eng.NewNodes()))
		runtime.KeepAlive(typed)
		t.Logf("%-22s typed Node cache %5d B/node, level view %5d B/node, whole-node view (migration targets) %5d B/node (%d nodes)",
			name, cached, level, whole, len(nodes))
		return cached, level
	}
	beforeCached, _ := measure("strip managedFields:", cache.TransformStripManagedFields())
	afterCached, _ := measure("TrimNode:", controllers.TrimNode)
	runtime.KeepAlive(nodes) // else freed during the last measurement
	if afterCached >= beforeCached {
		t.Errorf("TrimNode keeps %d B/node, no less than the %d B/node of stripping managedFields", afterCached, beforeCached)
	}
}

// TestTrimNodeKeeps fails when TrimNode drops a field a reader of cached Nodes reads: the
// migration target decision (rego/virtrules/migration/target and test/reference:
// metadata.name, metadata.labels, spec.taints, spec.unschedulable, status.allocatable), the
// node labeller and its levels (labels, spec.unschedulable, resourceVersion for Sync), the
// reports (labels), and controller-runtime (identity, resourceVersion).
func TestTrimNodeKeeps(t *testing.T) {
	n := scaleLikeNode(7)
	n.Annotations["kubevirt.io/heartbeat"] = "2026-11-28T09:00:00Z"
	n.Spec = corev1.NodeSpec{
		Unschedulable: true, PodCIDR: "10.244.7.0/24", ProviderID: "kwok://scale-node-00007",
		Taints: []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}},
	}
	n.Status.Allocatable[corev1.ResourcePods] = resource.MustParse("64")
	want := n.DeepCopy()
	obj, err := controllers.TrimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*corev1.Node)
	if got.ManagedFields != nil {
		t.Errorf("managedFields kept")
	}
	want.ManagedFields = nil
	if !maps.Equal(got.Labels, want.Labels) || !maps.Equal(got.Annotations, want.Annotations) {
		t.Errorf("labels or annotations changed: got %v, %v", got.Labels, got.Annotations)
	}
	got.Labels, got.Annotations, want.Labels, want.Annotations = nil, nil, nil, nil
	if fmt.Sprint(got.ObjectMeta) != fmt.Sprint(want.ObjectMeta) {
		t.Errorf("metadata changed:\n got %+v\nwant %+v", got.ObjectMeta, want.ObjectMeta)
	}
	if fmt.Sprint(got.Spec) != fmt.Sprint(want.Spec) {
		t.Errorf("spec changed:\n got %+v\nwant %+v", got.Spec, want.Spec)
	}
	if len(got.Status.Allocatable) != len(want.Status.Allocatable) {
		t.Errorf("status.allocatable: got %v, want %v", got.Status.Allocatable, want.Status.Allocatable)
	}
	for r, q := range want.Status.Allocatable {
		if g, ok := got.Status.Allocatable[r]; !ok || g.Cmp(q) != 0 {
			t.Errorf("status.allocatable[%s]: got %v, want %v", r, got.Status.Allocatable[r], q)
		}
	}
	if fmt.Sprint(got.Status.Conditions) != fmt.Sprint(want.Status.Conditions) || len(want.Status.Conditions) == 0 {
		t.Errorf("status.conditions: got %v, want %v", got.Status.Conditions, want.Status.Conditions)
	}
	if got.Status.Capacity != nil || got.Status.NodeInfo != (corev1.NodeSystemInfo{}) || got.Status.Addresses != nil {
		t.Errorf("status but allocatable and conditions kept: %+v", got.Status)
	}
	if other, err := controllers.TrimNode(&corev1.Pod{}); err != nil || other.(*corev1.Pod) == nil {
		t.Errorf("a non-Node: got %v, %v", other, err)
	}
}

// TestTrimNodeIsTheRule: the cache transform trims a node exactly as internal/nodetrim's rule,
// whose unstructured form `virt-rules eval` trims with (nodetrim's tests compare the two forms),
// interning aside.
func TestTrimNodeIsTheRule(t *testing.T) {
	n := scaleLikeNode(3)
	n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	byRule := n.DeepCopy()
	nodetrim.Typed(byRule)
	obj, err := controllers.TrimNode(n.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	want, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(byRule)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("TrimNode keeps other than the rule:\n got  %v\n want %v", got, want)
	}
}

// TestTrimNodeSharesTheCachesTable: the Node cache interns into the table the other caches do
// (intern.Default), so a label key a compacted VM holds and a cached node's are one string.
func TestTrimNodeSharesTheCachesTable(t *testing.T) {
	const key = "topology.kubernetes.io/zone"
	vm := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "vm-1", "labels": map[string]any{strings.Clone(key): "zone-1"}},
	}}
	kinds.Compact(vm)
	obj, err := controllers.TrimNode(scaleLikeNode(1))
	if err != nil {
		t.Fatal(err)
	}
	keyOf := func(labels iter.Seq[string]) *byte {
		for k := range labels {
			if k == key {
				return unsafe.StringData(k)
			}
		}
		t.Fatalf("no label %s", key)
		return nil
	}
	vmLabels := vm.Object["metadata"].(map[string]any)["labels"].(map[string]any)
	if keyOf(maps.Keys(vmLabels)) != keyOf(maps.Keys(obj.(*corev1.Node).Labels)) {
		t.Errorf("a VM's and a node's label %s are two strings: the caches intern into two tables", key)
	}
}

// TestTrimNodeDecidesAlike decides the examples' migrations, candidates and levels on their
// nodes whole, with a kwok node's status added, and on the same nodes through TrimNode: every
// decision the same, so TrimNode drops nothing the embedded bundle reads.
func TestTrimNodeDecidesAlike(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, dir := range []string{"migration-target", "migratability"} {
		paths = append(paths, filepath.Join("..", "examples", dir))
	}
	decide := func(trim bool) *eval.Report {
		t.Helper()
		objs, err := manifest.Read(paths, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodes := 0
		for i, o := range objs {
			if o.GetKind() != "Node" || o.GetAPIVersion() != "v1" {
				continue
			}
			nodes++
			var node corev1.Node
			if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &node); err != nil {
				t.Fatalf("%s: %v", o.Position(), err)
			}
			kwok := scaleLikeNode(i).Status
			kwok.Allocatable, kwok.Capacity = node.Status.Allocatable, node.Status.Allocatable
			node.Status = kwok
			if trim {
				if _, err := controllers.TrimNode(&node); err != nil {
					t.Fatal(err)
				}
			}
			if objs[i].Object, err = kruntime.DefaultUnstructuredConverter.ToUnstructured(&node); err != nil {
				t.Fatal(err)
			}
		}
		if nodes == 0 {
			t.Fatalf("no nodes in %v", paths)
		}
		report, err := eval.Run(ctx, eng, objs, eval.Options{Candidates: true, Now: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)})
		if err != nil {
			t.Fatal(err)
		}
		if len(report.MigrationTargets) == 0 || len(report.NodeMigratability) == 0 {
			t.Fatalf("the examples decide no migration target or no level: %+v", report)
		}
		return report
	}
	whole, trimmed := must(json.Marshal(decide(false))), must(json.Marshal(decide(true)))
	if !bytes.Equal(whole, trimmed) {
		t.Errorf("decisions differ on trimmed nodes:\nwhole   %s\ntrimmed %s", whole, trimmed)
	}
}

func must(data []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return data
}
