package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/virt-rules/virt-rules/internal/intern"
	"github.com/virt-rules/virt-rules/internal/nodetrim"
)

// Nodes is the engine's view of the cluster's Nodes for the node decisions, kept up to date
// one node at a time (a controller's informer events) or filled once (eval).
//
// Host-model migratability never compares node pairs. The bundle declares, as data, which
// node label prefixes a CPU signature reads (settings.signatureLabelPrefixes). Nodes whose
// labels under those prefixes (and schedulability) are equal are interchangeable, so each
// distinct set is converted and handed to the `signatures` rule once, and `levels` sees one
// group per distinct signature with its member count. Adding or removing a node only moves a
// count and re-asks `levels`.
//
// Safe for concurrent use.
type Nodes struct {
	engine *Engine
	// levelsOnly views keep of each node only what Migratability reads (NewLevelNodes).
	levelsOnly bool

	mu      sync.Mutex
	members map[string]*nodeMember // by node name
	groups  map[string]*nodeGroup  // by group key (see joinLocked), for cache's prefixes
	bits    []uint64               // scratch of joinLocked
	key     []byte                 // scratch of joinLocked
	list    *ast.Term              // all nodes as an array term, rebuilt after a change
	cache   *signatureCache        // per bundle generation
}

type nodeMember struct {
	obj   *unstructured.Unstructured // the node, or nil for a level view's Sync (then level)
	level levelMember
	term  *ast.Term  // the whole node, converted on first use by term()
	group *nodeGroup // nil until the first Migratability
}

// levelMember is what a level reads of a typed node, kept by a level view's Sync: its labels are
// the node's own map, not a copy.
type levelMember struct {
	resourceVersion string
	labels          map[string]string
	unschedulable   bool
}

func (m *nodeMember) resourceVersion() string {
	if m.obj != nil {
		return m.obj.GetResourceVersion()
	}
	return m.level.resourceVersion
}

func (m *nodeMember) unschedulable() bool {
	if m.obj != nil {
		return unschedulable(m.obj)
	}
	return m.level.unschedulable
}

// nodeGroup is the nodes whose labels under the signature prefixes, and schedulability, are
// the same: the signature cannot tell them apart.
type nodeGroup struct {
	key      string // 's' or 'u' (spec.unschedulable), then the bitset of its label pairs
	count    int
	id       string // signature id, "" until asked
	level    int
	hasLevel bool
}

// signatureCache is what a generation's signatures need, learnt as nodes come: every label
// key seen (nil when not under the prefixes), each (key, value) pair under the prefixes
// numbered by a bit of the group keys, and the signatures asked so far.
type signatureCache struct {
	gen      *generation
	prefixes labelFilter
	keys     map[string]*labelKey
	pairs    [][2]string          // (key, value) by bit
	terms    map[string]*ast.Term // signature id -> signature
	ids      map[string]string    // signature text -> signature id (short)
	byGroup  map[string]string    // group key -> signature id, kept when a group empties
	// reach is the value of `reach` for the signature ids in reachIDs (sorted, comma-joined),
	// nil until asked or when the bundle has no `reach`.
	reach    *ast.Term
	reachIDs string
}

// labelKey numbers the values seen of a label key under the prefixes; nearly all are "true".
type labelKey struct {
	name   string
	isTrue int // bit of the value "true", -1 until seen
	others map[string]int
}

// maxCacheEntries bounds what a signatureCache learns beyond the current nodes (label keys
// that came and went): past it, refreshLocked starts over from the nodes held.
const maxCacheEntries = 1 << 14

func newSignatureCache(g *generation, prefixes []string) *signatureCache {
	return &signatureCache{
		gen: g, prefixes: newLabelFilter(prefixes), keys: map[string]*labelKey{},
		terms: map[string]*ast.Term{}, ids: map[string]string{}, byGroup: map[string]string{},
	}
}

// overgrown tells whether the cache holds much more than n nodes can need.
func (c *signatureCache) overgrown(n int) bool {
	return len(c.keys)+len(c.pairs)+len(c.byGroup) > maxCacheEntries+4*n
}

// bit numbers the pair (k, value), k under the prefixes.
func (c *signatureCache) bit(k *labelKey, value string) int {
	if value == "true" {
		if k.isTrue < 0 {
			k.isTrue = c.newBit(k.name, value)
		}
		return k.isTrue
	}
	b, ok := k.others[value]
	if !ok {
		if k.others == nil {
			k.others = map[string]int{}
		}
		b = c.newBit(k.name, value)
		k.others[value] = b
	}
	return b
}

func (c *signatureCache) newBit(key, value string) int {
	c.pairs = append(c.pairs, [2]string{key, value})
	return len(c.pairs) - 1
}

// NewNodes returns an empty node view.
func (e *Engine) NewNodes() *Nodes {
	return &Nodes{engine: e, members: map[string]*nodeMember{}, groups: map[string]*nodeGroup{}}
}

