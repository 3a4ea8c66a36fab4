package engine

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
)

// CPUBaseline is the decision's answer: one entry per group of nodes, and the nodes it did not
// consider, each with why.
type CPUBaseline struct {
	Groups        []CPUBaselineGroup `json:"groups"`
	NotConsidered []CPUBaselineNode  `json:"notConsidered"`
	Warnings      []string           `json:"warnings"`
	Revision      string             `json:"-"`
}

// CPUBaselineGroup is the guest CPU every node of one group runs (see rego
// virtrules/node/baseline).
type CPUBaselineGroup struct {
	// Group is "" for every node, else "KEY=VALUE", or "KEY absent" for the nodes without
	// the group label.
	Group string `json:"group"`
	// Nodes are the nodes considered; NotConsidered the group's others, each with why.
	Nodes         []string          `json:"nodes"`
	NotConsidered []CPUBaselineNode `json:"notConsidered"`
	// Vendor is null when the nodes' vendors differ.
	Vendor *string `json:"vendor"`
	// Model is the CPU model to set, null when there is none (Reason says why).
	Model *string `json:"model"`
	// Features are KubeVirt's spec.domain.cpu.features for Model: policy require or disable.
	Features []CPUFeature `json:"features"`
	// GuestFeatures are the features the guest CPU has: Model's plus require minus disable.
	GuestFeatures []string `json:"guestFeatures"`
	Reason        string   `json:"reason"`
	Message       string   `json:"message"`
	// Share is the percent of the group's nodes KubeVirt's launcher node selector for this
	// CPU selects: 100 whenever there is a model.
	Share     int                   `json:"share"`
	Tradeoffs []CPUBaselineTradeoff `json:"tradeoffs"`
	// Snippets are what to paste: kubevirt (a KubeVirt CR's spec) and cpu (a VM's
	// spec.domain.cpu); empty without a model.
	Snippets map[string]any `json:"snippets"`
}

// CPUFeature is a KubeVirt CPU feature with its policy.
type CPUFeature struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
}

// CPUBaselineTradeoff is the group's baseline without Nodes (one kind of node).
type CPUBaselineTradeoff struct {
	Nodes          []string `json:"nodes"`
	HostModel      string   `json:"hostModel"`
	Vendor         *string  `json:"vendor"`
	Model          *string  `json:"model"`
	GainedFeatures []string `json:"gainedFeatures"`
}

// CPUBaselineNode is a node the decision left out.
type CPUBaselineNode struct {
	Node    string `json:"node"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// CPUBaseline asks the CPU baseline decision about the nodes, grouped by the values of the
// node label groupBy ("" leaves it to the bundle's settings.groupBy, by default one group of
// every node). Only node labels under the bundle's node.baseline.label_prefixes (the group
// label among them) and spec.unschedulable are read. Nodes alike in those are one kind: the
// decision sees each kind once with its node names, so it works per kind, not per node.
func (n *Nodes) CPUBaseline(ctx context.Context, groupBy string) (*CPUBaseline, error) {
	g := n.engine.active.Load()
	ask := ast.NewObject()
	if groupBy != "" {
		ask.Insert(ast.StringTerm("groupBy"), ast.StringTerm(groupBy))
	}
	t, err := g.eval(ctx, entryNodeBaselinePrefixes, ask)
	if err != nil {
		return nil, fmt.Errorf("cpu baseline: %w", err)
	}
	var prefixes []string
	if err := decode(t, &prefixes); err != nil {
		return nil, fmt.Errorf("cpu baseline: decode %s: want a list of label prefixes: %w", entryNodeBaselinePrefixes, err)
	}
	keep := newLabelFilter(prefixes)

	// Kinds are keyed by the bitset of their (label, value) pairs under the prefixes, each pair
	// numbered as first seen, and schedulability: one map lookup per label, no sorting.
	type kind struct {
		unschedulable bool
		pairs         [][2]string
		names         []*ast.Term
	}
	type labelBits struct {
		name   string
		values map[string]int
	}
	var (
		keys  = map[string]*labelBits{} // nil: not under the prefixes
		bits  []uint64
		key   []byte
		pairs int
		kinds = map[string]*kind{}
		order []*kind
	)
	n.mu.Lock()
	for name, m := range n.members {
		bits = bits[:0]
		for k, v := range m.labels() {
			lb, seen := keys[k]
			if !seen {
				if keep.keeps(k) {
					lb = &labelBits{name: k, values: map[string]int{}}
				}
				keys[k] = lb
			}
			if lb == nil {
				continue
			}
			b, ok := lb.values[v]
			if !ok {
				b = pairs
				pairs++
				lb.values[v] = b
			}
			for len(bits) <= b/64 {
				bits = append(bits, 0)
			}
			bits[b/64] |= 1 << (b % 64)
		}
		key = append(key[:0], 's')
		if m.unschedulable() {
			key[0] = 'u'
		}
		for _, w := range bits {
			key = binary.LittleEndian.AppendUint64(key, w)
		}
		k, ok := kinds[string(key)]
		if !ok {
			// A new kind: its labels under the prefixes, read again (once per kind).
			var kept [][2]string
			for k, v := range m.labels() {
				if keys[k] != nil {
					kept = append(kept, [2]string{k, v})
				}
			}
			k = &kind{unschedulable: m.unschedulable(), pairs: kept}
			kinds[string(key)] = k
			order = append(order, k)
		}
		k.names = append(k.names, ast.StringTerm(name))
	}
	n.mu.Unlock()

	terms := make([]*ast.Term, 0, len(order))
	for _, k := range order {
		labels := make([][2]*ast.Term, len(k.pairs))
		for i, p := range k.pairs {
			labels[i] = item(p[0], ast.StringTerm(p[1]))
		}
		terms = append(terms, ast.ObjectTerm(
			item("nodes", ast.ArrayTerm(k.names...)),
			item("unschedulable", ast.BooleanTerm(k.unschedulable)),
			item("labels", ast.ObjectTerm(labels...)),
		))
	}
	ask.Insert(ast.StringTerm("kinds"), ast.ArrayTerm(terms...))
	t, err = g.eval(ctx, entryNodeBaseline, ask)
	if err != nil {
		return nil, fmt.Errorf("cpu baseline: %w", err)
	}
	out := &CPUBaseline{Revision: g.revision}
	if err := decode(t, out); err != nil {
		return nil, fmt.Errorf("cpu baseline: decode %s: %w", entryNodeBaseline, err)
	}
	if out.Groups == nil {
		out.Groups = []CPUBaselineGroup{}
	}
	if out.Warnings == nil {
		out.Warnings = []string{}
	}
	return out, nil
}
