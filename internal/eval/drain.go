package eval

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virt-rules/virt-rules/engine"
)

// DrainResult is what draining Nodes does to every VMI on them (Options.Drain,
// Options.DrainSelector): the migration.drain decision's preview.
type DrainResult struct {
	// Nodes are the nodes drained, sorted.
	Nodes []string `json:"nodes"`
	// VMIs are the VMIs on them, in the order the preview places them.
	VMIs []DrainVMIResult `json:"vmis"`
	// Stuck is how many VMIs keep the drain from finishing.
	Stuck int `json:"stuck"`
}

// DrainVMIResult is one VMI of the drain: what its eviction does, and, for a migration, the
// MigrationPolicy it obeys and the configuration it migrates with (migrationPolicies').
type DrainVMIResult struct {
	engine.DrainVMI
	Policy        *string                              `json:"policy"`
	Configuration *kubevirtv1.VMIMConfigurationOptions `json:"configuration"`
}

// ErrDrainNodes is a drain that names nodes not among the inputs, or a selector that matches
// none: the preview cannot be made.
var ErrDrainNodes = errors.New("drain")

// drainNodes are the names of the nodes Options.Drain and Options.DrainSelector name, sorted:
// each name must be among the nodes, and the selector must match at least one.
func (in *inputs) drainNodes(opts Options) ([]string, error) {
	known := map[string]bool{}
	for _, o := range in.nodes {
		known[o.GetName()] = true
	}
	var names, missing []string
	for _, name := range opts.Drain {
		if !known[name] {
			missing = append(missing, name)
			continue
		}
		names = append(names, name)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: node %s: not among the nodes read (%d)", ErrDrainNodes, strings.Join(missing, ", "), len(known))
	}
	if opts.DrainSelector != "" {
		selector, err := labels.Parse(opts.DrainSelector)
		if err != nil {
			return nil, fmt.Errorf("%w: selector %q: %w", ErrDrainNodes, opts.DrainSelector, err)
		}
		matched := 0
		for _, o := range in.nodes {
			if selector.Matches(labels.Set(o.GetLabels())) {
				names = append(names, o.GetName())
				matched++
			}
		}
		if matched == 0 {
			return nil, fmt.Errorf("%w: selector %q matches none of the %d nodes read", ErrDrainNodes, opts.DrainSelector, len(known))
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// drain previews draining the nodes opts names, over the nodes the decisions read.
func (in *inputs) drain(ctx context.Context, eng *engine.Engine, nodes *engine.Nodes, policies []MigrationPolicyResult, opts Options, warn func(string)) (*DrainResult, error) {
	drained, err := in.drainNodes(opts)
	if err != nil {
		return nil, err
	}
	var vmis []*unstructured.Unstructured
	unscheduled := 0
	for _, o := range in.vmis {
		if !in.decided(o) {
			continue
		}
		if node, _, _ := unstructured.NestedString(o.Object, "status", "nodeName"); node == "" {
			if _, done := finished(o); !done {
				unscheduled++
			}
			continue
		}
		vmis = append(vmis, o.Unstructured)
	}
	if unscheduled > 0 {
		warn(fmt.Sprintf("drain: %d VirtualMachineInstance(s) have no status.nodeName (not scheduled yet): on no node, no drain moves them", unscheduled))
	}
	done := opts.observe("drain")
	preview, err := eng.Drain(ctx, engine.DrainInput{Drain: drained, VMIs: vmis, Nodes: nodes, Pods: unstructuredOf(in.pods), KubeVirt: in.kubevirtCR()})
	done()
	if err != nil {
		return nil, err
	}
	byVMI := map[string]MigrationPolicyResult{}
	for _, p := range policies {
		byVMI[p.VMI] = p
	}
	result := &DrainResult{Nodes: drained, VMIs: make([]DrainVMIResult, 0, len(preview.VMIs)), Stuck: preview.Stuck()}
	for _, v := range preview.VMIs {
		r := DrainVMIResult{DrainVMI: v}
		if p, ok := byVMI[v.VMI]; ok && v.Action == engine.DrainMigrate {
			r.Policy = p.Policy
			configuration := p.Configuration
			r.Configuration = &configuration
		}
		result.VMIs = append(result.VMIs, r)
	}
	return result, nil
}