// NewLevelNodes returns an empty node view for Migratability alone: Sync keeps of each node its
// name, resourceVersion, labels and spec.unschedulable, everything a level reads (a signature
// reads labels under the bundle's prefixes and schedulability), and a decision that reads whole
// nodes from it fails. Sync keeps the nodes' label maps themselves, not copies: the caller
// must not change them afterwards (an informer's cache never does; it replaces a changed
// node). At 5,000 nodes this keeps well under a MiB where whole nodes take hundreds.
func (e *Engine) NewLevelNodes() *Nodes {
	n := e.NewNodes()
	n.levelsOnly = true
	return n
}

// Upsert adds a node or replaces the node of the same name.
func (n *Nodes) Upsert(node *unstructured.Unstructured) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.putLocked(node.GetName(), &nodeMember{obj: node})
	return nil
}

// putLocked adds m as the node named name, replacing any node of that name.
func (n *Nodes) putLocked(name string, m *nodeMember) {
	n.removeLocked(name)
	if n.cache != nil {
		n.joinLocked(m)
	}
	n.members[name] = m
	n.list = nil
}

// joinLocked puts m in the group of its labels under the prefixes (string values only) and
// its spec.unschedulable. The group key is exact, not a hash: each label key costs one map
// lookup, each pair under the prefixes sets its bit.
func (n *Nodes) joinLocked(m *nodeMember) {
	c := n.cache
	bits := n.bits[:0]
	for key, value := range m.labels() {
		k, seen := c.keys[key]
		if !seen {
			if c.prefixes.keeps(key) {
				k = &labelKey{name: key, isTrue: -1}
			}
			c.keys[key] = k
		}
		if k == nil {
			continue
		}
		b := c.bit(k, value)
		for len(bits) <= b/64 {
			bits = append(bits, 0)
		}
		bits[b/64] |= 1 << (b % 64)
	}
	for len(bits) > 0 && bits[len(bits)-1] == 0 {
		bits = bits[:len(bits)-1]
	}
	key := append(n.key[:0], 's')
	if m.unschedulable() {
		key[0] = 'u'
	}
	for _, w := range bits {
		key = binary.LittleEndian.AppendUint64(key, w)
	}
	n.bits, n.key = bits, key
	g, ok := n.groups[string(key)]
	if !ok {
		g = &nodeGroup{key: string(key)}
		g.id = c.byGroup[g.key]
		n.groups[g.key] = g
	}
	g.count++
	m.group = g
}

// Sync makes the view hold exactly nodes: a node is converted and upserted only when its
// resourceVersion differs from the one held, and nodes no longer listed are deleted. This is
// how a controller feeds it from an informer's list.
func (n *Nodes) Sync(nodes []corev1.Node) error {
	seen := make(map[string]bool, len(nodes))
	for i := range nodes {
		node := &nodes[i]
		seen[node.Name] = true
		if n.levelsOnly {
			n.syncLevel(node)
			continue
		}
		if n.holds(node.Name, node.ResourceVersion) {
			continue
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(node)
		if err != nil {
			return fmt.Errorf("convert node %s: %w", node.Name, err)
		}
		// A typed node converts with every status struct present, if empty (nodeInfo,
		// daemonEndpoints): trimmed again, the view holds what eval holds of the same node.
		nodetrim.Unstructured(obj)
		obj = intern.Default.JSON(obj, intern.Repeated).(map[string]any)
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

// syncLevel keeps what a level reads of node, unless the view holds it at its resourceVersion:
// then only its labels are taken from node, the same labels, so that the view holds on to the
// caller's current map rather than one it has replaced.
func (n *Nodes) syncLevel(node *corev1.Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m, ok := n.members[node.Name]; ok && m.obj == nil && node.ResourceVersion != "" && m.level.resourceVersion == node.ResourceVersion {
		m.level.labels = node.Labels
		return
	}
	n.putLocked(node.Name, &nodeMember{level: levelMember{
		resourceVersion: node.ResourceVersion, labels: node.Labels, unschedulable: node.Spec.Unschedulable,
	}})
}

// labels yields the node's labels whose values are strings (a signature compares strings).
func (m *nodeMember) labels() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		if m.obj == nil {
			for k, v := range m.level.labels {
				if !yield(k, v) {
					return
				}
			}
			return
		}
		metadata, _ := m.obj.Object["metadata"].(map[string]any)
		labels, _ := metadata["labels"].(map[string]any)
		for k, v := range labels {
			if value, ok := v.(string); ok && !yield(k, value) {
				return
			}
		}
	}
}

// holds tells whether the view has the node at resourceVersion (never for an empty version).
func (n *Nodes) holds(name, resourceVersion string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.members[name]
	return ok && resourceVersion != "" && m.resourceVersion() == resourceVersion
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
			delete(n.groups, g.key)
		}
	}
	delete(n.members, name)
	n.list = nil
}

// eachGroup calls f for every group.
func (n *Nodes) eachGroup(f func(*nodeGroup)) {
	for _, g := range n.groups {
		f(g)
	}
}

