package engine_test

import (
	"context"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// MigrationCandidates is the migration target decision on a migration that adds nothing: on
// design 001's example (examples/migration-target) its candidates are MigrationTarget's for
// such a migration, every node has a verdict, and the VMI's own node is not a candidate.
func TestMigrationCandidatesAgreeWithMigrationTarget(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Read([]string{"../examples/migration-target/nodes.yaml", "../examples/migration-target/vmi.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodes := eng.NewNodes()
	var vmi *unstructured.Unstructured
	var pods []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "Node":
			if err := nodes.Upsert(o.Unstructured); err != nil {
				t.Fatal(err)
			}
		case "VirtualMachineInstance":
			vmi = o.Unstructured
		case "Pod":
			pods = append(pods, o.Unstructured)
		}
	}
	source := engine.SourceLauncherPod(vmi, pods)
	got, err := eng.MigrationCandidates(ctx, engine.MigrationCandidatesInput{VMI: vmi, SourcePod: source, Nodes: nodes, Pods: pods})
	if err != nil {
		t.Fatal(err)
	}
	migration := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
		"metadata": map[string]any{"namespace": "prod", "name": "plain"},
		"spec":     map[string]any{"vmiName": "db"},
	}}
	want, err := eng.MigrationTarget(ctx, engine.MigrationTargetInput{Migration: migration, VMI: vmi, SourcePod: source, Nodes: nodes, Pods: pods})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.CandidateNodes, want.CandidateNodes) || len(want.CandidateNodes) == 0 {
		t.Errorf("candidates %v, MigrationTarget's %v (want the same, not none)", got.CandidateNodes, want.CandidateNodes)
	}
	if len(got.Nodes) != 6 {
		t.Fatalf("verdicts for %d nodes, want the example's 6: %+v", len(got.Nodes), got.Nodes)
	}
	for _, n := range got.Nodes {
		if n.Candidate != slices.Contains(want.CandidateNodes, n.Node) || n.Reason == "" {
			t.Errorf("node %s: candidate %v, reason %q", n.Node, n.Candidate, n.Reason)
		}
		if n.Node == "node-1" && n.Candidate {
			t.Errorf("node-1, where the VMI runs, is a candidate")
		}
	}
	if got.Error != nil {
		t.Errorf("error %v with candidates", got.Error)
	}
}

// Without a node to go to, the reason names the VMI, not the migration that does not exist.
func TestMigrationCandidatesErrorNamesTheVMI(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Read([]string{"../examples/migration-target/vmi.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var vmi *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "VirtualMachineInstance" {
			vmi = o.Unstructured
		}
	}
	got, err := eng.MigrationCandidates(ctx, engine.MigrationCandidatesInput{VMI: vmi, Nodes: eng.NewNodes()})
	if err != nil {
		t.Fatal(err)
	}
	if got.Error == nil || got.Error.Reason != engine.ReasonNoMatchingNode || len(got.CandidateNodes) != 0 {
		t.Fatalf("got %+v, want NoMatchingNode and no candidate (there is no node)", got)
	}
	if want := "VMI prod/db: "; len(got.Error.Message) < len(want) || got.Error.Message[:len(want)] != want {
		t.Errorf("message %q does not start with %q", got.Error.Message, want)
	}
}
