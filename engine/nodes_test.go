package engine

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func skylakeNode(name string, extra map[string]any) *unstructured.Unstructured {
	labels := map[string]any{
		"host-model-cpu.node.kubevirt.io/Skylake":      "true",
		"cpu-model-migration.node.kubevirt.io/Skylake": "true",
		"cpu-feature.node.kubevirt.io/pku":             "true",
	}
	maps.Copy(labels, extra)
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "labels": labels},
	}}
}

// The label keys a view has seen stay in its cache only while they can matter: after nodes
// with many label keys of their own leave, the next Migratability starts over from the nodes
// held, with the same levels.
func TestNodesForgetLabelKeysOfNodesGone(t *testing.T) {
	ctx := context.Background()
	eng, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes := eng.NewNodes()
	for _, name := range []string{"a", "b"} {
		if err := nodes.Upsert(skylakeNode(name, nil)); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{"a": 100, "b": 100}
	check := func(want map[string]int) {
		t.Helper()
		got, err := nodes.Migratability(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("levels %v, want %v", got, want)
		}
	}
	check(want)
	for round := range 3 {
		extra := map[string]any{"cpu-feature.node.kubevirt.io/avx512": "true"}
		for i := range maxCacheEntries + 100 {
			extra[fmt.Sprintf("example.com/k-%d-%d", round, i)] = "v"
		}
		if err := nodes.Upsert(skylakeNode("c", extra)); err != nil {
			t.Fatal(err)
		}
		check(map[string]int{"a": 100, "b": 100, "c": 100})
		nodes.Delete("c")
		check(want)
		if n := len(nodes.cache.keys); n > 10 {
			t.Fatalf("round %d: the cache still holds %d label keys for 2 nodes of 3 labels", round, n)
		}
	}
}

// A level view (NewLevelNodes) keeps only names, labels and schedulability, and gives the
// levels a whole-node view gives for the same nodes, through joins, changes and leaves; it
// refuses decisions that read whole nodes.
func TestLevelNodesMatchWholeNodes(t *testing.T) {
	ctx := context.Background()
	eng, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	models := []string{"Skylake", "Cascadelake", "Icelake"}
	typed := func(i int, unschedulable bool) corev1.Node {
		m := models[i%len(models)]
		n := corev1.Node{}
		n.Name = fmt.Sprintf("node-%02d", i)
		n.ResourceVersion = fmt.Sprint(i + 1)
		n.Labels = map[string]string{
			"host-model-cpu.node.kubevirt.io/" + m:      "true",
			"cpu-model-migration.node.kubevirt.io/" + m: "true",
			"kubernetes.io/hostname":                    n.Name,
		}
		for j := 0; j <= i%len(models); j++ {
			n.Labels["cpu-model-migration.node.kubevirt.io/"+models[j]] = "true"
			n.Labels["cpu-feature.node.kubevirt.io/f"+fmt.Sprint(j)] = "true"
		}
		n.Spec.Unschedulable = unschedulable
		n.Spec.Taints = []corev1.Taint{{Key: "t", Effect: corev1.TaintEffectNoSchedule}}
		n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")}
		return n
	}
	var cluster []corev1.Node
	for i := range 12 {
		cluster = append(cluster, typed(i, i == 5))
	}
	whole, levels := eng.NewNodes(), eng.NewLevelNodes()
	compare := func(step string) {
		t.Helper()
		for _, v := range []*Nodes{whole, levels} {
			if err := v.Sync(cluster); err != nil {
				t.Fatalf("%s: sync: %v", step, err)
			}
		}
		want, err := whole.Migratability(ctx)
		if err != nil {
			t.Fatalf("%s: whole nodes: %v", step, err)
		}
		got, err := levels.Migratability(ctx)
		if err != nil {
			t.Fatalf("%s: level nodes: %v", step, err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("%s: level view %v, whole-node view %v", step, got, want)
		}
		if len(want) == 0 {
			t.Fatalf("%s: no levels: the test's nodes need a host model", step)
		}
	}
	compare("load")
	cluster = append(cluster, typed(12, false))
	compare("join")
	cluster[3] = typed(3, true)
	cluster[3].ResourceVersion = "100"
	compare("cordon")
	cluster = cluster[1:]
	compare("leave")
	// A relist: equal nodes in new objects. The level view holds the new label maps, not the
	// replaced ones.
	for i := range cluster {
		cluster[i] = *cluster[i].DeepCopy()
	}
	compare("relist")
	for _, node := range cluster {
		if m := levels.members[node.Name]; reflect.ValueOf(m.level.labels).Pointer() != reflect.ValueOf(node.Labels).Pointer() {
			t.Fatalf("relist: the level view holds a replaced label map of node %s", node.Name)
		}
	}
	if _, err := levels.term(); err == nil || !strings.Contains(err.Error(), "NewLevelNodes") {
		t.Fatalf("want a whole-node decision on a level view refused, got %v", err)
	}
}

// A whole-node view fed typed nodes (Sync) holds of each what eval holds of the same node from
// a manifest (internal/nodetrim): a typed node converts with every status struct present, so
// without the trim after the conversion, status.nodeInfo and status.daemonEndpoints would be
// there (empty) in the cluster and absent offline, and a rule testing for them would decide
// differently.
func TestSyncHoldsTheTrimmedNode(t *testing.T) {
	eng, err := New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	nodes := eng.NewNodes()
	node := corev1.Node{}
	node.Name, node.ResourceVersion = "n1", "1"
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	node.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")}
	node.Status.NodeInfo.KernelVersion = "6.1"
	if err := nodes.Sync([]corev1.Node{node}); err != nil {
		t.Fatal(err)
	}
	status, _, _ := unstructured.NestedMap(nodes.members["n1"].obj.Object, "status")
	if got := slices.Sorted(maps.Keys(status)); !slices.Equal(got, []string{"allocatable", "conditions"}) {
		t.Fatalf("the view holds status %v of a synced node, want [allocatable conditions] (what eval keeps)", got)
	}
}
