package engine

import (
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
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
	members map[string]*nodeMember    // by node name
	groups  map[groupKey][]*nodeGroup // by what the signature reads, for cache's prefixes
	seed    maphash.Seed
	scratch [][2]string     // reused while grouping one node
	list    *ast.Term       // all nodes as an array term, rebuilt after a change
	cache   *signatureCache // per bundle generation
}

type nodeMember struct {
	obj   *unstructured.Unstructured
	term  *ast.Term  // the whole node, converted on first use by term()
	group *nodeGroup // nil until the first Migratability
}

// nodeGroup is the nodes whose labels under the signature prefixes, and schedulability, are
// the same: the signature cannot tell them apart.
type nodeGroup struct {
	key      groupKey
	labels   map[string]string // the labels under the prefixes every member has
	count    int
	id       string // signature id, "" until asked
	level    int
	hasLevel bool
}

// groupKey finds a node's group without sorting or building strings: an order-independent
// hash of its labels under the prefixes, their number and its schedulability. Nodes with
// equal keys are then compared label by label, so a collision costs a comparison, never a
// wrong group.
type groupKey struct {
	sum, mix      uint64
	labels        int
	unschedulable bool
}

type signatureCache struct {
	gen      *generation
	prefixes labelFilter
	terms    map[string]*ast.Term // signature id -> signature
	ids      map[string]string    // signature text -> signature id (short)
}

// NewNodes returns an empty node view.
func (e *Engine) NewNodes() *Nodes {
	return &Nodes{engine: e, members: map[string]*nodeMember{}, groups: map[groupKey][]*nodeGroup{}, seed: maphash.MakeSeed()}
}

// Upsert adds a node or replaces the node of the same name.
func (n *Nodes) Upsert(node *unstructured.Unstructured) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.removeLocked(node.GetName())
	m := &nodeMember{obj: node}
	if n.cache != nil {
		n.joinLocked(m)
	}
	n.members[node.GetName()] = m
	n.list = nil
	return nil
}

func (n *Nodes) joinLocked(m *nodeMember) {
	labels := relevantLabels(n.scratch[:0], m.obj, n.cache.prefixes)
	n.scratch = labels
	key := groupKey{labels: len(labels), unschedulable: unschedulable(m.obj)}
	for _, kv := range labels {
		pair := maphash.String(n.seed, kv[0]) ^ (maphash.String(n.seed, kv[1]) * 0x9E3779B97F4A7C15)
		key.sum += pair
		key.mix += pair * (pair | 1)
	}
	for _, g := range n.groups[key] {
		if g.hasExactly(labels) {
			g.count++
			m.group = g
			return
		}
	}
	g := &nodeGroup{key: key, labels: make(map[string]string, len(labels)), count: 1}
	for _, kv := range labels {
		g.labels[kv[0]] = kv[1]
	}
	n.groups[key] = append(n.groups[key], g)
	m.group = g
}

// hasExactly tells whether labels (with distinct keys) are the group's labels.
func (g *nodeGroup) hasExactly(labels [][2]string) bool {
	if len(labels) != len(g.labels) {
		return false
	}
	for _, kv := range labels {
		if v, ok := g.labels[kv[0]]; !ok || v != kv[1] {
			return false
		}
	}
	return true
}

