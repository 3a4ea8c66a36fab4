package eval

import (
	"context"
	"errors"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// migrationTargets decides every VirtualMachineInstanceMigration not yet in a final phase. Its
// VMI must be among the inputs: where it runs and what it requires is what the decision is
// about; a pending migration of an absent VMI is an error of its own. A finished migration
// (Succeeded, Failed) is history: reported with its phase, never decided, its VMI not needed.
func (in *inputs) migrationTargets(ctx context.Context, eng *engine.Engine, nodes *engine.Nodes, opts Options) ([]MigrationTargetResult, error) {
	vmis := map[string]manifest.Object{}
	for _, o := range in.vmis {
		vmis[o.GetNamespace()+"/"+o.GetName()] = o
	}
	pods := unstructuredOf(in.pods)
	kubevirt := in.kubevirtCR()
	results := make([]MigrationTargetResult, 0, len(in.migrations))
	for _, m := range in.migrations {
		vmiName, _, _ := unstructured.NestedString(m.Object, "spec", "vmiName")
		key := m.GetNamespace() + "/" + vmiName
		phase, _, _ := unstructured.NestedString(m.Object, "status", "phase")
		if _, done := finished(m); done {
			results = append(results, MigrationTargetResult{Migration: m.GetNamespace() + "/" + m.GetName(), VMI: key, Phase: phase})
			continue
		}
		if vmiName == "" {
			in.fail(m, m.Errorf("spec.vmiName", "want the name of the VirtualMachineInstance to migrate"))
			continue
		}
		vmi, ok := vmis[key]
		if !ok {
			in.fail(m, m.Error(manifest.ReasonInconsistent, "spec.vmiName", "VirtualMachineInstance %s is not among the inputs, and the migration is not finished (phase %s)", key, phaseOrNone(phase)))
			continue
		}
		if !in.decided(vmi) {
			in.fail(m, m.Error(manifest.ReasonInconsistent, "spec.vmiName", "its VirtualMachineInstance %s is in error: not decided", key))
			continue
		}
		// The VMI's launcher pod, when the manifests have it: a host-model VMI's CPU comes from
		// its nodeSelector; without it, from the node's labels (the messages say so).
		source := engine.SourceLauncherPod(vmi.Unstructured, pods)
		target := engine.MigrationTargetInput{Migration: m.Unstructured, VMI: vmi.Unstructured, SourcePod: source, KubeVirt: kubevirt, Nodes: nodes, Pods: pods}
		done := opts.observe("migrationTargets")
		d, err := eng.MigrationTarget(ctx, target)
		done()
		if err != nil {
			if err := in.decideError(ctx, m, err); err != nil {
				return nil, err
			}
			continue
		}
		r := MigrationTargetResultOf(m.GetNamespace()+"/"+m.GetName(), key, d)
		r.Phase = phase
		if opts.Explain {
			if r.Explanation, err = eng.ExplainMigrationTarget(ctx, target); err != nil {
				if err := in.decideError(ctx, m, err); err != nil {
					return nil, err
				}
				continue
			}
		}
		results = append(results, r)
	}
	slices.SortFunc(results, func(a, b MigrationTargetResult) int { return strings.Compare(a.Migration, b.Migration) })
	return results, nil
}

// phaseOrNone is phase, or "none" when the status has none.
func phaseOrNone(phase string) string {
	if phase == "" {
		return "none"
	}
	return phase
}

func nodeMigratability(ctx context.Context, nodes *engine.Nodes) ([]NodeMigratabilityResult, error) {
	levels, err := nodes.Migratability(ctx)
	if err != nil {
		return nil, err
	}
	results := make([]NodeMigratabilityResult, 0, len(levels))
	for _, name := range sortedKeys(levels) {
		results = append(results, NodeMigratabilityResult{Node: name, Level: levels[name]})
	}
	return results, nil
}

// schedulingAffinity decides the first-scheduling affinity of every VMI not yet on a node
// (and not finished: a VMI that failed before it was scheduled is never scheduled).
func (in *inputs) schedulingAffinity(ctx context.Context, eng *engine.Engine, opts Options) ([]SchedulingAffinityResult, error) {
	kubevirt := in.kubevirtCR()
	results := []SchedulingAffinityResult{}
	for _, o := range in.vmis {
		if _, done := finished(o); done || !in.decided(o) {
			continue
		}
		if node, _, _ := unstructured.NestedString(o.Object, "status", "nodeName"); node != "" {
			continue
		}
		done := opts.observe("schedulingAffinity")
		affinity, err := eng.SchedulingAffinity(ctx, o.Unstructured, kubevirt)
		done()
		if err != nil {
			// A field of the KubeVirt CR the rules cannot read is the CR's error, said once;
			// every VMI that needed it is then not decided.
			if fe := (*engine.FieldError)(nil); errors.As(err, &fe) && in.kubevirt != nil && ctx.Err() == nil {
				if in.decided(*in.kubevirt) {
					in.fail(*in.kubevirt, in.kubevirt.Errorf(fe.Field, "%s: the first scheduling of VMIs not yet on a node is not decided", fe.Message))
				}
				in.failed[objectKey(o)] = true
				continue
			}
			if err := in.decideError(ctx, o, err); err != nil {
				return nil, err
			}
			continue
		}
		results = append(results, SchedulingAffinityResult{VMI: o.GetNamespace() + "/" + o.GetName(), NodeAffinity: affinity})
	}
	slices.SortFunc(results, func(a, b SchedulingAffinityResult) int { return strings.Compare(a.VMI, b.VMI) })
	return results, nil
}
