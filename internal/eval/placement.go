package eval

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// migrationTargets decides every VirtualMachineInstanceMigration. Its VMI must be among the
// inputs: where it runs and what it requires is what the decision is about. In a live
// cluster (Options.Live) a migration may outlive its VMI: it is skipped with a warning.
func (in *inputs) migrationTargets(ctx context.Context, eng *engine.Engine, nodes *engine.Nodes, opts Options) ([]MigrationTargetResult, error) {
	vmis := map[string]manifest.Object{}
	for _, o := range in.vmis {
		vmis[o.GetNamespace()+"/"+o.GetName()] = o
	}
	pods := unstructuredOf(in.pods)
	results := make([]MigrationTargetResult, 0, len(in.migrations))
	var errs []error
	for _, m := range in.migrations {
		vmiName, _, _ := unstructured.NestedString(m.Object, "spec", "vmiName")
		if vmiName == "" {
			errs = append(errs, m.Errorf("spec.vmiName", "want the name of the VirtualMachineInstance to migrate"))
			continue
		}
		key := m.GetNamespace() + "/" + vmiName
		vmi, ok := vmis[key]
		if !ok && opts.Live {
			if opts.Warn != nil {
				opts.Warn(fmt.Sprintf("VirtualMachineInstanceMigration %s/%s: its VirtualMachineInstance %s is gone: not decided", m.GetNamespace(), m.GetName(), key))
			}
			continue
		}
		if !ok {
			errs = append(errs, m.Errorf("spec.vmiName", "VirtualMachineInstance %s is not among the inputs", key))
			continue
		}
		// The VMI's launcher pod, when the manifests have it: a host-model VMI's CPU comes from
		// its nodeSelector; without it, from the node's labels (the messages say so).
		source := engine.SourceLauncherPod(vmi.Unstructured, pods)
		var kubevirt *unstructured.Unstructured
		if in.kubevirt != nil {
			kubevirt = in.kubevirt.Unstructured
		}
		target := engine.MigrationTargetInput{Migration: m.Unstructured, VMI: vmi.Unstructured, SourcePod: source, KubeVirt: kubevirt, Nodes: nodes, Pods: pods}
		done := opts.observe("migrationTargets")
		d, err := eng.MigrationTarget(ctx, target)
		done()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Position(), err)
		}
		r := MigrationTargetResultOf(m.GetNamespace()+"/"+m.GetName(), key, d)
		if opts.Explain {
			if r.Explanation, err = eng.ExplainMigrationTarget(ctx, target); err != nil {
				return nil, fmt.Errorf("%s: %w", m.Position(), err)
			}
		}
		results = append(results, r)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(results, func(a, b MigrationTargetResult) int { return strings.Compare(a.Migration, b.Migration) })
	return results, nil
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

// schedulingAffinity decides the first-scheduling affinity of every VMI not yet on a node.
func (in *inputs) schedulingAffinity(ctx context.Context, eng *engine.Engine, opts Options) ([]SchedulingAffinityResult, error) {
	var kubevirt *unstructured.Unstructured
	if in.kubevirt != nil {
		kubevirt = in.kubevirt.Unstructured
	}
	results := []SchedulingAffinityResult{}
	for _, o := range in.vmis {
		if node, _, _ := unstructured.NestedString(o.Object, "status", "nodeName"); node != "" {
			continue
		}
		done := opts.observe("schedulingAffinity")
		affinity, err := eng.SchedulingAffinity(ctx, o.Unstructured, kubevirt)
		done()
		if err != nil {
			if fe := (*engine.FieldError)(nil); errors.As(err, &fe) && in.kubevirt != nil {
				return nil, in.kubevirt.Errorf(fe.Field, "%s", fe.Message)
			}
			return nil, fmt.Errorf("%s: %w", o.Position(), err)
		}
		results = append(results, SchedulingAffinityResult{VMI: o.GetNamespace() + "/" + o.GetName(), NodeAffinity: affinity})
	}
	slices.SortFunc(results, func(a, b SchedulingAffinityResult) int { return strings.Compare(a.VMI, b.VMI) })
	return results, nil
}
