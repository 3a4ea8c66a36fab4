package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
)

func drainNode(name, cpu, memory string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"kubevirt.io/schedulable": "true"}},
		"status":   map[string]any{"allocatable": map[string]any{"cpu": cpu, "memory": memory, "pods": "110"}},
	}}
}

// drainVMI runs on node with strategy, live-migratable, requesting 2 CPUs and 4Gi.
func drainVMI(name, node, strategy string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"namespace": "prod", "name": name},
		"spec": map[string]any{
			"evictionStrategy": strategy,
			"domain": map[string]any{"cpu": map[string]any{"model": "host-passthrough"},
				"resources": map[string]any{"requests": map[string]any{"cpu": "2", "memory": "4Gi"}}},
		},
		"status": map[string]any{"nodeName": node, "phase": "Running",
			"conditions": []any{map[string]any{"type": "LiveMigratable", "status": "True"}}},
	}}
}

// Two nodes have room for one evacuee each: the third finds none, because the first two took
// it; the VMI that does not migrate takes no room.
func TestDrainPlacesEvacueesOneAfterAnother(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes := eng.NewNodes()
	// node-1 says so when not cordoned: the preview cordons it all the same.
	drained := drainNode("node-1", "8", "16Gi")
	drained.Object["spec"] = map[string]any{"unschedulable": false, "taints": []any{}}
	for _, n := range []*unstructured.Unstructured{drained, drainNode("node-2", "2", "4Gi"), drainNode("node-3", "3", "6Gi")} {
		if err := nodes.Upsert(n); err != nil {
			t.Fatal(err)
		}
	}
	in := engine.DrainInput{
		Drain: []string{"node-1"},
		VMIs: []*unstructured.Unstructured{
			drainVMI("a", "node-1", "LiveMigrate"), drainVMI("b", "node-1", "LiveMigrate"),
			drainVMI("c", "node-1", "LiveMigrate"), drainVMI("off", "node-1", "None"),
			drainVMI("other", "node-2", "LiveMigrate"),
		},
		Nodes: nodes,
	}
	// "other" uses nothing here: no pods are given, so only the evacuees' target pods count.
	p, err := eng.Drain(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range p.VMIs {
		got = append(got, fmt.Sprintf("%s %s %s %v %s", v.VMI, v.Action, v.TargetNode, v.CandidateNodes, v.Reason))
	}
	want := []string{
		"prod/a migrate node-3 [node-2 node-3] ", // node-3 is left freer (1 of 3 CPUs vs 0 of 2)
		"prod/b migrate node-2 [node-2] ",
		"prod/c stuck  [] NoCapacity",
		"prod/off shutdown  [] EvictionStrategyNone",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("preview:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if p.Stuck() != 1 {
		t.Errorf("stuck %d, want 1", p.Stuck())
	}
	if c := p.VMIs[2]; !strings.HasPrefix(c.Message, "VMI prod/c: no node has room for VMI c") {
		t.Errorf("message %q: want the VMI named", c.Message)
	}

	if _, err := eng.Drain(ctx, engine.DrainInput{Nodes: nodes}); err == nil {
		t.Error("no node to drain: no error")
	}
}

// A bundle built before the drain decision still loads; the preview then says what is missing.
func TestDrainWithoutTheDecision(t *testing.T) {
	ctx := context.Background()
	dir := bundleDir(t, func(dir string) {
		if err := os.RemoveAll(filepath.Join(dir, "virtrules", "migration", "drain")); err != nil {
			t.Fatal(err)
		}
	})
	eng, err := engine.New(ctx, engine.WithBundlePath(dir))
	if err != nil {
		t.Fatalf("a bundle without the drain decision: %v", err)
	}
	nodes := eng.NewNodes()
	_, err = eng.Drain(ctx, engine.DrainInput{Drain: []string{"node-1"}, Nodes: nodes})
	if !errors.Is(err, engine.ErrMissingDecision) {
		t.Errorf("err %v, want ErrMissingDecision", err)
	}
}
