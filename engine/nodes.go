package engine

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Nodes is the engine's view of the cluster's Nodes for the node decisions, kept up to date
// one node at a time (a controller's informer events) or filled once (eval).
//
// Host-model migratability never compares node pairs. The bundle declares, as data, which
// node label prefixes a CPU signature reads (settings.signatureLabelPrefixes). Nodes whose
// labels under those prefixes (and schedulability) are equal are interchangeable, so each
// distinct set is converted and handed to the `signature` rule once, and `levels` sees one
// group per distinct signature with its member count. Adding or removing a node only moves a
// count and re-asks `levels`.
//
// Safe for concurrent use.
type Nodes struct {
	engine *Engine

	mu      sync.Mutex
	members map[string]*nodeMember // by node name
	counts  map[string]int         // members per signature key
	list    *ast.Term              // all nodes as an array term, rebuilt after a change
	cache   *signatureCache        // per bundle generation
}

type nodeMember struct {
	obj  *unstructured.Unstructured
	term *ast.Term // the whole node, converted once per version
	key  string    // what the signature reads, canonically
}

type signatureCache struct {
	gen      *generation
	prefixes []string
	inputs   map[string]*ast.Term // signature key -> the reduced node the signature reads
	ids      map[string]string    // signature key -> signature id (its canonical text)
	terms    map[string]*ast.Term // signature id -> signature
}

// NewNodes returns an empty node view.
func (e *Engine) NewNodes() *Nodes {
	return &Nodes{engine: e, members: map[string]*nodeMember{}, counts: map[string]int{}}
}

// Upsert adds a node or replaces the node of the same name.
func (n *Nodes) Upsert(node *unstructured.Unstructured) error {
	t, err := objectTerm(node)
	if err != nil {
		return fmt.Errorf("node %s: %w", node.GetName(), err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.removeLocked(node.GetName())
	m := &nodeMember{obj: node, term: t}
	if n.cache != nil {
		m.key = signatureKey(node, n.cache.prefixes)
		n.counts[m.key]++
	}
	n.members[node.GetName()] = m
	n.list = nil
	return nil
}

// Delete removes the node named name, if present.
func (n *Nodes) Delete(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.removeLocked(name)
}

func (n *Nodes) removeLocked(name string) {
	m, ok := n.members[name]
	if !ok {
		return
	}
	if n.cache != nil {
		if n.counts[m.key]--; n.counts[m.key] == 0 {
			delete(n.counts, m.key)
		}
	}
	delete(n.members, name)
	n.list = nil
}

// Len is the number of nodes.
func (n *Nodes) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.members)
}

// term is every node as an array term, sorted by name; cached until the next change.
func (n *Nodes) term() *ast.Term {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.list == nil {
		names := slices.Sorted(maps.Keys(n.members))
		terms := make([]*ast.Term, len(names))
		for i, name := range names {
			terms[i] = n.members[name].term
		}
		n.list = ast.ArrayTerm(terms...)
	}
	return n.list
}

// Migratability returns the host-model migratability level of every schedulable node with a
// host model (node name -> 0..100), design 002.
func (n *Nodes) Migratability(ctx context.Context) (map[string]int, error) {
	g := n.engine.active.Load()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.refreshLocked(ctx, g); err != nil {
		return nil, err
	}
	c := n.cache
	groups := map[string]int{}
	for key, count := range n.counts {
		groups[c.ids[key]] += count
	}
	items := make([][2]*ast.Term, 0, len(groups))
	for id, count := range groups {
		items = append(items, item(id, ast.ObjectTerm(
			item("signature", c.terms[id]),
			item("count", ast.IntNumberTerm(count)),
		)))
	}
	t, err := g.eval(ctx, entryNodeMigratabilityLevels, ast.NewObject(item("groups", ast.ObjectTerm(items...))))
	if err != nil {
		return nil, err
	}
	var byGroup map[string]int
	if err := decode(t, &byGroup); err != nil {
		return nil, fmt.Errorf("decode %s: %w", entryNodeMigratabilityLevels, err)
	}
	levels := make(map[string]int, len(n.members))
	for name, m := range n.members {
		if level, ok := byGroup[c.ids[m.key]]; ok {
			levels[name] = level
		}
	}
	return levels, nil
}

// refreshLocked makes the signature cache current for generation g: on a new bundle it
// re-reads the prefixes and re-keys every node; then it asks `signature` for each new key.
func (n *Nodes) refreshLocked(ctx context.Context, g *generation) error {
	if n.cache == nil || n.cache.gen != g {
		prefixes, err := signatureLabelPrefixes(ctx, g)
		if err != nil {
			return err
		}
		n.cache = &signatureCache{gen: g, prefixes: prefixes, inputs: map[string]*ast.Term{},
			ids: map[string]string{}, terms: map[string]*ast.Term{}}
		n.counts = map[string]int{}
		for _, m := range n.members {
			m.key = signatureKey(m.obj, prefixes)
			n.counts[m.key]++
		}
	}
	c := n.cache
	for _, m := range n.members {
		if _, ok := c.ids[m.key]; ok {
			continue
		}
		sig, err := g.eval(ctx, entryNodeMigratabilitySignature, ast.NewObject(item("node", signatureInput(m.obj, c.prefixes))))
		if err != nil {
			return fmt.Errorf("node %s: %w", m.obj.GetName(), err)
		}
		id := sig.String()
		c.ids[m.key], c.terms[id] = id, sig
	}
	return nil
}

func signatureLabelPrefixes(ctx context.Context, g *generation) ([]string, error) {
	t, err := g.eval(ctx, entryNodeMigratabilityPrefixes, ast.NewObject())
	if err != nil {
		return nil, err
	}
	var prefixes []string
	if err := decode(t, &prefixes); err != nil {
		return nil, fmt.Errorf("decode %s: want a list of label prefixes: %w", entryNodeMigratabilityPrefixes, err)
	}
	return prefixes, nil
}

// relevantLabels are node's labels under prefixes, sorted by key.
func relevantLabels(node *unstructured.Unstructured, prefixes []string) [][2]string {
	var out [][2]string
	for k, v := range node.GetLabels() {
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				out = append(out, [2]string{k, v})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out
}

func unschedulable(node *unstructured.Unstructured) bool {
	u, _, _ := unstructured.NestedBool(node.Object, "spec", "unschedulable")
	return u
}

// signatureKey is a canonical text of what the signature reads of node.
func signatureKey(node *unstructured.Unstructured, prefixes []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%t", unschedulable(node))
	for _, kv := range relevantLabels(node, prefixes) {
		b.WriteString("\x00" + kv[0] + "\x01" + kv[1])
	}
	return b.String()
}

// signatureInput is node reduced to what the signature reads.
func signatureInput(node *unstructured.Unstructured, prefixes []string) *ast.Term {
	labels := map[string]string{}
	for _, kv := range relevantLabels(node, prefixes) {
		labels[kv[0]] = kv[1]
	}
	return ast.ObjectTerm(
		item("metadata", ast.ObjectTerm(item("labels", labelsTerm(labels)))),
		item("spec", ast.ObjectTerm(item("unschedulable", ast.BooleanTerm(unschedulable(node))))),
	)
}