// Len is the number of nodes.
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
	if n.levelsOnly {
		return nil, errors.New("nodes: this node view keeps only what migratability levels read (NewLevelNodes), not whole nodes")
	}
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
	ids := slices.Sorted(maps.Keys(counts))
	items := make([][2]*ast.Term, len(ids))
	for i, id := range ids {
		items[i] = item(id, ast.ObjectTerm(
			item("signature", c.terms[id]),
			item("count", ast.IntNumberTerm(counts[id])),
		))
	}
	input := ast.NewObject(item("groups", ast.ObjectTerm(items...)))
	reach, err := n.reachLocked(ctx, g, ids)
	if err != nil {
		return nil, err
	}
	if reach != nil {
		input.Insert(ast.StringTerm("reach"), reach)
	}
	t, err := g.eval(ctx, entryNodeMigratabilityLevels, input)
	if err != nil {
		return nil, err
	}
	byGroup, err := groupLevels(t)
	if err != nil {
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

// reachLocked returns the value of `reach` for the signatures ids, asking it only when the
// ids differ from the last ones asked: a node joining or leaving a group changes counts only.
// It returns nil when the bundle has no `reach`; `levels` then compares signatures itself.
func (n *Nodes) reachLocked(ctx context.Context, g *generation, ids []string) (*ast.Term, error) {
	if _, ok := g.queries[entryNodeMigratabilityReach]; !ok {
		return nil, nil
	}
	c := n.cache
	key := strings.Join(ids, ",")
	if c.reach != nil && c.reachIDs == key {
		return c.reach, nil
	}
	items := make([][2]*ast.Term, len(ids))
	for i, id := range ids {
		items[i] = item(id, ast.ObjectTerm(item("signature", c.terms[id])))
	}
	t, err := g.eval(ctx, entryNodeMigratabilityReach, ast.NewObject(item("groups", ast.ObjectTerm(items...))))
	if err != nil {
		return nil, err
	}
	c.reach, c.reachIDs = t, key
	return t, nil
}

// groupLevels reads `levels`' answer, signature id -> level.
func groupLevels(t *ast.Term) (map[string]int, error) {
	obj, ok := t.Value.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("want an object of levels, got %s", ast.ValueName(t.Value))
	}
	levels := make(map[string]int, obj.Len())
	err := obj.Iter(func(k, v *ast.Term) error {
		id, ok := k.Value.(ast.String)
		if !ok {
			return fmt.Errorf("want string group ids, got %s", ast.ValueName(k.Value))
		}
		n, ok := v.Value.(ast.Number)
		level, isInt := n.Int()
		if !ok || !isInt {
			return fmt.Errorf("group %s: want an integer level, got %v", id, v)
		}
		levels[string(id)] = level
		return nil
	})
	return levels, err
}

// refreshLocked makes the signature cache current for generation g: on a new bundle (or when
// the cache has outgrown the nodes) it re-reads the prefixes and re-keys every node; then it
// asks `signatures` once for every group whose signature it does not know.
func (n *Nodes) refreshLocked(ctx context.Context, g *generation) error {
	if n.cache == nil || n.cache.gen != g || n.cache.overgrown(len(n.members)) {
		prefixes, err := signatureLabelPrefixes(ctx, g)
		if err != nil {
			return err
		}
		n.cache = newSignatureCache(g, prefixes)
		n.groups = make(map[string]*nodeGroup, len(n.groups))
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
		items[i] = item(strconv.Itoa(i), c.signatureInput(grp))
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
			return fmt.Errorf("%s: no signature for nodes with labels %v", entryNodeMigratabilitySignatures, c.labels(grp))
		}
		text := sig.String()
		id, ok := c.ids[text]
		if !ok {
			id = strconv.Itoa(len(c.ids))
			c.ids[text] = id
			c.terms[id] = sig
		}
		grp.id = id
		c.byGroup[grp.key] = id
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

func unschedulable(node *unstructured.Unstructured) bool {
	u, _, _ := unstructured.NestedBool(node.Object, "spec", "unschedulable")
	return u
}

// labels are the group's labels under the prefixes.
func (c *signatureCache) labels(g *nodeGroup) map[string]string {
	labels := map[string]string{}
	for i := 1; i < len(g.key); i++ {
		for b := range 8 {
			if g.key[i]&(1<<b) != 0 {
				pair := c.pairs[(i-1)*8+b]
				labels[pair[0]] = pair[1]
			}
		}
	}
	return labels
}

// signatureInput is what the signature reads of the group's nodes, as a node.
func (c *signatureCache) signatureInput(g *nodeGroup) *ast.Term {
	return ast.ObjectTerm(
		item("metadata", ast.ObjectTerm(item("labels", labelsTerm(c.labels(g))))),
		item("spec", ast.ObjectTerm(item("unschedulable", ast.BooleanTerm(g.key[0] == 'u')))),
	)
}
