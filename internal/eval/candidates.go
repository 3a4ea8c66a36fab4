package eval

import (
	"context"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
)

// MigrationCandidatesResult is where one VMI that no migration is moving could migrate now: the
// nodes a migration adding no constraint could take it to, and every node with its verdict
// (the first check a node fails, in the migration target decision's order).
type MigrationCandidatesResult struct {
	VMI            string                       `json:"vmi"`
	Node           string                       `json:"node"`
	CandidateNodes []string                     `json:"candidateNodes"`
	Nodes          []engine.NodeVerdict         `json:"nodes"`
	Error          *engine.MigrationTargetError `json:"error"`
}

// migrationCandidates decides the candidates of every VMI on a node that is not migrating: no
// migration among the inputs moves it (one not yet Succeeded or Failed), and its
// status.migrationState, if any, is completed or failed; and KubeVirt is not done with it.
func (in *inputs) migrationCandidates(ctx context.Context, eng *engine.Engine, nodes *engine.Nodes, opts Options) ([]MigrationCandidatesResult, error) {
	moving := map[string]bool{}
	for _, m := range in.migrations {
		phase, _, _ := unstructured.NestedString(m.Object, "status", "phase")
		if vmi, _, _ := unstructured.NestedString(m.Object, "spec", "vmiName"); vmi != "" && phase != "Succeeded" && phase != "Failed" {
			moving[m.GetNamespace()+"/"+vmi] = true
		}
	}
	kubevirt := in.kubevirtCR()
	pods := unstructuredOf(in.pods)
	results := []MigrationCandidatesResult{}
	for _, o := range in.vmis {
		key := o.GetNamespace() + "/" + o.GetName()
		node, _, _ := unstructured.NestedString(o.Object, "status", "nodeName")
		if _, done := finished(o); done || node == "" || moving[key] || migrating(o.Unstructured) || !in.decided(o) {
			continue
		}
		done := opts.observe("migrationCandidates")
		c, err := eng.MigrationCandidates(ctx, engine.MigrationCandidatesInput{
			VMI: o.Unstructured, SourcePod: engine.SourceLauncherPod(o.Unstructured, pods), KubeVirt: kubevirt, Nodes: nodes, Pods: pods,
		})
		done()
		if err != nil {
			if err := in.decideError(ctx, o, err); err != nil {
				return nil, err
			}
			continue
		}
		results = append(results, MigrationCandidatesResult{VMI: key, Node: node, CandidateNodes: c.CandidateNodes, Nodes: c.Nodes, Error: c.Error})
	}
	slices.SortFunc(results, func(a, b MigrationCandidatesResult) int { return strings.Compare(a.VMI, b.VMI) })
	return results, nil
}

// migrating is whether KubeVirt's status.migrationState says a migration of vmi is under way.
func migrating(vmi *unstructured.Unstructured) bool {
	state, found, _ := unstructured.NestedMap(vmi.Object, "status", "migrationState")
	if !found || state == nil {
		return false
	}
	completed, _ := state["completed"].(bool)
	failed, _ := state["failed"].(bool)
	return !completed && !failed
}
