package eval

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/virt-rules/virt-rules/engine"
)

// CPUBaselineResult is one group's CPU baseline (engine.CPUBaselineGroup), beside the
// host-model migratability levels its nodes have today.
type CPUBaselineResult struct {
	engine.CPUBaselineGroup
	// HostModelLevels are the lowest and highest nodeMigratability level of the group's
	// considered nodes: how far host-model VMs started on them can migrate today, where a VM of
	// the baseline CPU can go to every node of the group (share). Nil when none has a level.
	HostModelLevels *LevelRange `json:"hostModelLevels"`
}

// LevelRange is the lowest and highest of some migratability levels.
type LevelRange struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// cpuBaseline asks the CPU baseline decision about nodes, grouped by opts.CPUBaselineGroupBy,
// and sets each group's levels of today. A bundle without the decision answers an error that
// names it: the report does not pretend there is no baseline.
func cpuBaseline(ctx context.Context, nodes *engine.Nodes, levels []NodeMigratabilityResult, opts Options, warn func(string)) ([]CPUBaselineResult, error) {
	b, err := nodes.CPUBaseline(ctx, opts.CPUBaselineGroupBy)
	if err != nil {
		if errors.Is(err, engine.ErrMissingDecision) {
			return nil, fmt.Errorf("--cpu-baseline: the bundle has no CPU baseline decision (package virtrules.node.baseline): %w", err)
		}
		return nil, err
	}
	for _, w := range b.Warnings {
		warn("cpuBaseline: " + w)
	}
	level := make(map[string]int, len(levels))
	for _, l := range levels {
		level[l.Node] = l.Level
	}
	results := make([]CPUBaselineResult, 0, len(b.Groups))
	for _, g := range b.Groups {
		r := CPUBaselineResult{CPUBaselineGroup: g}
		for _, n := range g.Nodes {
			l, ok := level[n]
			if !ok {
				continue
			}
			if r.HostModelLevels == nil {
				r.HostModelLevels = &LevelRange{Min: l, Max: l}
			}
			r.HostModelLevels.Min, r.HostModelLevels.Max = min(r.HostModelLevels.Min, l), max(r.HostModelLevels.Max, l)
		}
		if len(g.NotConsidered) > 0 {
			byReason := map[string][]string{}
			for _, n := range g.NotConsidered {
				byReason[n.Reason] = append(byReason[n.Reason], n.Node)
			}
			for _, reason := range sortedKeys(byReason) {
				warn(fmt.Sprintf("cpuBaseline %s: %d node(s) not considered (%s): %s", groupName(g.Group), len(byReason[reason]), reason, FirstNames(byReason[reason], 10)))
			}
		}
		results = append(results, r)
	}
	return results, nil
}

// groupName is how a warning names a group.
func groupName(group string) string {
	if group == "" {
		return "of the cluster"
	}
	return group
}

// FirstNames is names, sorted, cut after n with how many more.
func FirstNames(names []string, n int) string {
	names = slices.Sorted(slices.Values(names))
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
