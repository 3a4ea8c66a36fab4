package engine

import (
	"context"
	"errors"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// MigrationCandidatesInput is what MigrationCandidates reads: a MigrationTargetInput without
// a migration, for a VMI that is not migrating.
type MigrationCandidatesInput struct {
	// VMI is the VirtualMachineInstance as stored; it must run on one of Nodes.
	VMI *unstructured.Unstructured
	// SourcePod, KubeVirt, Nodes and Pods are as in MigrationTargetInput.
	SourcePod *unstructured.Unstructured
	KubeVirt  *unstructured.Unstructured
	Nodes     *Nodes
	Pods      []*unstructured.Unstructured
}

// NodeVerdict is one node of MigrationCandidates: whether it could take the VMI now and, if
// not, the first check it fails (the order of the migration target decision).
type NodeVerdict struct {
	Node      string `json:"node"`
	Candidate bool   `json:"candidate"`
	Reason    string `json:"reason"`
}

// MigrationCandidates is where a VMI not yet migrating could migrate now.
type MigrationCandidates struct {
	// CandidateNodes are the nodes a migration adding no constraint could take it to, sorted.
	CandidateNodes []string `json:"candidateNodes"`
	// Nodes are every node, sorted, with its verdict.
	Nodes []NodeVerdict `json:"nodes"`
	// Error says why there is no candidate (a Reason* code); nil when there is one.
	Error *MigrationTargetError `json:"error"`
	// Revision is the bundle revision that decided.
	Revision string `json:"-"`
}

// MigrationCandidates decides, for a VMI no migration is moving, the nodes a migration that
// adds no constraint (a drain, an admin's plain VirtualMachineInstanceMigration) could take it
// to now, and for every other node the first reason it cannot. It is the migration target
// decision (its explanation entrypoint, one evaluation) on such a migration, so its answers
// are MigrationTarget's.
func (e *Engine) MigrationCandidates(ctx context.Context, in MigrationCandidatesInput) (*MigrationCandidates, error) {
	if in.VMI == nil {
		return nil, errors.New("migration candidates: no VMI")
	}
	migration := unconstrainedMigration(in.VMI)
	var out struct {
		Nodes []NodeVerdict         `json:"nodes"`
		Error *MigrationTargetError `json:"error"`
	}
	target := MigrationTargetInput{Migration: migration, VMI: in.VMI, SourcePod: in.SourcePod, KubeVirt: in.KubeVirt, Nodes: in.Nodes, Pods: in.Pods}
	rev, err := e.evalMigrationTarget(ctx, entryMigrationTargetExplanation, target, &out)
	if err != nil {
		return nil, err
	}
	c := &MigrationCandidates{CandidateNodes: []string{}, Nodes: out.Nodes, Error: out.Error, Revision: rev}
	if c.Nodes == nil {
		c.Nodes = []NodeVerdict{}
	}
	for _, n := range c.Nodes {
		if n.Candidate {
			c.CandidateNodes = append(c.CandidateNodes, n.Node)
		}
	}
	if c.Error != nil {
		// The decision names the migration; there is none, so it names the VMI.
		key := in.VMI.GetNamespace() + "/" + in.VMI.GetName()
		c.Error.Message = "VMI " + key + ": " + strings.TrimPrefix(c.Error.Message, "migration "+key+": ")
	}
	return c, nil
}

// unconstrainedMigration is a VirtualMachineInstanceMigration of vmi that adds nothing, named
// as the VMI.
func unconstrainedMigration(vmi *unstructured.Unstructured) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "VirtualMachineInstanceMigration",
		"metadata":   map[string]any{"namespace": vmi.GetNamespace(), "name": vmi.GetName()},
		"spec":       map[string]any{"vmiName": vmi.GetName()},
	}}
}
