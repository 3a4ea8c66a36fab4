package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
)

// nodesAsked counts the nodes the drain's placements are asked about.
type nodesAsked struct {
	mu    sync.Mutex
	nodes int
}

func (n *nodesAsked) LogDecision(_ context.Context, d *engine.Decision) {
	if d.Name != "migration.drain.placement" {
		return
	}
	obj, ok := d.Input.(ast.Object)
	if !ok {
		return
	}
	if arr, ok := obj.Get(ast.StringTerm("nodes")).Value.(*ast.Array); ok {
		n.mu.Lock()
		n.nodes += arr.Len()
		n.mu.Unlock()
	}
}

// The preview places the VMIs of one shape together, asking again only about the nodes that
// took a VMI since: on clusters of every kind (nodes of several sizes that fill up, taints,
// zones, a cordoned node, pods already there) and evacuees of a few shapes and strategies, its
// preview is the one asking about every node for every VMI gives, in fewer nodes asked about.
func TestDrainOfVMIsOfOneShapeAgreesWithAskingOneByOne(t *testing.T) {
	ctx := context.Background()
	asked := &nodesAsked{}
	eng, err := engine.New(ctx, engine.WithDecisionLogger(asked))
	if err != nil {
		t.Fatal(err)
	}
	stuck, fewer := 0, 0
	for seed := range uint64(16) {
		in := drainCluster(eng, rand.New(rand.NewPCG(seed, 7)))
		asked.nodes = 0
		got, err := eng.Drain(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		together := asked.nodes
		asked.nodes = 0
		want, err := eng.DrainOneByOne(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := json.MarshalIndent(got.VMIs, "", " ")
		w, _ := json.MarshalIndent(want.VMIs, "", " ")
		if string(g) != string(w) {
			t.Fatalf("seed %d: preview\n%s\nasking one by one:\n%s", seed, g, w)
		}
		stuck += got.Stuck()
		if together < asked.nodes {
			fewer++
		}
	}
	// The clusters are such that some VMIs find no room, and VMIs of a shape come again.
	if stuck == 0 || fewer == 0 {
		t.Errorf("%d VMIs stuck, %d previews asking about fewer nodes: the clusters test nothing", stuck, fewer)
	}
}

// drainCluster is a cluster of 14 nodes, two of them drained, with 24 VMIs on those of four
// shapes, drawn from r.
func drainCluster(eng *engine.Engine, r *rand.Rand) engine.DrainInput {
	nodes := eng.NewNodes()
	var pods []*unstructured.Unstructured
	for i := range 14 {
		n := drainNode(fmt.Sprintf("node-%02d", i), fmt.Sprint(2+r.IntN(12)), fmt.Sprintf("%dGi", 4+r.IntN(24)))
		labels := n.Object["metadata"].(map[string]any)["labels"].(map[string]any)
		labels["zone"] = []string{"a", "b"}[r.IntN(2)]
		switch r.IntN(6) {
		case 0:
			n.Object["spec"] = map[string]any{"taints": []any{map[string]any{"key": "gpu", "value": "true", "effect": "NoSchedule"}}}
		case 1:
			n.Object["spec"] = map[string]any{"unschedulable": true}
		}
		if err := nodes.Upsert(n); err != nil {
			panic(err)
		}
		if i >= 2 && r.IntN(3) == 0 {
			vmi := drainVMI(fmt.Sprintf("resident-%02d", i), n.GetName(), "LiveMigrate")
			pods = append(pods, drainLauncherPod(vmi))
		}
	}
	var vmis []*unstructured.Unstructured
	for i := range 24 {
		vmi := drainVMI(fmt.Sprintf("vm-%02d", i), fmt.Sprintf("node-%02d", r.IntN(2)), []string{"LiveMigrate", "LiveMigrate", "LiveMigrate", "None"}[r.IntN(4)])
		spec := vmi.Object["spec"].(map[string]any)
		switch r.IntN(4) {
		case 1:
			spec["nodeSelector"] = map[string]any{"zone": "a"}
		case 2:
			spec["tolerations"] = []any{map[string]any{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}}
		case 3:
			spec["domain"].(map[string]any)["resources"] = map[string]any{"requests": map[string]any{"cpu": "4", "memory": "8Gi"}}
		}
		if r.IntN(8) == 0 {
			vmi.Object["status"].(map[string]any)["conditions"] = []any{map[string]any{"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable"}}
		}
		vmis = append(vmis, vmi)
		pods = append(pods, drainLauncherPod(vmi))
	}
	return engine.DrainInput{Drain: []string{"node-00", "node-01"}, VMIs: vmis, Nodes: nodes, Pods: pods}
}