// Sync makes the view hold exactly nodes: a node is converted and upserted only when its
// resourceVersion differs from the one held, and nodes no longer listed are deleted. This is
// how a controller feeds it from an informer's list.
func (n *Nodes) Sync(nodes []corev1.Node) error {
	seen := make(map[string]bool, len(nodes))
	for i := range nodes {
		node := &nodes[i]
		seen[node.Name] = true
		if n.holds(node.Name, node.ResourceVersion) {
			continue
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(node)
		if err != nil {
			return fmt.Errorf("convert node %s: %w", node.Name, err)
		}
		if err := n.Upsert(&unstructured.Unstructured{Object: obj}); err != nil {
			return err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for name := range n.members {
		if !seen[name] {
			n.removeLocked(name)
		}
	}
	return nil
}

// holds tells whether the view has the node at resourceVersion (never for an empty version).
func (n *Nodes) holds(name, resourceVersion string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.members[name]
	return ok && resourceVersion != "" && m.obj.GetResourceVersion() == resourceVersion
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
	if g := m.group; g != nil {
		if g.count--; g.count == 0 {
			same := slices.DeleteFunc(n.groups[g.key], func(o *nodeGroup) bool { return o == g })
			if len(same) == 0 {
				delete(n.groups, g.key)
			} else {
				n.groups[g.key] = same
			}
		}
	}
	delete(n.members, name)
	n.list = nil
}

// Len is the number of nodes.
// eachGroup calls f for every group.
func (n *Nodes) eachGroup(f func(*nodeGroup)) {
	for _, same := range n.groups {
		for _, g := range same {
			f(g)
		}
	}
}

func (n *Nodes) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.members)
}

// term is every node as an array term, sorted by name; cached until the next change. Each
// node is converted once, when a decision first reads whole nodes.
func (n *Nodes) term() (*ast.Term, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.list == nil {
		names := slices.Sorted(maps.Keys(n.members))
		terms := make([]*ast.Term, len(names))
		for i, name := range names {
			m := n.members[name]
			if m.term == nil {
				t, err := objectTerm(m.obj)
				if err != nil {
					return nil, fmt.Errorf("node %s: %w", name, err)
				}
				m.term = t
			}
			terms[i] = m.term
		}
		n.list = ast.ArrayTerm(terms...)
	}
	return n.list, nil
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
	counts := map[string]int{}
	n.eachGroup(func(grp *nodeGroup) { counts[grp.id] += grp.count })
	items := make([][2]*ast.Term, 0, len(counts))
	for id, count := range counts {
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
	n.eachGroup(func(grp *nodeGroup) { grp.level, grp.hasLevel = byGroup[grp.id] })
	levels := make(map[string]int, len(n.members))
	for name, m := range n.members {
		if m.group.hasLevel {
			levels[name] = m.group.level
		}
	}
	return levels, nil
}

// refreshLocked makes the signature cache current for generation g: on a new bundle it
// re-reads the prefixes and re-keys every node; then it asks `signature` for each new group.
func (n *Nodes) refreshLocked(ctx context.Context, g *generation) error {
	if n.cache == nil || n.cache.gen != g {
		prefixes, err := signatureLabelPrefixes(ctx, g)
		if err != nil {
			return err
		}
		n.cache = &signatureCache{gen: g, prefixes: newLabelFilter(prefixes), terms: map[string]*ast.Term{}, ids: map[string]string{}}
		n.groups = map[groupKey][]*nodeGroup{}
		for _, m := range n.members {
			n.joinLocked(m)
		}
	}
	c := n.cache
	var fresh []*nodeGroup
	n.eachGroup(func(grp *nodeGroup) {
		if grp.id == "" {
			fresh = append(fresh, grp)
		}
	})
	if len(fresh) == 0 {
		return nil
	}
	// One evaluation for every group not seen yet, each under its index in fresh.
	items := make([][2]*ast.Term, len(fresh))
	for i, grp := range fresh {
		items[i] = item(strconv.Itoa(i), grp.signatureInput())
	}
	t, err := g.eval(ctx, entryNodeMigratabilitySignatures, ast.NewObject(item("nodes", ast.ObjectTerm(items...))))
	if err != nil {
		return err
	}
	sigs, ok := t.Value.(ast.Object)
	if !ok {
		return fmt.Errorf("%s: want an object of signatures, got %s", entryNodeMigratabilitySignatures, ast.ValueName(t.Value))
	}
	for i, grp := range fresh {
		sig := sigs.Get(items[i][0])
		if sig == nil {
			return fmt.Errorf("%s: no signature for nodes with labels %v", entryNodeMigratabilitySignatures, grp.labels)
		}
		text := sig.String()
		id, ok := c.ids[text]
		if !ok {
			id = strconv.Itoa(len(c.ids))
			c.ids[text] = id
			c.terms[id] = sig
		}
		grp.id = id
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

// labelFilter keeps the label keys under a bundle's signature_label_prefixes. A prefix like
// "cpu-feature.node.kubevirt.io/" (its only "/" at its end) holds exactly the keys whose part
// up to their first "/" equals it: one map lookup per key instead of one comparison per
// prefix. Other prefixes are compared as they are.
type labelFilter struct {
	bySlash map[string]bool
	others  []string
}

func newLabelFilter(prefixes []string) labelFilter {
	f := labelFilter{bySlash: map[string]bool{}}
	for _, p := range prefixes {
		if i := strings.IndexByte(p, '/'); i == len(p)-1 {
			f.bySlash[p] = true
		} else {
			f.others = append(f.others, p)
		}
	}
	return f
}

func (f labelFilter) keeps(key string) bool {
	if i := strings.IndexByte(key, '/'); i >= 0 && f.bySlash[key[:i+1]] {
		return true
	}
	for _, p := range f.others {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// relevantLabels appends to buf node's labels that f keeps and whose values are strings.
func relevantLabels(buf [][2]string, node *unstructured.Unstructured, f labelFilter) [][2]string {
	metadata, _ := node.Object["metadata"].(map[string]any)
	labels, _ := metadata["labels"].(map[string]any)
	for k, v := range labels {
		if s, ok := v.(string); ok && f.keeps(k) {
			buf = append(buf, [2]string{k, s})
		}
	}
	return buf
}

func unschedulable(node *unstructured.Unstructured) bool {
	u, _, _ := unstructured.NestedBool(node.Object, "spec", "unschedulable")
	return u
}

// signatureInput is what the signature reads of the group's nodes, as a node.
func (g *nodeGroup) signatureInput() *ast.Term {
	return ast.ObjectTerm(
		item("metadata", ast.ObjectTerm(item("labels", labelsTerm(g.labels)))),
		item("spec", ast.ObjectTerm(item("unschedulable", ast.BooleanTerm(g.key.unschedulable)))),
	)
}
