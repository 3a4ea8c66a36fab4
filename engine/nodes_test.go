package engine

import (
	"context"
	"fmt"
	"maps"
	"testing"

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
