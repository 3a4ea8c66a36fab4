package engine_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
)

// baselineNode is an amd64 node KubeVirt's node labeller labelled (the few labels the test
// needs): vendor Intel, the models it runs, its features; extra labels added.
func baselineNode(name string, models, features []string, extra map[string]any) *unstructured.Unstructured {
	labels := map[string]any{"kubevirt.io/schedulable": "true", "cpu-vendor.node.kubevirt.io/Intel": "true", "kubernetes.io/hostname": name}
	for _, m := range models {
		labels["cpu-model.node.kubevirt.io/"+m] = "true"
	}
	for _, f := range features {
		labels["cpu-feature.node.kubevirt.io/"+f] = "true"
	}
	for k, v := range extra {
		labels[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name, "labels": labels},
	}}
}

func TestCPUBaseline(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	view := eng.NewNodes()
	// a-1 and a-2 differ only by a label the decision does not read: one kind.
	for _, n := range []*unstructured.Unstructured{
		baselineNode("a-1", []string{"qemu64", "Nehalem"}, []string{"sse4.2", "pku"}, map[string]any{"zone": "a", "rack": "1"}),
		baselineNode("a-2", []string{"qemu64", "Nehalem"}, []string{"sse4.2", "pku"}, map[string]any{"zone": "a", "rack": "2"}),
		baselineNode("b-1", []string{"qemu64"}, []string{"sse4.2"}, map[string]any{"zone": "b"}),
		baselineNode("c-1", nil, nil, map[string]any{"zone": "a"}),
	} {
		if err := view.Upsert(n); err != nil {
			t.Fatal(err)
		}
	}
	all, err := view.CPUBaseline(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Groups) != 1 {
		t.Fatalf("groups %+v, want one", all.Groups)
	}
	g := all.Groups[0]
	if g.Group != "" || !slices.Equal(g.Nodes, []string{"a-1", "a-2", "b-1"}) || len(g.NotConsidered) != 1 || g.NotConsidered[0].Reason != "NoCPULabels" {
		t.Errorf("group %+v", g)
	}
	// qemu64 is libvirt's vendor-less model; the table (libvirt's cpu_map) says what it has.
	if g.Model == nil || *g.Model != "qemu64" || g.Reason != "" {
		t.Errorf("model %v (%s %s), want qemu64", g.Model, g.Reason, g.Message)
	}
	if !slices.Contains(g.GuestFeatures, "sse4.2") || slices.Contains(g.GuestFeatures, "pku") {
		t.Errorf("guest features %v: want sse4.2, every node has it, and no pku", g.GuestFeatures)
	}

	zones, err := view.CPUBaseline(ctx, "zone")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range zones.Groups {
		names = append(names, g.Group)
	}
	if !slices.Equal(names, []string{"zone=a", "zone=b"}) {
		t.Fatalf("groups %v, want zone=a and zone=b", names)
	}
	if a := zones.Groups[0]; a.Model == nil || *a.Model != "Nehalem" || !slices.Equal(a.Nodes, []string{"a-1", "a-2"}) {
		t.Errorf("zone=a: %v of %v, want Nehalem of a-1, a-2", a.Model, a.Nodes)
	}
}

// A bundle built before the CPU baseline still loads; the baseline then says what is missing.
func TestCPUBaselineWithoutTheDecision(t *testing.T) {
	ctx := context.Background()
	dir := bundleDir(t, func(dir string) {
		if err := os.RemoveAll(filepath.Join(dir, "virtrules", "node", "baseline")); err != nil {
			t.Fatal(err)
		}
	})
	eng, err := engine.New(ctx, engine.WithBundlePath(dir))
	if err != nil {
		t.Fatalf("a bundle without the CPU baseline: %v", err)
	}
	if _, err := eng.NewNodes().CPUBaseline(ctx, ""); !errors.Is(err, engine.ErrMissingDecision) {
		t.Errorf("err %v, want ErrMissingDecision", err)
	}
}
